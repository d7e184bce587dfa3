"""A real pretrained LM learns: the main job's recipe (configs/smollm2-arithmetic.yaml) with Mu-GRPO cold against
GRPO warm on one budget, several seeds, paired by problem.

    python bench/real_lm.py                              # arms mu and grpo-warm, seeds 0 1 2 (~20 min per run here)
    python bench/real_lm.py --arms mu --seeds 0          # one run: the demo's own figures
    python bench/real_lm.py --quick                      # a tiny random policy, 4 held-out problems, half the stages

Arms (one `mugrpo run` each, the command a user runs; the arms' order alternates from seed to seed):
- mu:        the main job as shipped (`make demo`, configs/smollm2-arithmetic.yaml): Mu-GRPO, 4 cold stages of 8
             updates, full fine-tuning at lr 5e-6;
- grpo-warm: GRPO, PPO clip [0.8, 1.2], 8 warm stages of 4 updates (configs/smollm2-arithmetic-grpo.yaml), full
             fine-tuning at its own best lr of those measured (LoRA runs cold only), evaluated at the same policy
             versions (0, 8, 16, 24, 32 updates);
- mu-lora:   the main job's LoRA variant: Mu-GRPO cold with LoRA rank 16 at lr 1e-4.
Equal across arms (tests/unit/test_budgets.py): model, data and order, prompt, G, new tokens, temperature, reward,
optimizer, 32 updates of 16 rollouts, held-out benchmark; each method runs at the lr that served it best
(docs/benchmarks.md).

Per run it reports held-out greedy accuracy at every evaluated policy with its 95% CI clustered by problem, the gain
over the base policy with a paired 95% CI (arXiv 2411.00640), T_total (the stages' wall clock without in-stage
evaluation, bench/_arms.py) and the time each policy version was ready. Across runs: the paired difference of the
final policies (mu - grpo-warm, per-problem scores averaged over seeds) and the time Mu-GRPO takes to reach
GRPO-warm's final accuracy. It prints the precision and the machine (`mugrpo env`). Nothing is asserted; the targets
(+10 points over the base with a CI that excludes 0 at each seed; Mu-GRPO within the paired CI of GRPO-warm or
better) are printed as met or missed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._arms import phase_seconds  # noqa: E402

MAIN = REPO / "configs" / "smollm2-arithmetic.yaml"
GRPO = REPO / "configs" / "smollm2-arithmetic-grpo.yaml"
#: arm -> (config, overrides). LoRA runs cold only (a warm segment samples from the trainer's live module), so the
#: paired comparison trains both methods with full fine-tuning; ``mu-lora`` is the main job with LoRA at ~10x its
#: lr ("LoRA Without Regret").
#: The main job's LoRA variant: rank 16 at ~10x full fine-tuning's lr (README; tests/unit/test_budgets.py).
LORA_VARIANT = ["train.lora={rank: 16, alpha: 32}", "train.lr=1.0e-4"]
ARMS = {
    "mu": (MAIN, []),
    "grpo-warm": (GRPO, []),
    "mu-lora": (MAIN, LORA_VARIANT),
}
BENCHMARK = "arithmetic-heldout"
TARGET_GAIN = 0.10


def quick_overrides(model_dir: Path) -> list[str]:
    """--quick: a tiny random policy, 4 held-out problems, 2 new tokens (the plumbing, not the figures); with
    :func:`quick_stages`, half of each arm's stages."""
    heldout = (
        f"{{name: {BENCHMARK}, source: reasoning_gym, task: basic_arithmetic, params: {{min_terms: 2, max_terms: 2, "
        "min_digits: 2, max_digits: 2, operators: ['+', '-'], allow_parentheses: false, allow_negation: false}, "
        "seed: 0, heldout_fraction: 0.1, split: heldout, size: 4}"
    )
    return [
        f"model.source={model_dir}",
        "generation.sampling.max_new_tokens=2",
        f"eval.benchmarks=[{{dataset: {heldout}, k: 1, temperature: 0.0, max_new_tokens: 2}}]",
    ]


