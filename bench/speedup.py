"""Mu-GRPO against fair GRPO at equal updates: the Mu-GRPO paper's Table 1 (arXiv 2605.17570) in miniature.

    python bench/speedup.py                      # SmolLM2-135M, U=32 updates: ~17 min on 2 quiet cores
    python bench/speedup.py --quick              # tiny random model (CI: the plumbing, not the figures)
    python bench/speedup.py --engine vllm --vllm-python .venv-vllm/bin/python   # every arm generating on vLLM

Arms, run one after the other in one invocation, their order rotated each repeat:
- mu:        Mu-GRPO (configs/gsm8k-smollm2.yaml), K = 4 cold stages, mu = U/4 updates per rollout refresh;
- grpo-warm: GRPO (configs/gsm8k-smollm2-grpo.yaml), mu = 4, one warm segment job for all U/4 stages;
- grpo-cold: the same GRPO, cold (three job processes per stage, as the stage flow launches them);
- mu-warm:   Mu-GRPO's K stages in one warm segment job: the like-for-like pair of grpo-warm, which separates
             what the method saves (larger generation batches, fewer weight syncs) from what cold stages cost.
- mu-seq:    Mu-GRPO cold with its jobs strictly one after another (orchestration.overlap_checkpoint=false): the
             share of the checkpoint overlap (mu starts stage k+1's generation beside stage k's checkpoint write);
- mu-spawn:  Mu-GRPO cold with every job a new interpreter started when its turn comes (orchestration.prestart_jobs
             and orchestration.fork_jobs off): the share of pre-started jobs and the job fork server;
- mu-bf16:   Mu-GRPO cold with bf16 checkpoints (train.checkpoint_dtype), paired with grpo-warm-bf16 (the same
             for the baseline: it writes bytes at every stage too);
- mu-lora:   Mu-GRPO cold training LoRA adapters of rank 16 at 10x the learning rate (train.lora): a stage writes
             its adapter and their moments only.
Equal across arms: U, rollouts per update, total rollouts, model, data order, G, new tokens, seed (bench/_arms.py).
Per arm it prints T_roll, T_train, T_switch, T_total, the final training reward and the final eval, then the
ratios GRPO-warm / Mu-GRPO next to the paper's 1.82x (rollout) and 1.53x (end to end), and the Amdahl bound
1 / (f + (1 - f)/s). Nothing is asserted; the targets are printed as met or missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._arms import ARMS, Budget, amdahl_bound, arm_config, plot_reward_vs_time, run_arm  # noqa: E402

PAPER = {"rollout": 1.82, "end_to_end": 1.53}
#: Per-arm phase seconds (bench/_arms.py phase_seconds); t_ckpt_hidden: of t_ckpt, beside the next generation.
PHASES = ("t_roll", "t_train", "t_ckpt", "t_ckpt_hidden", "t_switch", "t_total")


def budget(args, model: str) -> Budget:
    """The shared budget: --quick's tiny one (U=4: Mu-GRPO 2 stages x 2 updates, GRPO 1 x 4), else the flags."""
    if args.quick:
        return Budget(
            updates=4,
            mu_stages=2,
            rollouts_per_update=2,
            group_size=2,
            max_new_tokens=4,
            model=model,
            eval_prompts=0,
            engine=args.engine,
            engine_python=args.vllm_python,
        )
    return Budget(
        updates=args.updates,
        rollouts_per_update=args.rollouts_per_update,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        mu_stages=args.mu_stages,
        eval_prompts=args.eval_prompts,
        num_threads=args.engine_threads,
        engine=args.engine,
        engine_python=args.vllm_python,
        model=model,
    )


def add_budget_flags(parser: argparse.ArgumentParser) -> None:
    d = Budget()
    parser.add_argument("--updates", type=int, default=d.updates, help="U, total optimizer updates of every arm")
    parser.add_argument("--mu-stages", type=int, default=d.mu_stages, help="K, Mu-GRPO's stages (mu = U/K)")
    parser.add_argument("--group-size", type=int, default=d.group_size, help="G")
    parser.add_argument("--rollouts-per-update", type=int, default=d.rollouts_per_update)
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    parser.add_argument("--eval-prompts", type=int, default=d.eval_prompts, help="GSM8K test prompts, final eval")
    parser.add_argument(
        "--engine-threads",
        type=int,
        default=d.num_threads,
        help="torch threads of the mugrpo arms' generation engine (generation.engine_kwargs.num_threads; the "
        "configs' 1 by default; training always uses torch's default)",
    )


