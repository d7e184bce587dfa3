"""Shared by bench/speedup.py and bench/vs_trl.py: build the equal-budget arms (Mu-GRPO cold, GRPO warm, GRPO
cold), run them through the job processes exactly as bench/warm_vs_cold.py does (its `run_cold` / `run_warm`), and
read back per-phase seconds and rewards from the committed manifests and Parquet files.

Per-phase seconds of an arm (summed over its stages), the columns of the Mu-GRPO paper's Table 1 (arXiv 2605.17570):
- T_roll: generation work (the generate job's / worker's own ``gen`` seconds, in its job manifest);
- T_train: training work: the train job's ``train`` seconds (its updates and the behavior log-prob recompute
  pass) less its ``checkpoint`` seconds;
- T_ckpt: the train job's ``checkpoint`` seconds (train_steps parts, model + AdamW checkpoint writes), apart
  because the arms checkpoint a different number of times (every stage's end) and it is neither training nor
  switching;
- T_ckpt hidden: of T_ckpt, the seconds that ran beside the next stage's generation (cold execution with
  ``orchestration.overlap_checkpoint``: the stage manifests' ``t_overlap``), counted once;
- T_switch: T_total - T_roll - T_train - (T_ckpt - T_ckpt hidden) (process start, imports, weight and
  optimizer-state load, engine start, weight sync, policy publish, Parquet commits and bookkeeping), the same formula
  for cold and warm arms;
- T_total: the stage manifests' ``t_total`` less their ``t_eval`` summed (wall clock of the stages without in-stage
  evaluation; the run's init is excluded for all).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.warm_vs_cold import job, run_cold, run_warm  # noqa: E402  (reuse, not duplicate, the arm runners)

MU_CONFIG = REPO / "configs" / "gsm8k-smollm2.yaml"
GRPO_CONFIG = REPO / "configs" / "gsm8k-smollm2-grpo.yaml"
GRPO_MU = 4  # the paper's GRPO baseline staleness
#: LoRA's learning rate over full fine-tuning's ("LoRA Without Regret": ~10x; mugrpo.policy.adapters).
LORA_LR_FACTOR = 10


@dataclass(frozen=True)
class Arm:
    """One arm: the method (``mu``: Mu-GRPO, K stages; ``grpo``: GRPO, mu = 4), how it executes, and config
    overrides (dotted ``key=value``) on top of the shared budget."""

    method: str
    execution: str
    overrides: tuple[str, ...] = ()


#: The arms: Mu-GRPO with K cold stages (the paper's), GRPO mu = 4 warm (the fair baseline) and cold, Mu-GRPO's K
#: stages in one warm segment job (isolates the method from the execution mode); then Mu-GRPO cold with one
#: change each, for its share: its jobs strictly one after another (``mu-seq``: the checkpoint overlap), every job
#: a new interpreter started when its turn comes (``mu-spawn``: pre-started jobs and the job fork server), bf16
#: checkpoints (``mu-bf16``, paired with ``grpo-warm-bf16``: the baseline gets the same bytes), LoRA adapters of
#: rank 16 at 10x the learning rate (``mu-lora``).
ARM_SPECS: dict[str, Arm] = {
    "mu": Arm("mu", "cold"),
    "grpo-warm": Arm("grpo", "warm"),
    "grpo-cold": Arm("grpo", "cold"),
    "mu-warm": Arm("mu", "warm"),
    "mu-seq": Arm("mu", "cold", ("orchestration.overlap_checkpoint=false",)),
    "mu-spawn": Arm("mu", "cold", ("orchestration.prestart_jobs=false", "orchestration.fork_jobs=false")),
    "mu-bf16": Arm("mu", "cold", ("train.checkpoint_dtype=bfloat16",)),
    "grpo-warm-bf16": Arm("grpo", "warm", ("train.checkpoint_dtype=bfloat16",)),
    "mu-lora": Arm("mu", "cold", ("train.lora={rank: 16, alpha: 32}",)),
}
ARMS = tuple(ARM_SPECS)


@dataclass(frozen=True)
class Budget:
    """What every arm shares: total updates U, rollouts per update, G, new tokens, model and seed."""

    updates: int = 32
    rollouts_per_update: int = 4
    group_size: int = 4
    max_new_tokens: int = 32
    model: str = "smollm2"
    eval_prompts: int = 8
    mu_stages: int = 4  # Mu-GRPO: K cold stages, mu = U / K
    num_threads: int = 1
    engine: str = "transformers"  # generation.engine of every arm: "transformers" or "vllm"
    engine_python: str | None = None  # generation.python (the vLLM virtualenv's interpreter for "vllm")
    extra: tuple[str, ...] = field(default_factory=tuple)

    def check(self) -> None:
        """Raises ValueError when the arms cannot share the budget exactly."""
        if self.updates % (self.mu_stages * 1) or self.updates % GRPO_MU:
            raise ValueError(f"updates U={self.updates} must be a multiple of K={self.mu_stages} and of mu={GRPO_MU}")
        if self.rollouts_per_update % self.group_size:
            raise ValueError("rollouts_per_update must be a multiple of G (whole groups per update)")

    @property
    def total_prompts(self) -> int:
        return self.updates * self.rollouts_per_update // self.group_size


def arm_config(arm: str, root: Path, run_id: str, b: Budget):
    """The resolved Config of arm ``mu`` (Mu-GRPO, cold), ``mu-warm``, ``grpo-warm``, ``grpo-cold`` or ``mu-seq``
    (:data:`ARMS`) under budget ``b``.

    Every arm consumes the same ``b.total_prompts`` prompts in the same seed-fixed order (stage k starts where
    k-1 ended). ``generation.shard_size`` is one Mu-GRPO stage for every arm, so each arm generates a stage in
    as few engine batches as its stage allows (the GRPO arms' stages are smaller: that is the method's
    difference, not a handicap we add). Zero-variance groups are kept so every arm runs exactly U updates of
    equal size. Evaluation runs once, on the final policy, after the timed stages.
    """
    from mugrpo.config import config_from_dict, load_config

    b.check()
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}: one of {', '.join(ARMS)}")
    spec = ARM_SPECS[arm]
    mu = spec.method == "mu"
    stages = b.mu_stages if mu else b.updates // GRPO_MU
    per_stage = b.updates // stages
    prompts = b.total_prompts // stages
    mu_prompts = b.total_prompts // b.mu_stages
    overrides = [
        f"run.root={root}",
        f"run.id={run_id}",
        f"run.num_stages={stages}",
        f"model.source={b.model}",
        f"generation.prompts_per_stage={prompts}",
        f"generation.shard_size={mu_prompts}",
        f"generation.sampling.n={b.group_size}",
        f"generation.sampling.max_new_tokens={b.max_new_tokens}",
        f"generation.engine={b.engine}",
        # num_threads is the transformers engine's; vLLM on a CPU takes the product's defaults (cpu_defaults)
        f"generation.engine_kwargs={{num_threads: {b.num_threads}}}"
        if b.engine == "transformers"
        else ("generation.engine_kwargs={}"),
        *([f"generation.python={b.engine_python}"] if b.engine_python else []),
        f"train.updates_per_stage={per_stage}",
        f"train.rollouts_per_update={b.rollouts_per_update}",
        f"train.micro_batch_size={b.rollouts_per_update}",
        f"train.checkpoint_every={per_stage}",
        "train.skip_zero_variance_groups=false",
        "eval.every_stage=false",
        "tracking.sinks=[]",
        f"orchestration.execution={spec.execution}",
        f"orchestration.segment_stages={stages}",
        *spec.overrides,
        *b.extra,
    ]
    cfg = load_config(MU_CONFIG if mu else GRPO_CONFIG, overrides)
    if cfg.train.lora is not None:
        cfg = load_config(MU_CONFIG if mu else GRPO_CONFIG, [*overrides, f"train.lr={cfg.train.lr * LORA_LR_FACTOR}"])
    data = cfg.to_json_dict()
    gsm8k = [bench for bench in data["eval"]["benchmarks"] if bench["dataset"]["name"] == "gsm8k"]
    for bench in gsm8k:
        bench.update(num_prompts=b.eval_prompts, max_new_tokens=b.max_new_tokens)
    data["eval"]["benchmarks"] = gsm8k if b.eval_prompts > 0 else []
    return config_from_dict(data, source=f"bench arm {arm}")


def execute(cfg, log: Path, tmp: Path) -> None:
    """Run ``cfg``'s stages through the job processes (cold: three per stage; warm: one segment job; as its
    ``orchestration.execution`` says), then evaluate its final policy (an eval job)."""
    from flows.stage import job_python
    from mugrpo.orchestration.job_specs import write_final_eval_spec
    from mugrpo.orchestration.runs import attach_run

    if cfg.orchestration.execution == "warm":
        run_warm(cfg, log, tmp)
    else:
        run_cold(cfg, log)
    spec = write_final_eval_spec(attach_run(cfg))
    if spec is not None:
        job("eval", spec, log, job_python(cfg, "eval"))


def run_arm(arm: str, cfg, log: Path, tmp: Path) -> dict:
    """Run the arm's stages (timed), then evaluate its final policy (untimed); returns :func:`arm_report`."""
    execute(cfg, log, tmp)
    return arm_report(cfg)


