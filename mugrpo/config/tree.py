"""The composed run config: the core sections, one section per registered algorithm, and the checks that span
sections."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import Field, create_model, field_validator, model_validator

from mugrpo.algorithms import Settings, check_sections, sampled_prompts, section_fields, sections_of
from mugrpo.config.base import _Section
from mugrpo.config.jobs import EvalSection, GenerationSection, TrainSection
from mugrpo.config.operations import OrchestrationSection, TrackingSection
from mugrpo.config.run import DataSection, ModelSection, RunSection
from mugrpo.config_keys import OPERATIONAL
from mugrpo.data.gym import check_reward_source
from mugrpo.losses.config import PolicyLossConfig
from mugrpo.policy.adapters import require_peft
from mugrpo.rewards import RewardConfig
from mugrpo.schedules.stages import ScheduleInputs, stage_sizes
from mugrpo.scoring.advantages import AdvantageConfig
from mugrpo.storage.layout import RunLayout


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
                    "module, and a LoRA policy is sampled from its merged weights (mugrpo.policy.adapters)"
                )
            try:
                require_peft()
            except ImportError as e:  # a config error like any other (one line from the CLI), not a traceback
                raise ValueError(str(e)) from e
        return self

    @property
    def layout(self) -> RunLayout:
        """The run's storage layout (:class:`mugrpo.storage.layout.RunLayout`), a fork's naming its parent."""
        parent = self.run.parent
        if parent is None:
            return RunLayout(self.run.id)
        return RunLayout(self.run.id, parent=parent.run_id, fork_stage=parent.stage)

    def schedule_inputs(self) -> ScheduleInputs:
        """What the stage schedule reads of this config (:func:`mugrpo.schedules.stages.stage_plan`)."""
        return ScheduleInputs(
            schedule=self.run.stage_schedule,
            num_stages=self.run.num_stages,
            prompts_per_stage=self.generation.prompts_per_stage,
            updates_per_stage=self.train.updates_per_stage,
            sampled_prompts=functools.partial(sampled_prompts, sections_of(self)),
        )

    def algorithm_settings(self) -> Settings:
        """What the algorithms' checks see of this config (:meth:`mugrpo.algorithms.Algorithm.check`)."""
        return Settings(
            scope="run",
            loss=self.loss,
            recompute_behavior_logprobs=self.train.recompute_behavior_logprobs is True,  # auto: checked resolved
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
