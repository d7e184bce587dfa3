"""The training job's spec: everything ``python -m mugrpo.jobs.train SPEC`` needs, as one JSON document."""

from __future__ import annotations

from typing import Any

from pydantic import Field, create_model, field_validator, model_validator

from mugrpo.algorithms import Settings, check_sections, section_fields, sections_of
from mugrpo.common.dtypes import refuse_auto
from mugrpo.config import Config, TrainSection
from mugrpo.config.precision import concrete
from mugrpo.coordination.jobspec import JobSpec
from mugrpo.losses.config import PolicyLossConfig
from mugrpo.losses.registry import check_trainer_settings
from mugrpo.schedules.stages import stage_plan, total_updates

#: What a training spec's precision keys hold when its ``train`` section, given as a mapping (a bench, a test, the
#: spec's JSON), leaves them out: fp32, as :class:`~mugrpo.generation.GenerateSpec`'s ``dtype`` defaults to float32.
#: ``auto`` is refused: it exists in the config layer alone (:mod:`mugrpo.config.precision`).
SPEC_PRECISION: dict[str, Any] = {
    "mixed_precision": "no",
    "checkpoint_dtype": "float32",
    "recompute_behavior_logprobs": False,
}


class _TrainSpecCore(JobSpec):
    """The training job of one stage (docs/design.md, "Shape"): many optimizer updates on a static rollout set.

    Staleness (Mu-GRPO, arXiv 2605.17570: mu = updates per rollout refresh) of stage update u (1-based) is the
    number of optimizer updates between the policy that sampled a rollout and the policy being updated:
    ``(policy_version + u - 1) - rollout.policy_version``; for this stage's own rollouts that is ``u - 1``.
    """

    policy_version: int = Field(
        ge=0, description="Global optimizer updates done before this stage (the behavior policy's version)."
    )
    policy_dir: str | None = Field(
        None, description="Store path of the behavior policy (HF dir); None = policies/stage={stage}."
    )
    output_policy_dir: str | None = Field(
        None, description="Store path the trained policy is published to; None = policies/stage={stage + 1}."
    )
    publish_policy: bool = Field(
        True,
        description="Publish the trained policy at output_policy_dir. False (orchestration.publish_policy_every > 1) "
        "leaves the stage's final checkpoint as the next stage's behavior policy "
        "(mugrpo.orchestration.runs.behavior_policy_dir).",
    )
    rollout_stages: list[int] = Field(
        default_factory=list,
        description="Stages whose rollouts to train on; empty = [stage]. More than one stage is the data source a "
        "rollout-level replay buffer draws from (arXiv 2606.04560).",
    )
    reference_policy_dir: str | None = Field(
        None,
        description="Store path of the reference policy of the KL penalty; loaded only when loss.kl_coef > 0. "
        "None = policies/stage=0 (the initial policy, as in GRPO, arXiv 2402.03300).",
    )
    max_response_len: int | None = Field(
        None, ge=1, description="Dr. GRPO's constant normalizer (arXiv 2503.20783): the sampler's max_new_tokens."
    )
    total_updates: int | None = Field(
        None,
        ge=1,
        description="Updates of the whole run, the horizon of the cosine/linear LR schedule; None = "
        "policy_version + train.updates_per_stage (the schedule ends with this stage).",
    )
    carry_optimizer_state: bool = Field(
        True,
        description="Start AdamW's moments from the previous stage's final checkpoint, so a staged run optimizes "
        "like one continuous run (verl keeps its optimizer across steps); falls back to fresh moments when that "
        "checkpoint is gone, and refuses (OptimizerStatePruned) when train.keep_optimizer_state pruned its moments.",
    )
    keep_checkpoints: int = Field(1, ge=1, description="Complete checkpoints kept per stage (older ones deleted).")
    train: TrainSection = Field(
        default_factory=lambda: TrainSection(**SPEC_PRECISION),
        description="The train section with concrete precision (SPEC_PRECISION where a mapping leaves it out).",
    )
    loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig)

    @field_validator("train", mode="before")
    @classmethod
    def _concrete_precision(cls, train: Any) -> Any:
        """Refuse ``auto`` in the precision keys (a :class:`TrainSection` comes from a config: resolve it first,
        :func:`mugrpo.config.precision.concrete`); a mapping that leaves them out gets :data:`SPEC_PRECISION`."""
        if isinstance(train, TrainSection):
            given = {name: getattr(train, name) for name in SPEC_PRECISION}
        elif isinstance(train, dict):
            given = {name: train[name] for name in SPEC_PRECISION if name in train}
            train = {**SPEC_PRECISION, **train}
        else:
            return train  # pydantic refuses it
        for name, value in given.items():
            refuse_auto(f"train.{name}", value)
        return train

    @model_validator(mode="after")
    def _defaults(self) -> _TrainSpecCore:
        layout = self.layout
        if not self.rollout_stages:
            self.rollout_stages = [self.stage]
        bad = [s for s in self.rollout_stages if not 0 <= s <= self.stage]
        if bad:
            raise ValueError(f"rollout_stages {bad} must lie in [0, stage={self.stage}]")
        if self.policy_dir is None:
            self.policy_dir = layout.policy_dir(self.stage)
        if self.output_policy_dir is None:
            self.output_policy_dir = layout.policy_dir(self.stage + 1)
        if self.reference_policy_dir is None:
            self.reference_policy_dir = layout.policy_dir(0)
        if self.total_updates is None:
            self.total_updates = self.policy_version + self.train.updates_per_stage
        if self.train.micro_batch_size > self.train.rollouts_per_update:
            raise ValueError(
                f"train.micro_batch_size ({self.train.micro_batch_size}) must be <= train.rollouts_per_update "
                f"({self.train.rollouts_per_update})"
            )
        check_trainer_settings(self.loss, group_minibatches=self.train.group_minibatches)
        settings = Settings(
            scope="train",
            loss=self.loss,
            recompute_behavior_logprobs=self.train.recompute_behavior_logprobs,
            group_minibatches=self.train.group_minibatches,
        )
        check_sections(sections_of(self, "train"), settings)
        if self.train.mixed_precision == "fp16":
            raise ValueError(
                "train.mixed_precision=fp16 is not supported: fp16 loss scaling meets inf gradients by design and "
                "skips those steps, which this job's NaN/inf guard would stop on; use bf16"
            )
        if self.train.recompute_behavior_logprobs and self.rollout_stages != [self.stage]:
            raise ValueError(
                "train.recompute_behavior_logprobs recomputes with this stage's behavior policy, so rollout_stages "
                f"must be [{self.stage}], got {self.rollout_stages}"
            )
        return self

    @classmethod
    def from_config(cls, cfg: Config, stage: int, policy_version: int) -> _TrainSpecCore:
        """The training spec of stage ``stage`` of run config ``cfg``; the LR schedule spans all stages.

        ``train.updates_per_stage`` is this stage's update count from ``run.stage_schedule``; ``auto`` precision is
        resolved as in :func:`mugrpo.config.precision.concrete`.
        """
        cfg = concrete(cfg)
        updates = stage_plan(cfg, stage).updates
        parent = cfg.run.parent  # a fork's first stage may start from fresh AdamW moments (docs/branching.md)
        return cls(
            **cls.run_fields(cfg, stage),
            policy_version=policy_version,
            max_response_len=cfg.generation.sampling.max_new_tokens,
            total_updates=total_updates(cfg),
            train=cfg.train.model_copy(update={"updates_per_stage": updates}),
            carry_optimizer_state=not (parent is not None and parent.fresh_optimizer and stage == parent.stage),
            loss=cfg.loss,
            **sections_of(cfg, "train"),
        )


#: The training job's spec: the fields above, then the config section of each registered algorithm the trainer runs
#: (:func:`mugrpo.algorithms.section_fields`).
TrainSpec = create_model(
    "TrainSpec", __base__=_TrainSpecCore, __module__=__name__, __doc__=_TrainSpecCore.__doc__, **section_fields("train")
)
