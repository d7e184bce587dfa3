"""The generation job's spec (:data:`GenerateSpec`) and its error."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, create_model, field_validator, model_validator

from mugrpo.algorithms import Settings, check_sections, section_fields, sections_of
from mugrpo.common.dtypes import refuse_auto
from mugrpo.coordination.jobspec import JobSpec
from mugrpo.data.datasets import DatasetConfig
from mugrpo.data.prompts import PromptConfig
from mugrpo.engines.base import SamplingParams
from mugrpo.rewards import RewardConfig
from mugrpo.schedules.stages import stage_plan
from mugrpo.scoring.advantages import AdvantageConfig


class GenerationError(RuntimeError):
    """A shard failed (engine exception, out of memory) or cannot be resumed; nothing was committed for it."""


class _GenerateSpecCore(JobSpec):
    """Everything the generation job of one stage needs."""

    policy_version: int = Field(0, ge=0, description="Optimizer updates before this stage's behavior policy.")
    policy_dir: str = Field(description="Store path of the behavior policy (HF dir), usually policies/stage={k}.")
    dataset: DatasetConfig
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    prompt_start: int = Field(0, ge=0, description="First index into the seed-shuffled prompt order.")
    num_prompts: int = Field(ge=1, description="Prompts this stage samples (wrapping around the dataset).")
    shard_size: int = Field(16, ge=1, description="Prompts per Parquet shard.")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    temperatures: dict[str, float] | None = Field(
        None, description="Per-prompt sampling temperature by prompt_id (None: sampling.temperature for all)."
    )
    engine: str = "transformers"
    engine_kwargs: dict = Field(default_factory=dict)
    dtype: str = Field("float32", description="The engine's weight dtype: concrete, never auto (model.dtype resolved).")
    reward: RewardConfig = Field(default_factory=RewardConfig)
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    on_bad_prompt: Literal["skip", "error"] = "skip"
    max_context: int | None = Field(None, description="Prompt + response token limit; None = the model's.")
    workers: int = Field(1, ge=1, description="Generation workers of the stage (generation.workers).")
    worker: int = Field(0, ge=0, description="This worker's index w: it samples shards w, w + workers, ...")
    reuse_rollouts_of: str | None = Field(
        None,
        description="A run id whose committed responses of this stage are re-scored instead of sampled (a fork's "
        "parent with run.parent.reuse_rollouts; mugrpo.generation.stored). None: sample with the engine.",
    )

    @field_validator("dtype")
    @classmethod
    def _concrete_dtype(cls, dtype: str) -> str:
        return refuse_auto("dtype", dtype)

    @model_validator(mode="after")
    def _worker_in_range(self) -> _GenerateSpecCore:
        if self.worker >= self.workers:
            raise ValueError(f"worker {self.worker} of {self.workers}: the worker index must be < workers")
        check_sections(sections_of(self, "generate"), Settings(scope="generate", generation_workers=self.workers))
        return self

    @classmethod
    def from_config(cls, cfg, stage: int, policy_version: int) -> _GenerateSpecCore:
        """The spec of stage ``stage`` of run config ``cfg`` (a :class:`mugrpo.config.Config`; ``auto`` precision is
        resolved on this machine if the run has not resolved it: :func:`mugrpo.config.precision.concrete`)."""
        from mugrpo.config.precision import concrete
        from mugrpo.config.threads import engine_options

        cfg = concrete(cfg)
        g = cfg.generation
        plan = stage_plan(cfg, stage)
        return cls(
            **cls.run_fields(cfg, stage),
            policy_version=policy_version,
            policy_dir=cfg.layout.policy_dir(stage),
            dataset=cfg.data.train,
            prompt=cfg.data.prompt,
            prompt_start=plan.prompt_start,
            num_prompts=plan.num_prompts,
            shard_size=g.shard_size,
            sampling=g.sampling,
            engine=g.engine,
            engine_kwargs=engine_options(cfg, "generate"),
            dtype=cfg.model.dtype,
            reward=cfg.reward,
            advantage=cfg.advantage,
            on_bad_prompt=cfg.data.on_bad_prompt,
            max_context=cfg.model.max_context,
            workers=g.workers,
            reuse_rollouts_of=(
                cfg.run.parent.run_id
                if cfg.run.parent and cfg.run.parent.reuse_rollouts and stage == cfg.run.parent.stage
                else None
            ),
            **sections_of(cfg, "generate"),
        )


#: The generation job's spec: the fields above, then the config section of each registered algorithm the
#: generation worker runs (:func:`mugrpo.algorithms.section_fields`).
GenerateSpec = create_model(
    "GenerateSpec",
    __base__=_GenerateSpecCore,
    __module__=__name__,
    __doc__=_GenerateSpecCore.__doc__,
    **section_fields("generate"),
)
