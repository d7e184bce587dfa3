"""Stage schedules: how many prompts each stage samples and how many optimizer updates it trains for.

A run is K stages (``run.num_stages``). A stage schedule maps a stage index to its size; everything that depends on
the sizes (which prompts a stage draws, the policy version it starts from, the LR schedule's horizon) is derived
from it here, in one place, by :func:`stage_plan` and :func:`total_updates`.

- ``constant`` (default): every stage samples ``generation.prompts_per_stage`` prompts and trains
  ``train.updates_per_stage`` updates. Mu-GRPO is 4 stages x 1024 updates; the standard GRPO baseline is the same
  schedule with many stages of 4 updates (arXiv 2605.17570, Table 1).
- ``per_stage``: explicit lists ``run.stage_schedule.prompts`` and ``run.stage_schedule.updates``, one entry per
  stage (an empty list falls back to the constant value). Use it for staleness ablations, e.g. a large first stage.

Add a schedule with ``@STAGE_SCHEDULES.register("name")`` on ``fn(inputs, stage) -> StageSize``; it reads the
run's :class:`ScheduleInputs`, which the run config gives (:meth:`mugrpo.config.Config.schedule_inputs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from mugrpo.common.registry import Registry


class StageScheduleConfig(BaseModel):
    """Which stage schedule a run follows (``run.stage_schedule``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: str = Field(
        "constant",
        description="Registry key: 'constant' (every stage prompts_per_stage prompts, updates_per_stage updates; "
        "Mu-GRPO's 4 x 1024 and GRPO's many x 4, arXiv 2605.17570) or 'per_stage' (the lists below).",
    )
    prompts: list[int] = Field(
        default_factory=list,
        description="per_stage: prompts of each stage (one entry per stage); empty = generation.prompts_per_stage.",
    )
    updates: list[int] = Field(
        default_factory=list,
        description="per_stage: optimizer updates of each stage (its staleness mu); empty = train.updates_per_stage.",
    )


@dataclass(frozen=True)
class StageSize:
    """What one stage does: ``prompts`` groups sampled, then ``updates`` optimizer updates on them."""

    prompts: int
    updates: int


@dataclass(frozen=True)
class StagePlan:
    """Stage ``stage`` placed in its run.

    Attributes:
        stage: 0-based stage index.
        prompt_start: position of its first prompt in the seed-fixed prompt order (prompts of earlier stages).
        num_prompts: prompts (groups) it samples.
        policy_version: optimizer updates done before it (the version of its behavior policy).
        updates: optimizer updates it trains for.
    """

    stage: int
    prompt_start: int
    num_prompts: int
    policy_version: int
    updates: int


@dataclass(frozen=True)
class ScheduleInputs:
    """What a stage schedule reads of a run config.

    Attributes:
        schedule: ``run.stage_schedule``.
        num_stages: ``run.num_stages``.
        prompts_per_stage: ``generation.prompts_per_stage``.
        updates_per_stage: ``train.updates_per_stage``.
        sampled_prompts: the prompts a stage samples when the schedule gives it ``n`` (the algorithms'
            ``Algorithm.stage_prompts``, e.g. dynamic sampling's over-sampling); identity by default.
    """

    schedule: StageScheduleConfig
    num_stages: int
    prompts_per_stage: int
    updates_per_stage: int
    sampled_prompts: Callable[[int], int] = lambda n: n


class Scheduled(Protocol):
    """A run config, as far as the stage plan needs it (:class:`mugrpo.config.Config` is one)."""

    def schedule_inputs(self) -> ScheduleInputs: ...


StageScheduleFn = Callable[[ScheduleInputs, int], StageSize]
"""``fn(inputs, stage) -> StageSize``; must raise ValueError naming the config field when it cannot size a stage."""

STAGE_SCHEDULES: Registry[StageScheduleFn] = Registry("stage schedule")
"""Stage schedules by ``run.stage_schedule.name``."""


@STAGE_SCHEDULES.register("constant")
def constant_schedule(inputs: ScheduleInputs, stage: int) -> StageSize:
    """Every stage the same size (Mu-GRPO, arXiv 2605.17570: K stages x mu updates)."""
    return StageSize(inputs.prompts_per_stage, inputs.updates_per_stage)


@STAGE_SCHEDULES.register("per_stage")
def per_stage_schedule(inputs: ScheduleInputs, stage: int) -> StageSize:
    """Sizes from ``run.stage_schedule.prompts`` / ``.updates``, one entry per stage.

    Raises:
        ValueError: a list is non-empty but its length is not ``run.num_stages``, or an entry is < 1.
    """
    sched, k = inputs.schedule, inputs.num_stages
    sizes = []
    for field, values, default in (
        ("prompts", sched.prompts, inputs.prompts_per_stage),
        ("updates", sched.updates, inputs.updates_per_stage),
    ):
        if values and len(values) != k:
            raise ValueError(
                f"run.stage_schedule.{field} has {len(values)} entries but run.num_stages is {k}; give one per stage"
            )
        if any(v < 1 for v in values):
            raise ValueError(f"run.stage_schedule.{field} entries must be >= 1, got {values}")
        sizes.append(values[stage] if values else default)
    return StageSize(*sizes)


def stage_sizes(cfg: Scheduled) -> list[StageSize]:
    """The size of every stage of ``cfg`` (length ``run.num_stages``).

    Raises:
        UnknownNameError: ``run.stage_schedule.name`` is not registered.
        ValueError: the schedule cannot size a stage (the message names the config field).
    """
    inputs = cfg.schedule_inputs()
    fn = STAGE_SCHEDULES[inputs.schedule.name]
    sizes = [fn(inputs, k) for k in range(inputs.num_stages)]
    return [dataclasses.replace(s, prompts=inputs.sampled_prompts(s.prompts)) for s in sizes]


def stage_plan(cfg: Scheduled, stage: int) -> StagePlan:
    """Stage ``stage`` of ``cfg``: its prompt range, behavior-policy version and update count.

    ``stage`` may be ``run.num_stages`` (the final evaluation's policy): then ``num_prompts`` and ``updates`` are 0
    and ``policy_version`` is the run's total.

    Raises:
        ValueError: ``stage`` is outside [0, run.num_stages], or the schedule cannot size a stage.
    """
    sizes = stage_sizes(cfg)
    if not 0 <= stage <= len(sizes):
        raise ValueError(f"stage {stage} is outside [0, {len(sizes)}] (run.num_stages={len(sizes)})")
    done = sizes[:stage]
    here = sizes[stage] if stage < len(sizes) else StageSize(0, 0)
    return StagePlan(
        stage=stage,
        prompt_start=sum(s.prompts for s in done),
        num_prompts=here.prompts,
        policy_version=sum(s.updates for s in done),
        updates=here.updates,
    )


def total_updates(cfg: Scheduled) -> int:
    """Optimizer updates of the whole run (the horizon of the LR schedule)."""
    return sum(s.updates for s in stage_sizes(cfg))
