"""Quality and speed side by side on the lab task: the Mu-GRPO paper's Table 1 (arXiv 2605.17570) with held-out
accuracy, every arm audited.

    python bench/quality.py --seeds 0 1 2 --jobs 2 --out bench-quality   # the full bench (configs/lab/ budget)
    python bench/quality.py --quick --out /tmp/quality-quick        # CI: all arms, 1 seed, 4 updates of 16 rollouts

Arms (each a configs/lab/ config at one shared budget: 64 updates x 128 rollouts, evaluations after 0/16/32/48/64
updates; tests/unit/test_budgets.py checks it):
- mu-grpo-cold: configs/lab/mu-grpo.yaml (4 cold stages, mu = 16, relaxed clip and veto), as designed;
- mu-grpo-cold-spawn: the same with every job a new interpreter started when its turn comes (orchestration.
  prestart_jobs and fork_jobs off), paired with mu-grpo-cold: the share of pre-started, forked jobs;
- mu-grpo-cold-bf16: the same with bf16 checkpoints (train.checkpoint_dtype), paired with mu-grpo-cold: the accuracy
  cost of rounding weights and moments to bf16 at every checkpoint;
- mu-grpo-warm: the same, its 4 stages in one warm segment job (``orchestration.execution=warm``);
- grpo-warm: configs/lab/grpo.yaml (mu = 4, PPO clip, warm): the baseline every other arm is paired with;
- naive, replay, conspo, agpo: configs/lab/ALGO.yaml.

One invocation runs every arm at every seed, seed by seed, the arm order rotated by one each seed (load drifts
spread over the arms; with ``--jobs N``, N runs at once in that order, each in a child process pinned to one core
with one torch thread, as the lab's runs were measured). Each run goes through the job processes as the stage flow
launches them, without a Prefect server (bench/_arms.py :func:`execute`, as bench/speedup.py runs its arms; --quick
runs the jobs in this process); its figures are read from what it committed:
- final held-out accuracy, greedy (200 problems) and avg@8 at T = 1 (100 problems), from the ``evals`` table;
  interval: mean over seeds +- t(0.975, n-1) x sd / sqrt(n) (a t interval over seeds; seeds are the unit of
  replication, the problems are the same for every run). One seed: no interval;
- accuracy against wall-clock: the evaluated policy of stage k is placed at the summed stage seconds of stages
  0..k-1 (stage manifests' ``t_total`` less their in-stage ``t_eval``: evaluation is the bench's instrument, every
  arm evaluates the same 5 policy versions, and it is excluded for all);
- wall-clock to reach GRPO-warm's final greedy accuracy (same seed): the time of the first evaluated policy at or
  above it (none when never reached);
- T_roll / T_train / T_switch (bench/_arms.py :func:`phase_seconds`);
- paired per-seed differences against GRPO-warm (final greedy, final avg@8, T_total), with the same t interval over
  the per-seed differences. The pairing holds because a seed fixes the prompt order: the bench checks that the
  concatenated prompt plans of one seed's arms agree (the shorter a prefix of the longer) and refuses otherwise.

Every arm's runs are audited together (``mugrpo.audit``: idle clip, data order (different seeds must differ),
configs (only ``run.seed`` may differ), batches, normalizer). A failed audit row refuses the comparison: the table is
printed, the JSON written, and the bench exits 1 naming the run and the check. ``--out`` receives quality.json
(figures and audit rows) and quality.png (greedy accuracy against wall-clock, one line per arm: the mean over seeds,
the band between the lowest and highest seed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._arms import execute, phase_seconds  # noqa: E402
from bench.lab import accuracy  # noqa: E402
from bench.support.audit import audit_seeds  # noqa: E402
from bench.support.pinned import map_on_cores, run_pinned  # noqa: E402
from bench.warm_vs_cold import JOBS_ENV  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "configs" / "lab"
BASELINE = "grpo-warm"
#: Arm -> (configs/lab/ config, overrides).
ARMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mu-grpo-cold": ("mu-grpo", ()),
    "mu-grpo-cold-spawn": ("mu-grpo", ("orchestration.prestart_jobs=false", "orchestration.fork_jobs=false")),
    "mu-grpo-cold-bf16": ("mu-grpo", ("train.checkpoint_dtype=bfloat16",)),
    "mu-grpo-warm": ("mu-grpo", ("orchestration.execution=warm",)),
    BASELINE: ("grpo", ()),
    "naive": ("naive", ()),
    "replay": ("replay", ()),
    "conspo": ("conspo", ()),
    "agpo": ("agpo", ()),
}
#: Arms also paired with another arm than the baseline: the change each one makes to Mu-GRPO cold.
PAIRED_WITH = {"mu-grpo-cold-spawn": "mu-grpo-cold", "mu-grpo-cold-bf16": "mu-grpo-cold"}
GREEDY, AVG8 = "lab-heldout", "lab-heldout-t1"
#: --quick: total updates, rollouts per update, evaluation problems (greedy, avg@8).
QUICK = {"updates": 4, "rollouts_per_update": 16, "greedy_problems": 4, "avg8_problems": 2}
#: Two-sided 95% quantiles of Student's t by degrees of freedom (beyond 30: the normal's 1.96).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
T975.update({11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042})


def t_interval(values: list[float]) -> dict:
    """Mean and 95% t interval over ``values`` (one per seed): mean +- t(0.975, n-1) * sd / sqrt(n).

    Returns {"mean", "low", "high", "n"}; low/high are None for n < 2. Degrees of freedom between table entries use
    the next lower entry's (wider) quantile.
    """
    n = len(values)
    mean = statistics.fmean(values) if values else float("nan")
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "n": n}
    df = n - 1
    t = 1.96 if df > 30 else T975[max(k for k in T975 if k <= df)]
    half = t * statistics.stdev(values) / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def arm_config(arm: str, seed: int, root: Path, quick: bool):
    """Arm ``arm``'s resolved Config at ``seed`` (its configs/lab/ config, its overrides, --quick's scaling) as run
    ``quality-ARM-sSEED`` under ``root``. --quick scales every arm alike: :data:`QUICK` updates in
    ``max(1, stages // 8)`` stages, the arm's prompts per stage scaled with its rollouts, every group kept, evaluations
    every stage.

    Raises:
        ValueError: an arm's schedule does not scale to the quick budget in whole prompts.
        mugrpo.config.ConfigError: the resulting config is invalid.
    """
    from mugrpo.config import config_from_dict, load_config

    algo, overrides = ARMS[arm]
    run = [f"run.id=quality-{arm}-s{seed}", f"run.root={root}", f"run.seed={seed}"]
    data = load_config(LAB / f"{algo}.yaml", [*overrides, *run]).to_json_dict()
    if data["orchestration"]["execution"] == "warm":
        data["orchestration"]["segment_stages"] = data["run"]["num_stages"]
    if quick:
        stages, ups = data["run"]["num_stages"], data["train"]["updates_per_stage"]
        rpu, pps = data["train"]["rollouts_per_update"], data["generation"]["prompts_per_stage"]
        q_stages = max(1, stages // 8)
        q_ups, q_rpu = QUICK["updates"] // q_stages, QUICK["rollouts_per_update"]
        q_pps = pps * q_ups * q_rpu / (ups * rpu)
        if q_pps != int(q_pps) or q_stages * q_ups != QUICK["updates"]:
            raise ValueError(f"arm {arm}: {stages} stages x {ups} updates do not scale to the quick budget")
        data["run"]["num_stages"] = q_stages
        data["train"].update(
            updates_per_stage=q_ups,
            rollouts_per_update=q_rpu,
            micro_batch_size=q_rpu,
            checkpoint_every=q_ups,
            skip_zero_variance_groups=False,
        )
        data["generation"].update(prompts_per_stage=int(q_pps), shard_size=int(q_pps))
        data["eval"]["every_n_stages"] = 1
        if data["orchestration"]["execution"] == "warm":
            data["orchestration"].update(segment_stages=q_stages, publish_policy_every=1)
        for bench in data["eval"]["benchmarks"]:
            name = bench["dataset"]["name"]
            bench["dataset"]["size"] = QUICK["greedy_problems" if name == GREEDY else "avg8_problems"]
    return config_from_dict(data, source=f"bench/quality.py arm {arm}")


def prompt_order(cfg) -> list[str]:
    """The run's training prompt ids in the order its stages' prompt plans sampled them (stage 0 first)."""
    from mugrpo.orchestration.runs import open_store
    from mugrpo.provenance.prompt_plan import read_plan

    store, ids = open_store(cfg), []
    for k in range(cfg.run.num_stages):
        plan = read_plan(store, cfg.run.id, k)
        if plan is None:
            raise ValueError(f"run {cfg.run.id}: stage {k} has no prompt plan; its data order cannot be paired")
        ids.extend(plan.prompt_ids)
    return ids


def read_run(root: Path, run_id: str, wall: float) -> dict:
    """The figures of one committed run (module docstring)."""
    from mugrpo.orchestration.runs import load_run_config

    cfg = load_run_config(str(root), run_id)
    stages, t = phase_seconds(cfg)
    at = [0.0]
    for s in stages:
        at.append(at[-1] + s["t_total"])
    greedy, avg8 = accuracy(root / run_id, GREEDY), accuracy(root / run_id, AVG8)
    final = cfg.run.num_stages
    if final not in greedy or final not in avg8:
        raise ValueError(f"run {run_id}: no held-out evaluation of the final policy (stage {final})")
    order = prompt_order(cfg)
    return {
        "run": run_id,
        "seed": cfg.run.seed,
        "wall_s": wall,
        **t,
        "greedy_final": greedy[final],
        "avg8_final": avg8[final],
        "curve": [{"stage": k, "seconds": at[k], "greedy": greedy[k], "avg8": avg8.get(k)} for k in sorted(greedy)],
        "prompt_order": hashlib.sha256(",".join(order).encode()).hexdigest(),
        "_order": order,
    }


def check_pairing(runs: dict[str, dict[int, dict]]) -> None:
    """Refuse (SystemExit) when two arms of one seed trained on prompt orders where neither is a prefix of the other."""
    seeds = {s for by_seed in runs.values() for s in by_seed}
    for seed in sorted(seeds):
        base = runs[BASELINE][seed]["_order"]
        for by_seed in runs.values():
            order = by_seed[seed]["_order"]
            n = min(len(order), len(base))
            if order[:n] != base[:n]:
                first = next(i for i in range(n) if order[i] != base[i])
                raise SystemExit(
                    f"refused: seed {seed}: run {by_seed[seed]['run']} trained on another prompt order than "
                    f"{runs[BASELINE][seed]['run']} (first difference at prompt {first}); the pairing does not hold"
                )


def time_to_reach(curve: list[dict], target: float) -> float | None:
    """Seconds of the first evaluated policy whose greedy accuracy is at least ``target``; None when none is."""
    return next((p["seconds"] for p in curve if p["greedy"] >= target - 1e-12), None)


def summarize(runs: dict[str, dict[int, dict]]) -> dict:
    """Per arm: intervals over seeds, time to reach GRPO-warm's final accuracy, paired differences against it."""
    out = {}
    for arm, by_seed in runs.items():
        seeds = sorted(by_seed)
        reach = {s: time_to_reach(by_seed[s]["curve"], runs[BASELINE][s]["greedy_final"]) for s in seeds}
        diff = {
            key: [by_seed[s][key] - runs[BASELINE][s][key] for s in seeds]
            for key in ("greedy_final", "avg8_final", "t_total")
        }
        out[arm] = {
            "greedy_final": t_interval([by_seed[s]["greedy_final"] for s in seeds]),
            "avg8_final": t_interval([by_seed[s]["avg8_final"] for s in seeds]),
            **{k: t_interval([by_seed[s][k] for s in seeds]) for k in ("t_roll", "t_train", "t_switch", "t_total")},
            "seconds_to_grpo_final": reach,
            "paired_vs_grpo_warm": {k: {"per_seed": v, **t_interval(v)} for k, v in diff.items()},
        }
        ref = PAIRED_WITH.get(arm)
        if ref in runs:
            own = {
                key: [by_seed[s][key] - runs[ref][s][key] for s in seeds]
                for key in ("greedy_final", "avg8_final", "t_total", "t_switch")
            }
            out[arm][f"paired_vs_{ref}"] = {k: {"per_seed": v, **t_interval(v)} for k, v in own.items()}
    return out


def audit_arms(runs: dict[str, dict[int, dict]], root: Path) -> dict:
    """``mugrpo.audit`` over each arm's runs (all seeds together: only ``run.seed`` may differ); the reports."""
    return {arm: audit_seeds(root, [by_seed[s]["run"] for s in sorted(by_seed)]) for arm, by_seed in runs.items()}


def refuse_failed_audit(reports: dict, results: dict, out_json: Path) -> None:
    """Print every arm's audit rows; when one failed, write ``results`` (audit included) to ``out_json`` and refuse.

    Raises:
        SystemExit: a row failed; the message names each failed run and check with its evidence.
    """
    for arm, rep in reports.items():
        for r in rep.results:
            print(f"audit {arm}: {r.check} {r.run}: {r.status}: {r.detail}")
    failed = [r for rep in reports.values() for r in rep.results if r.status == "fail"]
    if failed:
        out_json.write_text(json.dumps(results, indent=2, default=str))
        lines = "; ".join(f"run {r.run}: check {r.check}: {r.detail}" for r in failed)
        raise SystemExit(f"refused: the audit failed ({lines}); rows in {out_json}")


def _fmt(ci: dict, digits: int = 3) -> str:
    if ci["low"] is None:
        return f"{ci['mean']:.{digits}f}"
    return f"{ci['mean']:.{digits}f} [{ci['low']:.{digits}f}, {ci['high']:.{digits}f}]"


def print_tables(summary: dict) -> None:
    print("\n| arm | greedy final (95% CI) | avg@8 final (95% CI) | T_roll s | T_train s | T_switch s | T_total s |")
    print("|---|---|---|---:|---:|---:|---:|")
    for arm, s in summary.items():
        t = [f"{s[k]['mean']:.0f}" for k in ("t_roll", "t_train", "t_switch", "t_total")]
        print(f"| {arm} | {_fmt(s['greedy_final'])} | {_fmt(s['avg8_final'])} | {' | '.join(t)} |")
    print(
        f"\n| arm | greedy - {BASELINE} (95% CI) | avg@8 - {BASELINE} | T_total - {BASELINE} s | s to reach "
        f"{BASELINE}'s final greedy, per seed |"
    )
    print("|---|---|---|---|---|")
    for arm, s in summary.items():
        p = s["paired_vs_grpo_warm"]
        reach = ", ".join("-" if v is None else f"{v:.0f}" for v in s["seconds_to_grpo_final"].values())
        print(f"| {arm} | {_fmt(p['greedy_final'])} | {_fmt(p['avg8_final'])} | {_fmt(p['t_total'], 0)} | {reach} |")
    paired = [(arm, ref) for arm, ref in PAIRED_WITH.items() if f"paired_vs_{ref}" in summary.get(arm, {})]
    if paired:
        print("\n| arm | paired with | greedy diff (95% CI) | avg@8 diff | T_total diff s | T_switch diff s |")
        print("|---|---|---|---|---|---|")
        for arm, ref in paired:
            p = summary[arm][f"paired_vs_{ref}"]
            print(
                f"| {arm} | {ref} | {_fmt(p['greedy_final'])} | {_fmt(p['avg8_final'])} | "
                f"{_fmt(p['t_total'], 0)} | {_fmt(p['t_switch'], 0)} |"
            )


def plot_accuracy_vs_time(runs: dict[str, dict[int, dict]], path: Path) -> Path:
    """One PNG: held-out greedy accuracy against wall-clock seconds, one line per arm (mean over seeds at each
    evaluated policy), shaded between its lowest and highest seed (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=90)
    for arm, by_seed in runs.items():
        curves = [by_seed[s]["curve"] for s in sorted(by_seed)]
        points = range(min(len(c) for c in curves))
        x = [statistics.fmean(c[i]["seconds"] for c in curves) for i in points]
        ys = [[c[i]["greedy"] for c in curves] for i in points]
        (line,) = ax.plot(x, [statistics.fmean(y) for y in ys], marker="o", label=arm)
        if len(curves) > 1:
            ax.fill_between(x, [min(y) for y in ys], [max(y) for y in ys], color=line.get_color(), alpha=0.15)
    ax.set_xlabel("wall-clock seconds of training (evaluation excluded)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("lab task: accuracy against wall-clock (mean over seeds, band: min..max)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="CI: every arm, seed 0, a tiny budget (structure only)")
    parser.add_argument("--root", type=Path, default=None, help="Where runs go (default: a temporary folder).")
    parser.add_argument("--keep-runs", action="store_true", help="Keep the run folders.")
    parser.add_argument("--out", type=Path, required=True, help="Folder for quality.json and quality.png.")
    parser.add_argument("--jobs", type=int, default=1, help="Runs at once, each pinned to one core (taskset).")
    parser.add_argument("--child", nargs=2, metavar=("ARM", "SEED"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:  # one run, in a process of its own (--jobs > 1)
        if args.quick:
            os.environ[JOBS_ENV] = "in-process"
        cfg = arm_config(args.child[0], int(args.child[1]), args.root, args.quick)
        execute(cfg, args.root / f"{cfg.run.id}.jobs.log", args.root)
        return
    if BASELINE not in args.arms:
        parser.error(f"--arms must include {BASELINE}: every arm is paired with it")
    seeds = args.seeds[:1] if args.quick else args.seeds
    if args.quick:  # every job in this process: CI checks structure, and 7 arms' job start-ups would not fit
        os.environ[JOBS_ENV] = "in-process"
    root = args.root or Path(tempfile.mkdtemp(prefix="mugrpo-quality-"))
    root.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)

    runs: dict[str, dict[int, dict]] = {arm: {} for arm in args.arms}
    plan = [
        (arm, seed)
        for i, seed in enumerate(seeds)
        for arm in args.arms[i % len(args.arms) :] + args.arms[: i % len(args.arms)]
    ]
    cfgs = {(arm, seed): arm_config(arm, seed, root, args.quick) for arm, seed in plan}

    def run_one(item: tuple[str, int], core: int | None) -> float:
        cfg = cfgs[item]
        log = root / f"{cfg.run.id}.log"
        if args.jobs == 1:
            t0 = time.monotonic()
            execute(cfg, log, root)
            return time.monotonic() - t0
        child = ["--child", item[0], str(item[1]), "--root", str(root), "--out", str(args.out)]
        return run_pinned(
            Path(__file__).resolve(), [*child, *(["--quick"] if args.quick else [])], log, core, cfg.run.id
        )

    def done(item: tuple[str, int], wall: float) -> None:
        arm, seed = item
        runs[arm][seed] = r = read_run(root, cfgs[item].run.id, wall)
        print(
            f"{arm} seed {seed}: greedy {r['greedy_final']:.3f}, avg@8 {r['avg8_final']:.3f}, "
            f"T_total {r['t_total']:.0f} s, command {r['wall_s']:.0f} s",
            flush=True,
        )

    map_on_cores(run_one, plan, max(args.jobs, 1), done)

    reports = audit_arms(runs, root)
    results = {
        "quick": args.quick,
        "seeds": seeds,
        "interval": "95% t interval over seeds: mean +- t(0.975, n-1) sd / sqrt(n); none for one seed",
        "audit": {arm: rep.to_json() for arm, rep in reports.items()},
        "runs": {
            arm: {s: {k: v for k, v in r.items() if k != "_order"} for s, r in bs.items()} for arm, bs in runs.items()
        },
    }
    out_json = args.out / "quality.json"
    refuse_failed_audit(reports, results, out_json)
    check_pairing(runs)
    summary = summarize(runs)
    results["summary"] = summary
    results["plot"] = str(plot_accuracy_vs_time(runs, args.out / "quality.png"))
    out_json.write_text(json.dumps(results, indent=2, default=str))
    print_tables(summary)
    print(f"\nfigures and audit: {out_json}; plot: {results['plot']}")
    if not args.keep_runs and args.root is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
