"""mugrpo against the trainer people already use: TRL's GRPOTrainer (PyPI trl), mugrpo's warm GRPO and Mu-GRPO.

    make trl-venv                                # once: .venv-trl with torch (CPU), trl, and mugrpo's reward deps
    python bench/vs_trl.py --threads 2 --engine-threads 2   # SmolLM2-135M, U=32: ~14 min on 2 quiet cores
    python bench/vs_trl.py --quick               # tiny random model (CI: the plumbing, not the figures)

Arms, one after the other in one invocation (order rotated each repeat): ``trl`` (GRPOTrainer, in .venv-trl as a
subprocess: bench/trl_arm.py), ``grpo-warm`` and ``mu`` (bench/_arms.py, the same arms as bench/speedup.py) and
``bare`` (transformers generate + forward/backward of the same work, in .venv-trl). How each setting corresponds


(the table is in docs/benchmarks.md, "vs_trl.py"; run_trl_arm builds TRL's side from the mugrpo config).

Per arm it prints seconds per optimizer update, the total to U updates, and the reward curve; then the ratios
against the targets (grpo-warm s/update <= 1.0x TRL's; TRL total / Mu-GRPO total >= 1.5). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._arms import REPO, Budget, arm_config, plot_reward_vs_time, run_arm  # noqa: E402
from bench.speedup import add_budget_flags, budget  # noqa: E402

TRL_VENV = REPO / ".venv-trl"
HOW = "make trl-venv   (python3 -m venv .venv-trl; torch==2.13.0 from the CPU index; trl; pydantic pebble math-verify)"
ARMS = ("trl", "grpo-warm", "mu", "bare")


def trl_python() -> Path:
    """The TRL venv's python. Raises SystemExit saying how to create it when missing."""
    py = Path(os.environ.get("MUGRPO_TRL_PYTHON", TRL_VENV / "bin" / "python"))
    if not py.exists():
        raise SystemExit(f"TRL virtualenv not found at {py}; create it with:\n  {HOW}")
    return py


def trl_prompts(cfg) -> list[tuple[str, str]]:
    """(rendered prompt, ground truth) of every stage of a mugrpo arm, in the order mugrpo samples them."""
    from mugrpo.data.datasets import load_problems
    from mugrpo.data.prompts import render_prompt
    from mugrpo.generation import GenerateSpec, select_problems
    from mugrpo.policy.models import load_tokenizer

    out = []
    for k in range(cfg.run.num_stages):
        spec = GenerateSpec.from_config(cfg, k, 0)
        problems, _ = load_problems(spec.dataset)
        tok = load_tokenizer(model_dir_for(cfg))
        for p in select_problems(problems, spec.seed, spec.prompt_start, spec.num_prompts):
            out.append((render_prompt(tok, p.question, spec.prompt), p.ground_truth))
    return out


def model_dir_for(cfg) -> str:
    """The HF dir of the run's initial policy (policies/stage=0 of a run that init_run created)."""
    return str(Path(cfg.run.root) / cfg.run.id / "policies" / "stage=0")


def run_trl_arm(arm: str, cfg, b: Budget, tmp: Path, model_dir: str, prompts, threads: int) -> dict:
    spec = {
        "arm": arm,
        "model_dir": model_dir,
        "prompts": prompts,
        "scratch": str(tmp / f"{arm}-scratch"),
        "updates": b.updates,
        "rollouts_per_update": b.rollouts_per_update,
        "group_size": b.group_size,
        "mu": 4,
        "max_new_tokens": b.max_new_tokens,
        "temperature": cfg.generation.sampling.temperature,
        "lr": cfg.train.lr,
        "warmup_updates": cfg.train.warmup_updates,
        "max_grad_norm": cfg.train.max_grad_norm,
        "gradient_checkpointing": cfg.train.gradient_checkpointing,
        "bf16": cfg.train.mixed_precision == "bf16",
        "seed": cfg.run.seed,
        "num_threads": threads,
        "reward_components": dict(cfg.reward.components),
    }
    spec_path, out_path = tmp / f"{arm}.spec.json", tmp / f"{arm}.out.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.monotonic()
    with open(tmp / f"{arm}.log", "ab") as log:
        code = subprocess.run([str(trl_python()), str(REPO / "bench" / "trl_arm.py"), str(spec_path), str(out_path)],
                              env=env, stdout=log, stderr=log).returncode  # fmt: skip
    if code != 0:
        raise SystemExit(f"{arm} arm failed ({code}); see {tmp / f'{arm}.log'}")
    res = json.loads(out_path.read_text())
    res["wall"] = time.monotonic() - t0
    return res


