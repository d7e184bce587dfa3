"""The Mu-GRPO paper's stability result in miniature (arXiv 2605.17570): many updates on one static rollout set.

    python bench/ablation.py --prompts 32 --group-size 4 --out DIR   # SmolLM2-135M, mu = 64 per arm: ~25 min
                                                     # on 2 quiet cores (the default G = 8: ~2x that)
    python bench/ablation.py --quick                 # tiny random model, mu = 4 (CI: the plumbing)

One stage of real rollouts is generated and committed once (the generate job of configs/gsm8k-smollm2.yaml, one
stage); every arm then trains on exactly those files (hard links into the arm's own run folder) with the train
job, mu updates at a raised learning rate, and its final policy is evaluated (greedy GSM8K subset):
- naive:    PPO clip [0.8, 1.2], no veto (loss grpo);
- relaxed:  clip [0, 5], no veto (mu_grpo, veto_enabled=false);
- veto-*:   Mu-GRPO, clip [0, 5] with the veto in each scope: trigger, suffix, non_trigger_suffix, sequence.
From train_steps it plots, against the update number: E[ratio | A<0] (ratio_mean_neg_adv), the veto fraction
(veto_token_frac), the clip fraction (clip_frac_low + clip_frac_high) and the minibatch's training reward, one
HTML-free PNG with four panels. The training reward of a static stage is the reward of the stored rollouts the
update drew, not of the moving policy: the final eval is the quality read-out. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._arms import MU_CONFIG, job  # noqa: E402

RUN_ID = "ablation"
ARMS: dict[str, list[str]] = {
    "naive": ["loss.name=grpo", "loss.eps_low=0.2", "loss.eps_high=0.2"],
    "relaxed": ["loss.name=mu_grpo", "loss.veto_enabled=false"],
    **{
        f"veto-{s}": ["loss.name=mu_grpo", f"loss.veto_scope={s}"]
        for s in ("trigger", "suffix", "non_trigger_suffix", "sequence")
    },
}
PANELS = {
    "ratio_mean_neg_adv": "E[ratio | A<0]",
    "veto_token_frac": "veto fraction (tokens)",
    "clip_frac": "clip fraction (low + high)",
    "mean_reward": "training reward (minibatch)",
}


def config(
    root: Path, quick: bool, model: str, updates: int, lr: float, extra: list[str], prompts: int = 16, group: int = 8
):
    """The arm's one-stage Mu-GRPO config: ``prompts`` x G = ``group`` rollouts of 64 new tokens, one group per
    update (``rollouts_per_update`` = G), ``updates`` updates at ``lr``; ``extra`` overrides pick the loss."""
    from mugrpo.config import config_from_dict, load_config

    o = [
        f"run.root={root}",
        f"run.id={RUN_ID}",
        "run.num_stages=1",
        f"model.source={model}",
        f"train.updates_per_stage={updates}",
        f"train.checkpoint_every={updates}",
        f"train.lr={lr}",
        "eval.every_stage=false",
        "tracking.sinks=[]",
    ]
    prompts, g, tokens, per_update = (2, 2, 4, 2) if quick else (prompts, group, 64, group)
    o += [
        f"generation.prompts_per_stage={prompts}",
        f"generation.shard_size={prompts}",
        f"generation.sampling.n={g}",
        f"generation.sampling.max_new_tokens={tokens}",
        f"train.rollouts_per_update={per_update}",
        f"train.micro_batch_size={per_update}",
    ]
    if quick:  # a tiny random model's rewards are all 0: keep its groups so the arms have something to train on
        o.append("train.skip_zero_variance_groups=false")
    data = load_config(MU_CONFIG, o + extra).to_json_dict()
    gsm8k = [b for b in data["eval"]["benchmarks"] if b["dataset"]["name"] == "gsm8k"]
    for b in gsm8k:
        b.update(num_prompts=2 if quick else 8, max_new_tokens=4 if quick else 64)
    data["eval"]["benchmarks"] = [] if quick else gsm8k
    return config_from_dict(data, source="ablation")


def link_stage(src: Path, dst: Path) -> None:
    """Hard-link stage 0's committed rollouts and generate job manifest of run ``src`` into run ``dst``."""
    for rel in ("rollouts/stage=0", "jobs/stage=0"):
        for f in (src / rel).rglob("*"):
            if f.is_file() and (rel == "rollouts/stage=0" or f.name.startswith("generate")):
                target = dst / f.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.exists():
                    os.link(f, target)


