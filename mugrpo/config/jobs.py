"""The sections of a stage's jobs: generation (``generation``), training (``train``) and evaluation (``eval``, with
its benchmarks)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from mugrpo.config.base import _Section
from mugrpo.config.threads import THREADS_KEY, check_threads
from mugrpo.config_keys import OPERATIONAL
from mugrpo.data.datasets import DatasetConfig
from mugrpo.engines.base import SamplingParams
from mugrpo.policy.adapters import LoraSection
from mugrpo.schedules.lr import LR_SCHEDULES


class GenerationSection(_Section):
    """The generation job: sampling G responses per prompt from the frozen behavior policy."""

    engine: str = Field("transformers", description="Rollout engine: 'transformers' (CPU default) or 'vllm' (GPU).")
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra engine options. transformers: num_threads ('auto', the default: the cores the jobs "
        "beside it leave free, decided by the schedule and recorded in the job spec, mugrpo.config.threads; or an "
        "integer), batch_size ('auto', the default: as many rows per forward pass as kv_budget_gib of KV cache "
        "holds, 1.0 GiB by default; or rows), fp32_logits. vllm: see mugrpo.engines.vllm_engine.",
    )
    sampling: SamplingParams = Field(default_factory=SamplingParams)

    @field_validator("engine_kwargs")
    @classmethod
    def _check_num_threads(cls, value: dict[str, Any]) -> dict[str, Any]:
        if THREADS_KEY in value:
            check_threads(value[THREADS_KEY])
        return value

    prompts_per_stage: int = Field(64, ge=1, description="Prompts sampled per stage (not published by Mu-GRPO).")
    shard_size: int = Field(16, ge=1, description="Prompts per Parquet shard; a group never spans two shards.")
    workers: int = Field(
        1,
        ge=1,
        json_schema_extra=OPERATIONAL,
        description="Generation workers per stage: the stage flow launches this many generate jobs at once (N "
        "processes locally, N Kubernetes Jobs, each with its own GPU request); worker w samples shards w, w + N, ... "
        "(mugrpo.coordination.fanout). Per-shard seeds make the rollouts independent of N with the transformers "
        "engine. Generation is embarrassingly parallel (one frozen behavior policy per stage, Mu-GRPO arXiv "
        "2605.17570), so N is bounded by the shards of a stage and the GPUs of the pool; AGPO's probes need N = 1.",
    )
    python: str | None = Field(
        None,
        json_schema_extra=OPERATIONAL,
        description="Interpreter of the generation job (e.g. a separate vLLM virtualenv); None = this one.",
    )


class TrainSection(_Section):
    """The training job: many optimizer updates on the static rollout set of a stage."""

    updates_per_stage: int = Field(
        8, ge=1, description="Optimizer updates per stage = staleness mu. Mu-GRPO: 1024 (arXiv 2605.17570 Table 1)."
    )
    rollouts_per_update: int = Field(8, ge=1, description="Responses per optimizer update (minibatch).")
    micro_batch_size: int = Field(4, ge=1, description="Responses per forward/backward (gradient accumulation).")
    group_minibatches: bool = Field(
        False, description="Draw whole groups per minibatch (needed by group-wise losses such as ConSPO)."
    )
    skip_zero_variance_groups: bool = Field(
        True,
        description="Drop groups whose rewards are all equal (advantage 0 everywhere) before training. They add no "
        "policy gradient but count in token-mean denominators; DAPO (arXiv 2503.14476) and the replay-buffer GRPO "
        "(arXiv 2606.04560) drop them. Advantage estimators only flag them (the `zero_variance` column).",
    )
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = Field((0.9, 0.999))
    optimizer_impl: Literal["auto", "for-loop", "foreach", "fused"] = Field(
        "auto",
        description="How torch's AdamW runs its step (torch.optim.AdamW's foreach / fused arguments). 'auto' "
        "(default): torch's own choice by device, 'foreach' for CUDA tensors and 'for-loop' on the CPU. 'foreach' "
        "(multi-tensor ops) is bitwise equal to 'for-loop' (tensor by tensor); on a 2-core CPU it took 0.77x the "
        "for-loop step's speed for SmolLM2-135M's 272 tensors, and 'fused' (one kernel per tensor group) 4.9x, "
        "its weights ~1 ulp apart per step (another order of float operations: a run's curve differs by round-off; "
        "bench/optimizer_step.py). The step is ~4% of a main-job update on that CPU.",
    )
    warmup_updates: int = Field(0, ge=0, description="Linear warmup from 0 over this many updates.")
    lr_schedule: str = Field(
        "constant",
        description="After warmup: 'constant', 'cosine' (SGDR, arXiv 1608.03983, to 0 at the last update of the run) "
        "or 'linear' (to 0), or any multiplier registered in mugrpo.schedules.lr.LR_SCHEDULES.",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient-norm clipping threshold.")
    checkpoint_every: int = Field(4, ge=1, description="Updates between checkpoints (and one at the end).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    logprob_chunk_size: int = Field(1024, ge=1, description="Tokens per chunk of the fused log-softmax.")
    shared_prefix: bool = Field(
        True,
        description="Run a micro-batch's shared prompt prefix (system prompt, worked examples, a group's prompt) once, "
        "every row attending to its one copy of keys and values (Prefix Grouper, arXiv 2506.05433): the same "
        "log-probs (bitwise in fp32 on CPU), gradients equal up to fp32 summation order; forward and backward "
        "1.91x faster on the main job's micro-batches (bench/shared_prefix_train.py). Off while "
        "gradient_checkpointing recomputes layers.",
    )
    recompute_behavior_logprobs: bool | Literal["auto"] = Field(
        False,
        description="Recompute behavior log-probs with the trainer at stage start instead of trusting the engine's "
        "(removes engine-vs-trainer mismatch; see loss.tis_cap for the truncated-IS alternative). The trainer's "
        "forward is batch-invariant on CPU and the recomputation runs under the same autocast, so the update-1 "
        "ratio is exactly 1; verl's default (old log-probs recomputed by the actor). One extra no-grad forward "
        "over the rollouts the stage's updates draw. auto: on when the engines sample in another dtype than fp32 (the "
        "bf16 gap), off in fp32, where sampler and trainer agree within 2e-6 nats and the forward would be wasted; "
        "resolved with the precision at run start (mugrpo.config.precision). auto in the SmolLM2 configs.",
    )
    learner_temperature: float | None = Field(
        None,
        gt=0,
        description="Temperature of the learner's pi_theta, apart from the sampling temperature (docs/"
        "truncated-sampling.md, 'Learner temperature'). None: the learner uses each rollout's sampling temperature. "
        "Set, the importance ratio is pi_theta at this temperature over the behavior log-probs q of the tempered, "
        "truncated sampler (the stage-start recompute stays at the sampler's temperature and truncation); greedy "
        "rollouts keep T = 1. 'Cool the Sampler, Not the Learner' (arXiv 2609.36953): sampling at T 0.8 with the "
        "learner at 1.0 and q from the tempered sampler moves the staleness cliff about 2x further; cooling the "
        "sampler without this importance correction collapses. Must be > 0.",
    )
    lora: LoraSection | None = Field(
        None,
        description="LoRA adapters (arXiv 2106.09685) on the frozen initial policy, one adapter trained across all "
        "stages (mugrpo.policy.adapters): each stage publishes and checkpoints only the adapter and its AdamW moments "
        "(a few MB at rank 16 for SmolLM2-135M instead of 1.62 GB); sampling jobs merge it into the base once per "
        "stage. Rank 1-16 matches full fine-tuning in RL at ~10x its learning rate (Schulman et al. 2025, 'LoRA "
        "Without Regret'). Cold execution only; needs peft (the lora extra). None: full fine-tuning.",
    )
    checkpoint_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="dtype of the weights and AdamW moments a checkpoint and a published policy hold. auto: "
        "bfloat16 when model.dtype is (or auto picks) bfloat16, else float32: an explicit model.dtype decides, not the "
        "machine (mugrpo.config.precision). bfloat16 "
        "halves what each stage writes (SmolLM2-135M: 0.81 instead of 1.62 GB): at every checkpoint the trainer "
        "rounds its live fp32 weights and moments to bf16 values in place (round to nearest even) before writing "
        "them, so training continues from exactly what a resume reads back (bitwise resume holds) and the next "
        "stage samples from exactly what it trains. Between checkpoints the updates stay fp32. The price is the "
        "sub-bf16 part of each checkpoint interval's update (relative 2^-9) and of the moments; the lab measures "
        "its effect on accuracy (docs/benchmarks.md, 'bf16 checkpoints').",
    )
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = Field(
        "auto",
        description="accelerate mixed precision of the training job. auto: bf16 when model.dtype is (or auto "
        "picks) bfloat16, else no: an explicit model.dtype decides, not the machine (resolved at run start; "
        "mugrpo.config.precision). bf16: "
        "torch.autocast(bfloat16) over fp32 master "
        "weights, fp32 gradients and fp32 AdamW moments (Micikevicius et al. 2018, arXiv 1710.03740, with bf16 and "
        "no loss scaling); the LM head, log-softmax, log-prob gather, loss and reductions stay fp32. On CPU, "
        "accelerate's bf16 is torch.autocast('cpu', bfloat16). fp16 is refused (loss scaling skips inf steps, "
        "which the job's NaN/inf guard stops on).",
    )
    keep_optimizer_state: int | Literal["auto", "all", "last"] = Field(
        "auto",
        json_schema_extra=OPERATIONAL,
        description="How many committed stages keep the AdamW moments (optimizer.pt, two fp32 moments per trainable "
        "parameter) of their checkpoints: 'all'; 'last' (the latest committed stage); N >= 1 (the latest N); 'auto': "
        "'all' when one checkpoint's optimizer state is under 4 GiB (a 1B-parameter fp32 AdamW state is ~8 GB), else "
        "'last', decided from the bytes of the checkpoint just committed. Once a stage commits, the moments of older "
        "stages are deleted; the policy weights and every other file stay, the checkpoint stays committed (its "
        "_COMPLETE marker records what was pruned, and `mugrpo verify` passes). The next stage always finds the "
        "moments it starts from. Pruned moments cannot be branched from or rolled back to: `mugrpo fork --at-stage K` "
        "needs those of stage K-1 and is refused without --fresh-optimizer; a resume whose next training starts from "
        "pruned moments (a rollback to before a stage older than the latest N) is refused, naming this key (redo "
        "from there with `mugrpo fork --at-stage K --fresh-optimizer`). docs/branching.md, 'Retention'. With "
        "orchestration.publish_policy_every > 1 older stages' checkpoints are deleted whole anyway. A resume may "
        "change it; a smaller value prunes at the next commit.",
    )
    python: str | None = Field(
        None, json_schema_extra=OPERATIONAL, description="Interpreter of the training job; None = this one."
    )

    @field_validator("keep_optimizer_state", mode="before")
    @classmethod
    def _retention(cls, value: Any) -> Any:
        """An integer given as text (``"2"``) is that integer; N must be >= 1 (a bool is no count)."""
        if isinstance(value, bool):
            raise ValueError(f"must be 'auto', 'all', 'last' or an integer >= 1, got {value!r}")
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, int) and value < 1:
            raise ValueError(f"must be an integer >= 1 (or 'auto', 'all', 'last'), got {value}")
        return value

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _yaml_no(cls, value: Any) -> Any:
        """YAML 1.1 reads an unquoted ``no`` (``train.mixed_precision=no``) as false: take it as 'no'."""
        return "no" if value is False else value

    @field_validator("lr_schedule")
    @classmethod
    def _known_lr_schedule(cls, name: str) -> str:
        LR_SCHEDULES[name]  # raises UnknownNameError (a ValueError) listing the registered names
        return name


class BenchmarkConfig(_Section):
    """One evaluation benchmark: dataset, subset size, k samples and sampling."""

    dataset: DatasetConfig
    num_prompts: int | None = Field(None, ge=1, description="First N problems; None = all.")
    k: int = Field(1, ge=1, description="Samples per problem for avg@k and pass@k.")
    temperature: float = Field(0.0, ge=0, description="0 = greedy.")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(256, ge=1)


class EvalSection(_Section):
    """Evaluation of each stage's policy."""

    benchmarks: list[BenchmarkConfig] = Field(default_factory=list)
    every_stage: bool = Field(True, description="Evaluate the behavior policy of every stage (else only the final).")
    every_n_stages: int = Field(
        1,
        ge=1,
        description="With every_stage: evaluate the behavior policy of stages 0, n, 2n, ... only. A run with n times "
        "more stages of 1/n the updates (standard GRPO's mu = 4 against Mu-GRPO's large stages) then evaluates the "
        "same policy versions (optimizer updates) as the run it is compared with.",
    )
    workers: int = Field(
        1,
        ge=1,
        json_schema_extra=OPERATIONAL,
        description="Evaluation workers: the benchmarks are split round-robin over this many eval jobs run at once "
        "(at most one worker per benchmark; mugrpo.coordination.fanout).",
    )
    python: str | None = Field(
        None,
        json_schema_extra=OPERATIONAL,
        description="Interpreter of the eval job, which samples with generation.engine; None = generation.python "
        "(the engine's interpreter, e.g. the vLLM virtualenv), else this one. With generation.engine: vllm a "
        "different value is refused at load: the eval job would start vLLM in an interpreter that may lack it.",
    )