def summarize(results: dict[str, list[dict]]) -> dict:
    """Medians over repeats per arm and the ratios and their targets."""
    med = {arm: {k: statistics.median(r.get(k, 0.0) for r in runs) for k in PHASES} for arm, runs in results.items()}
    mu, warm = med["mu"], med["grpo-warm"]
    s = warm["t_roll"] / mu["t_roll"]
    e2e = warm["t_total"] / mu["t_total"]
    f = warm["t_train"] / warm["t_total"]
    bound = amdahl_bound(f, s)
    switch_share = mu["t_switch"] / mu["t_total"]
    out = {
        "medians": med,
        "ratios_grpo_warm_over_mu": {
            "rollout": s,
            "train": warm["t_train"] / mu["t_train"],
            "end_to_end": e2e,
            "paper_rollout": PAPER["rollout"],
            "paper_end_to_end": PAPER["end_to_end"],
        },
        "amdahl": {"f_train_grpo_warm": f, "bound": bound, "measured_over_bound": e2e / bound},
        "targets": {
            "grpo-warm / mu (cold) end to end >= 1.10x": e2e >= 1.10,
            "end-to-end ratio >= 0.95 x Amdahl bound": e2e >= 0.95 * bound,
            "mu T_switch <= 10% of its T_total": switch_share <= 0.10,
        },
        "mu_switch_share": switch_share,
        "mu_switch_and_checkpoint_share": (mu["t_switch"] + mu["t_ckpt"] - mu["t_ckpt_hidden"]) / mu["t_total"],
    }
    if "grpo-cold" in med:
        out["ratios_grpo_cold_over_mu"] = {
            k: med["grpo-cold"][f"t_{k}"] / mu[f"t_{k}"] for k in ("roll", "train", "ckpt", "switch", "total")
        }
    if "mu-warm" in med:
        mw = med["mu-warm"]
        out["ratios_grpo_warm_over_mu_warm"] = {
            k: warm[f"t_{k}"] / mw[f"t_{k}"] for k in ("roll", "train", "ckpt", "switch", "total")
        }
        out["targets"]["mu-warm / grpo-warm end to end >= 1.3x"] = warm["t_total"] / mw["t_total"] >= 1.3
    if "mu-seq" in med:  # the checkpoint overlap's share: the same run with its jobs one after another
        out["ratios_mu_seq_over_mu"] = {
            k: med["mu-seq"][f"t_{k}"] / mu[f"t_{k}"] for k in ("roll", "train", "ckpt", "switch", "total")
        }
        out["overlap_saved_s"] = med["mu-seq"]["t_total"] - mu["t_total"]
    if "mu-spawn" in med:  # pre-started jobs and the job fork server: the same run, every job a new interpreter
        out["ratios_mu_spawn_over_mu"] = {
            k: med["mu-spawn"][f"t_{k}"] / mu[f"t_{k}"] for k in ("roll", "train", "ckpt", "switch", "total")
        }
        out["prestart_fork_saved_s"] = med["mu-spawn"]["t_total"] - mu["t_total"]
    # T_switch per stage (the "per cold stage boundary": the first stage also starts the run's processes)
    out["switch_per_stage_s"] = {
        arm: med[arm]["t_switch"] / results[arm][0]["stages"] for arm in med if results[arm][0]["stages"]
    }
    for arm in ("mu-bf16", "mu-lora"):  # fewer bytes per stage
        if arm in med:
            out[f"ratios_{arm}_over_mu"] = {
                k: med[arm][f"t_{k}"] / mu[f"t_{k}"] for k in ("roll", "train", "ckpt", "switch", "total")
            }
    if "mu-bf16" in med and "grpo-warm-bf16" in med:  # both with bf16 checkpoints
        out["ratios_grpo_warm_bf16_over_mu_bf16"] = {
            k: med["grpo-warm-bf16"][f"t_{k}"] / med["mu-bf16"][f"t_{k}"]
            for k in ("roll", "train", "ckpt", "switch", "total")
        }
    disk = {arm: statistics.median(r["disk_bytes_per_stage"] for r in runs) for arm, runs in results.items()}
    out["disk_gb_per_stage"] = {arm: v / 1e9 for arm, v in disk.items()}
    out["targets"]["grpo-warm / mu (cold) end to end >= 1.3x"] = e2e >= 1.3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny random model, U=4 (CI)")
    add_budget_flags(parser)
    parser.add_argument(
        "--engine",
        choices=("transformers", "vllm"),
        default="transformers",
        help="generation.engine of every arm (vllm: the generate, eval and warm segment jobs run in --vllm-python)",
    )
    parser.add_argument(
        "--vllm-python",
        default=os.environ.get("MUGRPO_VLLM_PYTHON"),
        help="the vLLM virtualenv's interpreter (generation.python); default $MUGRPO_VLLM_PYTHON",
    )
    parser.add_argument("--repeats", type=int, default=1, help="rounds of all arms, order rotated each round")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset (mu and grpo-warm needed)")
    parser.add_argument("--out", type=Path, default=None, help="write results JSON and the plot here")
    parser.add_argument("--keep-runs", action="store_true", help="keep each arm's run folder (checkpoints: GBs)")
    args = parser.parse_args()
    if args.engine == "vllm" and not args.vllm_python:
        parser.error("--engine vllm needs --vllm-python (or MUGRPO_VLLM_PYTHON): `make vllm-venv` builds it")
    tmp = Path(tempfile.mkdtemp(prefix="mugrpo-speedup-"))
    model = "smollm2"
    if args.quick:
        from mugrpo.policy.models import make_tiny_random_model

        model = str(make_tiny_random_model(tmp / "tiny", seed=0))
    b = budget(args, model)
    print(f"budget: {b}; scratch {tmp}", flush=True)
    arms = tuple(a for a in ARMS if a in args.arms.split(","))
    if not {"mu", "grpo-warm"} <= set(arms):
        parser.error("--arms must include mu and grpo-warm (the ratios are theirs)")
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    for r in range(args.repeats):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        for arm in order:
            cfg = arm_config(arm, tmp / arm, f"{arm}-{r}", b)
            t0 = time.monotonic()
            rep = run_arm(arm, cfg, tmp / f"{arm}-{r}.log", tmp)
            # what the stages left on disk, per stage: checkpoints, policies, Parquet, not the initial policy's copy
            # (policies/stage=0, written by the run's init). Without pruning (publish_policy_every 1: the mu arms)
            # that is what each stage wrote; with publish_policy_every > 1 (GRPO) older checkpoints are deleted.
            run_dir = tmp / arm / cfg.run.id
            written = [f for f in run_dir.rglob("*") if f.is_file() and "policies/stage=0/" not in f.as_posix()]
            rep["disk_bytes_per_stage"] = sum(f.stat().st_size for f in written) / rep["stages"]
            if not args.keep_runs:  # a SmolLM2 arm keeps ~2 GB of checkpoints per stage: free them once read
                shutil.rmtree(tmp / arm, ignore_errors=True)
            print(f"{arm} repeat {r}: {time.monotonic() - t0:.1f} s wall incl. final eval, log {tmp}/{arm}-{r}.log")
            results[arm].append(rep)
    print(
        f"\n{'arm':>10} {'stages':>6} {'T_roll':>8} {'T_train':>8} {'T_ckpt':>8} {'hidden':>7} {'T_switch':>8} "
        f"{'T_total':>8} {'GB/stage':>8} "
        f"{'reward':>7}  eval"
    )
    for arm in arms:
        for rep in results[arm]:
            print(
                f"{arm:>10} {rep['stages']:>6} {rep['t_roll']:>8.1f} {rep['t_train']:>8.1f} {rep['t_ckpt']:>8.1f} "
                f"{rep['t_ckpt_hidden']:>7.1f} {rep['t_switch']:>8.1f} {rep['t_total']:>8.1f} "
                f"{rep['disk_bytes_per_stage'] / 1e9:>8.2f} {rep['final_train_reward']:>7.3f}  "
                f"{json.dumps(rep['final_eval'])}"
            )
    for arm in arms:  # the precision each arm ran in, as its run.json recorded it (auto resolves per machine)
        p = results[arm][0]["precision"]
        print(
            f"{arm:>10} precision: model.dtype={p['model.dtype']}, train.mixed_precision={p['train.mixed_precision']}, "
            f"train.checkpoint_dtype={p['train.checkpoint_dtype']} ({p['reason']})"
        )
    summary = summarize(results)
    print(json.dumps({k: v for k, v in summary.items() if k != "medians"}, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "speedup.json").write_text(json.dumps({"budget": str(b), "results": results, **summary}))
        series = {arm: results[arm][0]["reward_vs_time"] for arm in arms}
        plot_reward_vs_time(series, args.out / "speedup_reward_vs_time.png", f"speedup.py: U={b.updates}")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