def quick_stages(config: Path) -> int:
    """--quick: half of the config's ``run.num_stages`` (16 updates: mu 2 stages of 8, grpo-warm 4 of 4, both
    evaluated at 0, 8 and 16 updates)."""
    import yaml

    return yaml.safe_load(config.read_text())["run"]["num_stages"] // 2


def run_arm(arm: str, seed: int, root: Path, log: Path, extra: list[str], quick: bool = False) -> dict:
    """One `mugrpo run` of ``arm`` with ``seed`` under ``root``; returns its report (:func:`arm_report`)."""
    run_id = f"{arm}-s{seed}"
    config, overrides = ARMS[arm]
    cmd = [sys.executable, "-m", "mugrpo.cli", "run", str(config), f"run.root={root}", f"run.id={run_id}"]
    cmd += [f"run.seed={seed}", *overrides, *extra]
    if quick:
        cmd.append(f"run.num_stages={quick_stages(config)}")
    started = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, check=False).returncode
    wall = time.monotonic() - started
    if rc != 0:
        raise SystemExit(f"arm {arm} seed {seed} failed with exit code {rc}; its output is in {log}")
    return arm_report(root, run_id, wall)


def heldout_scores(run_dir: Path) -> dict[int, dict[str, float]]:
    """stage -> {prompt_id: score} of the held-out benchmark, for every policy the run evaluated."""
    from mugrpo.sql.catalog import connect

    with connect(str(run_dir)) as cat:
        rows = cat.arrow(
            f"SELECT stage, prompt_id, score FROM eval_problems WHERE benchmark = '{BENCHMARK}' ORDER BY stage"
        ).to_pylist()
    scores: dict[int, dict[str, float]] = {}
    for r in rows:
        scores.setdefault(int(r["stage"]), {})[r["prompt_id"]] = float(r["score"])
    return scores


def arm_report(root: Path, run_id: str, wall: float) -> dict:
    """Held-out scores per evaluated policy, the gain over the base, the phase seconds and when each policy was
    ready (seconds of stage wall clock without in-stage evaluation, from the run's start)."""
    from mugrpo.config import config_from_dict
    from mugrpo.evaluation.metrics import clustered_mean_ci, paired_difference_ci

    run_json = json.loads((root / run_id / "run.json").read_text())
    cfg = config_from_dict(run_json["config"], source=f"{run_id}/run.json")
    scores = heldout_scores(root / run_id)
    stages, t = phase_seconds(cfg)
    ready, elapsed = {0: 0.0}, 0.0
    for k, s in enumerate(stages):
        elapsed += s["t_total"]
        ready[k + 1] = elapsed
    per_stage = cfg.train.updates_per_stage
    base = scores[0]
    points = []
    for version in sorted(scores):
        ci = clustered_mean_ci(list(scores[version].values()))
        gain = paired_difference_ci(scores[version], base)
        points.append(
            {
                "policy_version": version,
                "updates": version * per_stage,
                "ready_s": round(ready[version], 1),
                "accuracy": ci.mean,
                "ci95": [ci.low, ci.high],
                "gain": gain.mean,
                "gain_ci95": [gain.low, gain.high],
                "problems": ci.n,
            }
        )
    precision = run_json.get("precision", {})
    return {
        "run_id": run_id,
        "points": points,
        "final_scores": scores[max(scores)],
        "t": {k: round(v, 1) for k, v in t.items()},
        "wall_s": round(wall, 1),
        "precision": {k: precision.get(k) for k in ("model.dtype", "train.mixed_precision", "reason")},
    }