def arm_report(cfg) -> dict:
    """Per-phase seconds (module docstring), rewards per stage and per update, and the final eval of a run."""
    import pyarrow.dataset as ds

    from mugrpo.commits.manifest import read_job_manifest
    from mugrpo.orchestration.runs import open_store

    store, run = open_store(cfg), cfg.run.id
    stages, t = phase_seconds(cfg)
    base = Path(cfg.run.root) / run
    rollouts = ds.dataset(base / "rollouts", format="parquet", partitioning="hive").to_table(
        columns=["stage", "reward"]
    )
    steps = ds.dataset(base / "train_steps", format="parquet", partitioning="hive").to_table(
        columns=["update", "mean_reward", "seconds"]
    )
    steps = sorted(zip(*(steps.column(c).to_pylist() for c in ("update", "mean_reward", "seconds")), strict=True))
    stage_col, reward_col = rollouts.column("stage").to_pylist(), rollouts.column("reward").to_pylist()
    elapsed, curve = 0.0, []
    for k, s in enumerate(stages):  # reward of stage k's rollouts, plotted when its generation ended
        rewards = [r for st, r in zip(stage_col, reward_col, strict=True) if int(st) == k]
        curve.append((elapsed + s["t_roll"], sum(rewards) / max(len(rewards), 1)))
        elapsed += s["t_total"]
    final = read_job_manifest(store, run, cfg.run.num_stages, "eval")
    last = [r for _, r, _ in steps[-max(len(steps) // 4, 1) :] if r is not None]
    return {
        "precision": arm_precision(store, run),
        "stages": len(stages),
        "updates": len(steps),
        **t,
        "reward_vs_time": curve,
        "reward_per_update": [(u, r) for u, r, _ in steps],
        "final_train_reward": sum(last) / max(len(last), 1),
        "final_eval": final.metrics if final is not None else {},
    }


def arm_precision(store, run_id: str) -> dict:
    """The precision an arm ran in, as its run.json recorded it at the run's start (mugrpo.config.precision): the
    resolved keys, why, and the machine's bf16 probe figures."""
    from mugrpo.storage.layout import RunLayout

    doc = store.read_json(RunLayout(run_id).run_json)
    record = doc.get("precision") or {}
    config = doc["config"]
    return {
        "model.dtype": config["model"]["dtype"],
        "train.mixed_precision": config["train"]["mixed_precision"],
        "train.checkpoint_dtype": config["train"]["checkpoint_dtype"],
        "reason": record.get("reason", "set in the config"),
        "hardware": record.get("hardware"),
    }


def phase_seconds(cfg) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Per-phase seconds of a committed run (module docstring), per stage and summed.

    Each stage's ``t_total`` excludes its in-stage evaluation (the stage manifest's ``t_eval``: the bench's
    measuring instrument, not training), so T_switch never counts evaluation.

    Returns:
        (one dict per stage with t_roll, t_train, t_ckpt, t_ckpt_hidden (of t_ckpt, the seconds beside the next
        stage's generation), t_eval, t_total; their sums plus t_switch, which counts hidden seconds once).
    Raises:
        AttributeError: a stage or its generate / train job has no committed manifest.
    """
    from mugrpo.commits.manifest import read_job_manifest, read_manifest
    from mugrpo.orchestration.runs import open_store

    store, run = open_store(cfg), cfg.run.id
    stages = []
    for k in range(cfg.run.num_stages):
        m = read_manifest(store, run, k)
        gen = read_job_manifest(store, run, k, "generate").timings.get("gen", 0.0)
        train = read_job_manifest(store, run, k, "train").timings
        ckpt = train.get("checkpoint", 0.0)
        stages.append(
            {
                "t_roll": gen,
                "t_train": train.get("train", 0.0) - ckpt,
                "t_ckpt": ckpt,
                # of it, seconds that ran beside the next stage's generation (mugrpo.execution.pipeline): in t_total
                # once
                "t_ckpt_hidden": min(m.timings.t_overlap, ckpt),
                "t_eval": m.timings.t_eval,
                "t_total": m.timings.t_total - m.timings.t_eval,
            }
        )
    keys = ("t_roll", "t_train", "t_ckpt", "t_ckpt_hidden", "t_eval", "t_total")
    t = {key: sum(s[key] for s in stages) for key in keys}
    visible_ckpt = t["t_ckpt"] - t["t_ckpt_hidden"]  # hidden seconds are the next generation's too: count them once
    t["t_switch"] = max(t["t_total"] - t["t_roll"] - t["t_train"] - visible_ckpt, 0.0)
    return stages, t


def amdahl_bound(f_train: float, rollout_speedup: float) -> float:
    """Best end-to-end speed-up when only rollout time shrinks (Amdahl's law): 1 / (f + (1 - f) / s).

    Args:
        f_train: share of T_train in the baseline's T_total (0..1); the rest is taken as what the rollout
            ratio speeds up (generation and switching).
        rollout_speedup: s, the measured T_roll(baseline) / T_roll(Mu-GRPO).
    Raises:
        ValueError: f outside [0, 1] or s <= 0.
    """
    if not 0.0 <= f_train <= 1.0 or rollout_speedup <= 0:
        raise ValueError(f"need 0 <= f <= 1 and s > 0, got f={f_train}, s={rollout_speedup}")
    return 1.0 / (f_train + (1.0 - f_train) / rollout_speedup)


def plot_reward_vs_time(series: dict[str, list[tuple[float, float]]], path: Path, title: str) -> Path:
    """One PNG: reward (y) against wall-clock seconds (x), one line per arm (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=90)
    for name, points in series.items():
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.set_xlabel("wall-clock seconds")
    ax.set_ylabel("mean training reward")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