def steps_table(root: Path) -> dict[str, list]:
    import pyarrow.dataset as ds

    t = ds.dataset(root / RUN_ID / "train_steps", format="parquet", partitioning="hive").to_table()
    rows = sorted(t.to_pylist(), key=lambda r: r["update"])
    out = {"update": [r["update"] for r in rows]}
    for col in ("ratio_mean_neg_adv", "veto_token_frac", "mean_reward", "ratio_mean", "ratio_max"):
        out[col] = [r.get(col) for r in rows]
    out["clip_frac"] = [(r.get("clip_frac_low") or 0.0) + (r.get("clip_frac_high") or 0.0) for r in rows]
    return out


def plot(curves: dict[str, dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(9, 6), dpi=80, sharex=True)
    for ax, (col, label) in zip(axes.flat, PANELS.items(), strict=True):
        for arm, c in curves.items():
            ys = [float("nan") if y is None else y for y in c[col]]
            ax.plot(c["update"], ys, label=arm, lw=1.2)
        ax.set_title(label, fontsize=9)
        values = [y for c in curves.values() for y in c[col] if y is not None]
        if col == "ratio_mean_neg_adv" and values and min(values) > 0:  # log only where it can show every point
            ax.set_yscale("log")
    for ax in axes[1]:
        ax.set_xlabel("update")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--updates", type=int, default=None, help="mu: updates on the one stage (default 64)")
    parser.add_argument("--lr", type=float, default=1e-4, help="raised from the configs' 2e-5 to move the policy")
    parser.add_argument("--prompts", type=int, default=16, help="prompts of the one stage")
    parser.add_argument("--group-size", type=int, default=8, help="G; one group per update")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    updates = args.updates or (4 if args.quick else 64)
    tmp = Path(tempfile.mkdtemp(prefix="mugrpo-ablation-"))
    model = "smollm2"
    if args.quick:
        from mugrpo.policy.models import make_tiny_random_model

        model = str(make_tiny_random_model(tmp / "tiny", seed=0))
    from mugrpo.commits.manifest import read_job_manifest
    from mugrpo.orchestration.job_specs import write_final_eval_spec, write_job_specs
    from mugrpo.orchestration.runs import attach_run, init_run, open_store

    sizes = {"prompts": args.prompts, "group": args.group_size}
    gen_cfg = config(tmp / "gen", args.quick, model, updates, args.lr, ARMS["veto-suffix"], **sizes)
    init_run(gen_cfg)
    t0 = time.monotonic()
    job("generate", write_job_specs(attach_run(gen_cfg), 0)["generate"], tmp / "gen.log")
    print(f"stage 0 generated in {time.monotonic() - t0:.1f} s; scratch {tmp}", flush=True)
    curves, evals = {}, {}
    for arm, extra in ARMS.items():
        cfg = config(tmp / arm, args.quick, model, updates, args.lr, extra, **sizes)
        shutil.copytree(tmp / "gen" / RUN_ID / "policies", tmp / arm / RUN_ID / "policies", copy_function=os.link)
        init_run(cfg)
        run = attach_run(cfg)
        link_stage(tmp / "gen" / RUN_ID, tmp / arm / RUN_ID)
        t0 = time.monotonic()
        job("train", write_job_specs(run, 0)["train"], tmp / f"{arm}.log")
        from mugrpo.orchestration.runs import commit_stage
        from schemas import StageTimings

        commit_stage(run, 0, StageTimings())
        spec = write_final_eval_spec(run)
        if spec is not None:  # --quick evaluates nothing (one process start less per arm)
            job("eval", spec, tmp / f"{arm}.log")
            evals[arm] = read_job_manifest(open_store(cfg), RUN_ID, 1, "eval").metrics
        curves[arm] = steps_table(tmp / arm)
        shutil.rmtree(tmp / arm / RUN_ID / "checkpoints", ignore_errors=True)  # GBs at SmolLM2 size; read already
        c = curves[arm]
        neg = [x for x in c["ratio_mean_neg_adv"] if x is not None]
        last = neg[-8:]
        print(
            f"{arm:>24}: {time.monotonic() - t0:.0f} s; E[ratio|A<0] last 8 updates "
            f"{sum(last) / max(len(last), 1):.3g} (min {min(neg, default=float('nan')):.3g}); veto frac last "
            f"{c['veto_token_frac'][-1]}; clip frac last {c['clip_frac'][-1]:.3f}; eval {json.dumps(evals.get(arm))}",
            flush=True,
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ablation.json").write_text(
            json.dumps({"updates": updates, "lr": args.lr, **sizes, "curves": curves, "evals": evals})
        )
        plot(
            curves,
            args.out / "ablation.png",
            f"ablation.py: one {'tiny random' if args.quick else 'SmolLM2'} stage, mu={updates}, lr={args.lr}",
        )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