def report(arm: str, res: dict, updates: int) -> dict:
    """Seconds per update, total to U updates, reward curve (update, seconds, reward) of one arm."""
    if arm in ("trl", "bare"):
        curve = [(m["update"], m["t"], m["reward"]) for m in res["marks"]]
        total = res["t_train"] + res["t_load"]  # process start to U updates, as a mugrpo arm's T_total
        return {
            "s_per_update": total / updates,  # as the mugrpo arms' (their T_total includes their jobs' starts)
            "s_per_update_train_only": res["t_train"] / updates,  # trainer.train() alone
            "total": total,
            "load": res["t_load"],
            "curve": curve,
        }
    curve = [(u, None, r) for u, r in res["reward_per_update"]]  # per-update seconds: see reward_vs_time
    return {
        "s_per_update": res["t_total"] / updates,
        "total": res["t_total"],
        "t_roll": res["t_roll"],
        "t_train": res["t_train"],
        "t_ckpt": res["t_ckpt"],
        "t_switch": res["t_switch"],
        "curve": curve,
        "reward_vs_time": res["reward_vs_time"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny random model, U=8 (CI)")
    add_budget_flags(parser)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="TRL/bare torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=None, help="write results JSON and the plot here")
    parser.add_argument("--arms", default=",".join(ARMS), help="a subset of the arms, comma-separated")
    args = parser.parse_args()
    arms = tuple(a for a in ARMS if a in args.arms.split(","))
    trl_python()
    import torch

    threads = args.threads or torch.get_num_threads()
    tmp = Path(tempfile.mkdtemp(prefix="mugrpo-vs-trl-"))
    model = "smollm2"
    if args.quick:
        from mugrpo.policy.models import make_tiny_random_model

        model = str(make_tiny_random_model(tmp / "tiny", seed=0))
    b = budget(args, model)
    from mugrpo.orchestration.runs import init_run

    ref = arm_config("grpo-warm", tmp / "ref", "ref", b)  # its policies/stage=0 is the HF dir TRL loads
    init_run(ref)
    model_dir, prompts = model_dir_for(ref), trl_prompts(ref)
    print(f"budget: {b}; {len(prompts)} prompts; model dir {model_dir}; scratch {tmp}", flush=True)
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    for r in range(args.repeats):
        for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
            t0 = time.monotonic()
            if arm in ("trl", "bare"):
                res = run_trl_arm(arm, ref, b, tmp, model_dir, prompts, threads)
            else:
                cfg = arm_config(arm, tmp / arm, f"{arm}-{r}", b)
                res = run_arm(arm, cfg, tmp / f"{arm}-{r}.log", tmp)
            rep = report(arm, res, b.updates)
            shutil.rmtree(tmp / arm, ignore_errors=True)  # its checkpoints (GBs at SmolLM2 size), read already
            shutil.rmtree(tmp / f"{arm}-scratch", ignore_errors=True)
            results[arm].append(rep)
            print(
                f"{arm} repeat {r}: {time.monotonic() - t0:.1f} s wall, {rep['s_per_update']:.2f} s/update", flush=True
            )
    med = {arm: sorted(x["total"] for x in runs)[len(runs) // 2] for arm, runs in results.items()}
    spu = {arm: sorted(x["s_per_update"] for x in runs)[len(runs) // 2] for arm, runs in results.items()}
    summary = {"s_per_update": spu, "total_to_U": med, "targets": {}}
    if {"grpo-warm", "trl"} <= set(arms):
        summary["grpo_warm_over_trl_s_per_update"] = spu["grpo-warm"] / spu["trl"]
        summary["targets"]["grpo-warm s/update <= 1.0 x TRL"] = spu["grpo-warm"] <= spu["trl"]
    if {"mu", "trl"} <= set(arms):
        summary["trl_total_over_mu_total"] = med["trl"] / med["mu"]
        summary["targets"]["Mu-GRPO end to end >= 1.5x faster than TRL"] = med["trl"] / med["mu"] >= 1.5
    if {"bare", "trl"} <= set(arms):
        summary["trl_over_bare_s_per_update"] = spu["trl"] / spu["bare"]
    for arm in arms:
        rep = results[arm][0]
        rewards = " ".join(f"{x[2]:.2f}" if x[2] is not None else "-" for x in rep["curve"])
        print(f"{arm:>9}: {rep['s_per_update']:.2f} s/update, {rep['total']:.1f} s to U; reward per update: {rewards}")
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vs_trl.json").write_text(json.dumps({"budget": str(b), "results": results, **summary}))
        series = {
            arm: results[arm][0]["reward_vs_time"]
            if arm in ("grpo-warm", "mu")
            else [(t + results[arm][0]["load"], rw) for _, t, rw in results[arm][0]["curve"]]
            for arm in arms
        }
        plot_reward_vs_time(series, args.out / "vs_trl_reward_vs_time.png", f"vs_trl.py: U={b.updates}")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
