"""The generation worker's hook points (:class:`GenerationHooks`) and the frozen contexts they receive, in the order
the worker calls them (:mod:`mugrpo.algorithms.base`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mugrpo.data.datasets import Problem
from mugrpo.engines.base import Sample, SamplingParams
from mugrpo.rewards import RewardInput, RewardResult
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store

# ------------------------------------------------------------------------------------------------------ generation


@dataclass(frozen=True)
class GenerationStart:
    """A generation worker starts (or resumes) its share of a stage.

    Attributes:
        store, layout: the run's store and layout.
        stage: the stage.
        num_shards: shards of the stage.
        todo: the shards this worker still samples, in order (the others are committed or another worker's).
    """

    store: Store
    layout: RunLayout
    stage: int
    num_shards: int
    todo: Sequence[int]


@dataclass(frozen=True)
class ShardToSample:
    """A shard about to be sampled.

    Attributes:
        stage, shard: where it is.
        seed: the run seed.
        problems: the shard's prompts, in order (each a :class:`mugrpo.data.datasets.Problem`: its id, gold answer and,
            for reasoning-gym data, the task entry that scores it; ``RewardInput.for_problem`` builds a reward
            input from one).
        sampling: the stage's sampling params.
        dispersion: ``advantage.dispersion``, the reward dispersion measure.
        sample: samples the shard's prompts with the given params (outer: prompt; inner: sample); raises the
            generation job's error when the engine fails.
        score: the verifier pool's rewards of the given responses.
    """

    stage: int
    shard: int
    seed: int
    problems: Sequence[Problem]
    sampling: SamplingParams
    dispersion: str
    sample: Callable[[SamplingParams], list[list[Sample]]]
    score: Callable[[list[RewardInput]], list[RewardResult]]


@dataclass(frozen=True)
class ShardPlan:
    """How to sample and record one shard.

    Attributes:
        temperatures: per prompt, the temperature of its training group (None: the stage's).
        columns: per prompt, declared columns set on each of its rows (training and extra rows).
        extra_params: sampling params of the extra groups.
        extra_samples, extra_results: per prompt, a group sampled and scored to plan the shard (AGPO's probes),
            written as rows after the shard's training rows.
        extra_columns: per prompt, declared columns set on its extra rows only (on top of ``columns``); a column
            with ``excludes`` set true there keeps them out of training.
    """

    temperatures: tuple[float, ...] | None = None
    columns: Sequence[Mapping[str, Any]] = ()
    extra_params: SamplingParams | None = None
    extra_samples: Sequence[Sequence[Sample]] = ()
    extra_results: Sequence[Sequence[RewardResult]] = ()
    extra_columns: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class ScoredShard:
    """A shard's training groups, sampled and scored, before its rows are written.

    Attributes:
        stage, shard: where it is.
        prompt_ids: the shard's prompts, in order.
        rewards: per prompt, its group's rewards.
        zero_variance: per prompt, whether its group's rewards are all equal (no learning signal).
    """

    stage: int
    shard: int
    prompt_ids: Sequence[str]
    rewards: Sequence[Sequence[float]]
    zero_variance: Sequence[bool]


class GenerationHooks:
    """An algorithm's side of one generation worker's share of a stage (one object per stage). Every method is a
    no-op until overridden."""

    def start(self, ctx: GenerationStart) -> None:
        """Restore the state as of the first shard still to sample.

        Raises:
            ValueError: the committed data cannot give that state (the message says what to delete).
        """

    def plan_shard(self, shard: ShardToSample) -> ShardPlan | None:
        """Plan the shard before it is sampled (None: sample it as configured)."""
        return None

    def scored(self, shard: ScoredShard) -> Sequence[Mapping[str, Any]] | None:
        """Per prompt of the scored shard, declared columns to set on its training rows (None: none). Dynamic
        sampling filters here: a declared ``excludes`` column set true keeps a group out of training."""
        return None

    def worker_metrics(self) -> dict[str, float]:
        """Metrics of the worker manifest: the algorithm's state once the worker's shards are committed."""
        return {}