def summarize(reports: dict[str, list[dict]]) -> dict:
    """Across seeds: the final paired difference mu - grpo-warm, and Mu-GRPO's time to GRPO-warm's final accuracy."""
    from mugrpo.evaluation.metrics import paired_difference_ci

    def mean_scores(runs: list[dict]) -> dict[str, float]:
        keys = set.intersection(*(set(r["final_scores"]) for r in runs))
        return {p: sum(r["final_scores"][p] for r in runs) / len(runs) for p in keys}

    out: dict = {}
    if reports.get("mu") and reports.get("grpo-warm"):
        diff = paired_difference_ci(mean_scores(reports["mu"]), mean_scores(reports["grpo-warm"]))
        out["final_mu_minus_grpo_warm"] = {"mean": diff.mean, "ci95": [diff.low, diff.high], "problems": diff.n}
        target = sum(r["points"][-1]["accuracy"] for r in reports["grpo-warm"]) / len(reports["grpo-warm"])
        reach = []
        for r in reports["mu"]:
            hit = next((p for p in r["points"] if p["accuracy"] >= target), None)
            reach.append(None if hit is None else hit["ready_s"])
        out["grpo_warm_final_accuracy"] = target
        out["mu_seconds_to_grpo_warm_final"] = reach
        out["t_total"] = {arm: [r["t"]["t_total"] for r in runs] for arm, runs in reports.items()}
    return out


def print_report(reports: dict[str, list[dict]], summary: dict) -> None:
    for runs in reports.values():
        for r in runs:
            print(f"\n{r['run_id']}  T_total {r['t']['t_total']:.0f} s  (wall {r['wall_s']:.0f} s)  {r['precision']}")
            print("  version  updates  ready_s  accuracy [95% CI]        gain over base [paired 95% CI]")
            for p in r["points"]:
                lo, hi = p["ci95"]
                glo, ghi = p["gain_ci95"]
                print(
                    f"  {p['policy_version']:>7}  {p['updates']:>7}  {p['ready_s']:>7.0f}  "
                    f"{p['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]   {p['gain']:+.3f} [{glo:+.3f}, {ghi:+.3f}]"
                )
            last = r["points"][-1]
            met = last["gain"] >= TARGET_GAIN and last["gain_ci95"][0] > 0
            print(f"  target +{TARGET_GAIN:.2f} over the base with the paired CI above 0: {'met' if met else 'missed'}")
    if summary.get("final_mu_minus_grpo_warm"):
        d = summary["final_mu_minus_grpo_warm"]
        lo, hi = d["ci95"]
        print(f"\nfinal mu - grpo-warm: {d['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}] over {d['problems']} problems")
        print(f"target Mu-GRPO within the paired CI of GRPO-warm or better: {'met' if hi >= 0 else 'missed'}")
        print(f"Mu-GRPO seconds to GRPO-warm's final accuracy: {summary['mu_seconds_to_grpo_warm_final']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", nargs="+", default=["mu", "grpo-warm"], choices=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    parser.add_argument("--keep", type=Path, help="keep the runs under this folder (default: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="tiny random policy: the plumbing, not the figures")
    args = parser.parse_args()

    from mugrpo.inspection.environment import environment_report

    root = args.keep or Path(tempfile.mkdtemp(prefix="mugrpo-real-lm-"))
    root.mkdir(parents=True, exist_ok=True)
    log = root / "bench.log"
    extra: list[str] = []
    if args.quick:
        from mugrpo.policy.models import make_tiny_random_model  # a real tiny model with the SmolLM2 tokenizer

        extra = quick_overrides(make_tiny_random_model(root / "tiny-model", seed=0))
    env = environment_report()
    print(f"date {datetime.date.today()}  cpu {env['cpu']}  torch {env['packages']['torch']}")
    print(f"auto precision: {env['auto_precision']['choice']} ({env['auto_precision']['reason']})")
    print(f"runs under {root}; their output in {log}")
    reports: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    try:
        for i, seed in enumerate(args.seeds):
            order = args.arms if i % 2 == 0 else list(reversed(args.arms))  # alternate: the machine's load drifts
            for arm in order:
                reports[arm].append(run_arm(arm, seed, root, log, extra, args.quick))
                print(f"  {arm} seed {seed}: final accuracy {reports[arm][-1]['points'][-1]['accuracy']:.3f}")
    finally:
        summary = summarize(reports) if all(reports.values()) else {}
        print_report(reports, summary)
        if args.out:
            record = {"date": str(datetime.date.today()), "env": env, "reports": reports, "summary": summary}
            args.out.write_text(json.dumps(record, indent=2, default=str))
        if args.keep is None:  # a SmolLM2 run writes ~0.6 GB (LoRA) to 7 GB (full fine-tuning): freed
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
