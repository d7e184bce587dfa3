"""The hook points through which the trainer and the generation worker run an algorithm that is more than a loss.

An algorithm that is only a loss (GRPO, Mu-GRPO, GSPO, ConSPO) is a function registered in
:data:`mugrpo.losses.POLICY_LOSSES`. An algorithm that also keeps state, changes what an update trains on or what a
shard samples (the replay buffer, AGPO) is a package under ``mugrpo/algorithms/`` holding three things:

- its **config section**, a pydantic model composed into the run config (and into the job specs named in
  :attr:`Algorithm.jobs`) under the algorithm's name, so ``replay.ratio=0.25`` works like any other key;
- its **state**, plain objects with ``state_dict()`` / ``load_state_dict()``, carried through every checkpoint
  (:class:`SavedState`) and every stage commit (:class:`CommitRecord`);
- a subclass of :class:`Algorithm` registered in :data:`ALGORITHMS`, whose hook objects the trainer and the
  generation worker call at the fixed places below. Neither of them names an algorithm.

The trainer (:mod:`mugrpo.trainer`), per stage, in this order::

    TrainHooks.start(StageStart)                  resume state: from the checkpoint, else the previous stage's commit
    per update u:
        TrainHooks.compose(UpdateRows)            -> rollouts added to the update's fresh minibatch
        TrainHooks.before_update(UpdateRows)      -> UpdateInputs: per-rollout loss inputs (Algorithm.inputs)
        (the optimizer update)
        TrainHooks.after_update(UpdateRows, m)    -> StepRecord: train_steps columns and loss metrics of the update
    per checkpoint:
        TrainHooks.checkpoint(CheckpointAt)       -> SavedState: JSON state and files stored in the checkpoint
    at the commit:
        TrainHooks.commit(StageCommit)            -> CommitRecord: files, counts and metrics of the job manifest
    (a stage with nothing to train on: TrainHooks.carry_over(StageCommit) -> CommitRecord, state unchanged)

The generation worker (:mod:`mugrpo.generation`), per stage, in this order::

    GenerationHooks.start(GenerationStart)        state as of the first shard still to sample
    per shard to sample:
        GenerationHooks.plan_shard(ShardToSample) -> ShardPlan: per-prompt temperatures, columns, extra groups
        GenerationHooks.scored(ScoredShard)       -> per-prompt columns set once the shard's groups are scored
    GenerationHooks.worker_metrics()              -> metrics of the worker manifest (the state at its commit)

What travels per rollout is declared, never implied (docs/algorithms/adding.md):

- :attr:`Algorithm.columns`: the rollout columns the algorithm writes (:class:`RolloutColumn`, through
  ``ShardPlan.columns`` / ``GenerationHooks.scored``) and reads back in the trainer (``RolloutRef.columns``); a
  column may mark rows the trainer never trains on (``RolloutColumn.excludes``);
- :attr:`Algorithm.inputs`: the per-rollout loss inputs it provides from ``TrainHooks.before_update``
  (``LossContext.inputs``; a loss declares what it reads with ``mugrpo.losses.requires(inputs=...)``);
- :meth:`Algorithm.stage_prompts`: the prompts a stage samples, e.g. over-sampled for dynamic sampling.

Hooks receive these small frozen contexts, never a job spec or the run config: what an algorithm reads is what its
context declares. Every hook has a no-op default, so an algorithm overrides only the points it uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, ClassVar, Literal, Protocol

import pyarrow as pa
from pydantic import BaseModel, Field

from mugrpo.commits.exclusion import excluded as excluded  # the one rule (re-exported)
from mugrpo.common.registry import Registry
from mugrpo.data.datasets import Problem
from mugrpo.engines.base import Sample, SamplingParams
from mugrpo.losses.config import PolicyLossConfig
from mugrpo.rewards import RewardInput, RewardResult
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import FileRecord


class RolloutRef(Protocol):
    """What an algorithm reads of a training rollout (:class:`mugrpo.trainer.data.Rollout` is one)."""

    @property
    def stage(self) -> int: ...
    @property
    def prompt_id(self) -> str: ...
    @property
    def sample_idx(self) -> int: ...
    @property
    def policy_version(self) -> int: ...
    @property
    def advantage(self) -> float: ...
    @property
    def zero_variance(self) -> bool: ...
    @property
    def columns(self) -> Mapping[str, Any]:
        """The row's values of the algorithms' declared columns (:attr:`Algorithm.columns`), by name."""
        ...


@dataclass(frozen=True)
class RolloutColumn:
    """A rollout column an algorithm declares (:attr:`Algorithm.columns`).

    The generation worker writes it on every row (``default`` unless a hook sets it), the rollout table stores it
    (a column of the versioned schema, or an extension column after it: :func:`mugrpo.commits.tables.table_from_rows`),
    and the trainer reads it back into ``RolloutRef.columns``.

    Attributes:
        field: its Arrow name and type.
        default: its value on rows no hook sets it on (None: NULL).
        excludes: a true value marks a row the trainer never trains on (a group sampled to plan a shard, a group
            filtered out by dynamic sampling): it stays in the table, counted apart.
    """

    field: pa.Field
    default: Any = None
    excludes: bool = False

    @property
    def name(self) -> str:
        return self.field.name


# ---------------------------------------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class Settings:
    """The settings an algorithm may constrain, as known where its section is validated: the run config (``scope``
    "run"), a train spec ("train") or a generate spec ("generate"). None: not known there."""

    scope: Literal["run", "train", "generate"]
    loss: PolicyLossConfig | None = None
    recompute_behavior_logprobs: bool | None = None
    group_minibatches: bool | None = None
    generation_workers: int | None = None


# --------------------------------------------------------------------------------------------------------- trainer


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a stage resumes from.

    Attributes:
        step: its stage update.
        trainer_state: its ``trainer_state.json`` (an algorithm's saved state is under its name).
        read_file: the bytes of a file of the checkpoint folder, or None if it has no such file.
        uri: the store URI of a file of the checkpoint folder (for messages).
    """

    step: int
    trainer_state: Mapping[str, Any]
    read_file: Callable[[str], bytes | None]
    uri: Callable[[str], str]


@dataclass(frozen=True)
class StageStart:
    """A stage's training starts (or resumes).

    Attributes:
        store, layout: the run's store and layout.
        stage: the stage being trained.
        seed: the run seed.
        rollout_stages: stages whose rollouts the stage trains on.
        rollouts: the stage's training rollouts (zero-variance groups left out when the trainer skips them).
        load_rollouts: every committed rollout of a stage (zero-variance groups kept), read and verified through
            its generate manifest.
        resume: the checkpoint being resumed, or None at the stage's start.
        is_main: this process is the main one (it alone writes files).
    """

    store: Store
    layout: RunLayout
    stage: int
    seed: int
    rollout_stages: Sequence[int]
    rollouts: Sequence[RolloutRef]
    load_rollouts: Callable[[int], Sequence[RolloutRef]]
    resume: ResumePoint | None
    is_main: bool


def _no_entropy() -> float:
    raise RuntimeError("UpdateRows.policy_entropy is available from before_update on, once the update is collated")


@dataclass(frozen=True)
class UpdateRows:
    """The rollouts of one optimizer update.

    Attributes:
        update: the global update (1-based; the policy being updated has taken ``update - 1`` steps).
        stage_update: the update within the stage (1-based).
        fresh: the update's minibatch of the stage's rollouts (every rank's, in minibatch order).
        extra: rollouts the algorithms composed into the update (empty in :meth:`TrainHooks.compose`).
        policy_entropy: token-mean entropy (nats) of the current policy over the update's response tokens on
            every rank (from :meth:`TrainHooks.before_update` on). A collective: every rank calls it, or none.
    """

    update: int
    stage_update: int
    fresh: Sequence[RolloutRef]
    extra: Sequence[RolloutRef] = ()
    policy_entropy: Callable[[], float] = field(default=_no_entropy, repr=False)


@dataclass(frozen=True)
class UpdateInputs:
    """Per-rollout inputs of the loss for one update, aligned with ``fresh + extra`` of its :class:`UpdateRows`.

    Attributes:
        values: input name (one of the algorithm's :attr:`Algorithm.inputs`) -> one value per rollout; the loss
            reads it as a [B] tensor from ``LossContext.inputs``.
    """

    values: Mapping[str, Sequence[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class StepRecord:
    """What an algorithm adds to an update's ``train_steps`` row.

    Attributes:
        columns: values of ``train_steps`` columns (``schemas.tables.TRAIN_STEP_SCHEMA``).
        metrics: entries of the row's ``loss_metrics`` map.
    """

    columns: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointAt:
    """A checkpoint of ``stage`` after stage update ``stage_update`` is being written (every rank calls the hook;
    only the main process writes)."""

    store: Store
    layout: RunLayout
    stage: int
    stage_update: int
    is_main: bool


@dataclass(frozen=True)
class SavedState:
    """An algorithm's part of a checkpoint.

    Attributes:
        state: JSON-able state, saved as ``trainer_state[name]`` (None: nothing).
        files: files saved inside the checkpoint folder, covered by its marker.
    """

    state: Mapping[str, Any] | None = None
    files: Mapping[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class StageCommit:
    """The stage's training commits (main process only).

    Attributes:
        store, layout: the run's store and layout.
        stage: the stage.
        steps: the stage's committed ``train_steps`` columns (column name -> values in update order; empty when
            the stage had nothing to train on).
    """

    store: Store
    layout: RunLayout
    stage: int
    steps: Mapping[str, Sequence[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class CommitRecord:
    """What an algorithm adds to the stage's train job manifest: its files, counts and metrics."""

    files: Sequence[FileRecord] = ()
    counts: Mapping[str, int] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)


class TrainHooks:
    """An algorithm's side of the trainer: one object per :class:`mugrpo.trainer.loop.Trainer`, kept across the
    stages it trains (a warm segment trains many), so it may cache what later stages reuse. Every method is a
    no-op until overridden."""

    def start(self, ctx: StageStart) -> None:
        """A stage starts: restore the state from ``ctx.resume``, else from the previous stage's commit."""

    def compose(self, rows: UpdateRows) -> Sequence[RolloutRef]:
        """Rollouts to train on in this update besides ``rows.fresh`` (each its own group)."""
        return ()

    def before_update(self, rows: UpdateRows) -> UpdateInputs | None:
        """Per-rollout loss inputs of the update, computed before it (None: none)."""
        return None

    def after_update(self, rows: UpdateRows, metrics: Mapping[str, float]) -> StepRecord:
        """Record the update (``metrics``: the loss's reduced metrics of it); returns what goes into its row."""
        return StepRecord()

    def checkpoint(self, ctx: CheckpointAt) -> SavedState:
        """What the checkpoint of ``ctx.stage_update`` keeps of the algorithm (the main process writes it)."""
        return SavedState()

    def commit(self, ctx: StageCommit) -> CommitRecord:
        """The algorithm's files, counts and metrics in the stage's train job manifest."""
        return CommitRecord()

    def carry_over(self, ctx: StageCommit) -> CommitRecord:
        """The stage had nothing to train on: carry the previous stage's state over unchanged."""
        return CommitRecord()


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


# ----------------------------------------------------------------------------------------------------------- audit

#: ``rows(sql) -> [row dict, ...]``: a DuckDB query over one run's views (rollouts, train_steps, evals, and each
#: algorithm's tables), as :mod:`mugrpo.audit` runs it.
RunQuery = Callable[[str], list[dict[str, Any]]]


@dataclass(frozen=True)
class AuditFindings:
    """An algorithm's evidence for the harness audit's batches check (:mod:`mugrpo.audit.batches`; "Probe the
    Harness", arXiv 2610.02911), read from its own tables.

    Attributes:
        problems: failing findings (e.g. a replay queue drawing the same rollouts update after update).
        notes: passing evidence, shown in the check's detail.
    """

    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def longest_repeat(ids: Sequence[tuple[int, str]]) -> tuple[int, int, str]:
    """(length, first update, id) of the longest run of equal consecutive ids in ``[(update, id), ...]``
    ((0, 0, "") when empty)."""
    best: tuple[int, int, str] = (0, 0, "")
    for ident, members in groupby(ids, key=lambda x: x[1]):
        members = list(members)
        if len(members) > best[0]:
            best = (len(members), members[0][0], ident)
    return best


# ------------------------------------------------------------------------------------------------------- algorithm


class Algorithm:
    """An algorithm package's entry point, registered in :data:`ALGORITHMS` under :attr:`name`.

    Class attributes:
        name: the config section's key, the registry name and the key of its state in checkpoints.
        section: the config section's pydantic model.
        optional: True: the section defaults to None (the algorithm is off unless the section is given); False:
            to ``section()`` (the section has its own switch, e.g. ``enabled``).
        jobs: the job specs that carry the section besides the run config ("train", "generate").
        description: the section's one-line description in the config reference.
        columns: the rollout columns it declares (:class:`RolloutColumn`), written on every rollout row.
        inputs: the per-rollout loss inputs its trainer hooks provide (``UpdateInputs.values`` keys).
    """

    name: ClassVar[str]
    section: ClassVar[type[BaseModel]]
    optional: ClassVar[bool] = True
    jobs: ClassVar[frozenset[str]] = frozenset({"train"})
    description: ClassVar[str] = ""
    columns: ClassVar[tuple[RolloutColumn, ...]] = ()
    inputs: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def stage_prompts(cls, section: Any, prompts: int) -> int:
        """The prompts a stage samples when the stage schedule asks for ``prompts`` (e.g. more, for dynamic
        sampling to filter down to ``prompts`` groups); the section is None or off: ``prompts``."""
        return prompts

    @classmethod
    def check(cls, section: Any, settings: Settings) -> None:
        """Refuse settings the algorithm cannot run with.

        Raises:
            ValueError: naming the config keys in conflict.
        """

    @classmethod
    def train_hooks(cls, section: Any, loss: PolicyLossConfig) -> TrainHooks | None:
        """The algorithm's trainer hooks for a run with this section and loss, or None when it is off there."""
        return None

    @classmethod
    def generation_hooks(cls, section: Any) -> GenerationHooks | None:
        """The algorithm's hooks for one stage of a generation worker, or None when it is off there."""
        return None

    @classmethod
    def audit_batches(cls, section: Any, rows: RunQuery, max_repeat: int) -> AuditFindings | None:
        """The algorithm's own batch evidence for the harness audit (no batch served more than ``max_repeat``
        times in a row), or None when it has none or is off in the run."""
        return None

    @classmethod
    def audit_order(cls, section: Any, rows: RunQuery) -> list[str]:
        """Lines of the run's data order that the algorithm decides (e.g. each update's replay draw), added to the
        audit's data-order fingerprint (:mod:`mugrpo.audit.data_order`); [] when none or off."""
        return []


#: Algorithms by config section name; add one with ``@ALGORITHMS.register("name")`` on its :class:`Algorithm`.
ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")


# --------------------------------------------------------------------------------------------- sections and hooks


def section_fields(job: str | None = None) -> dict[str, tuple[Any, Any]]:
    """Field definitions (``pydantic.create_model`` style) of the registered algorithms' config sections: every
    one (``job`` None: the run config) or those ``job``'s spec carries ("train", "generate")."""
    fields: dict[str, tuple[Any, Any]] = {}
    for name in ALGORITHMS:
        algorithm = ALGORITHMS[name]
        if job is not None and job not in algorithm.jobs:
            continue
        if algorithm.optional:
            fields[name] = (algorithm.section | None, Field(None, description=algorithm.description))
        else:
            fields[name] = (
                algorithm.section,
                Field(default_factory=algorithm.section, description=algorithm.description),
            )
    return fields


def sections_of(settings: Any, job: str | None = None) -> dict[str, Any]:
    """The algorithm sections of a run config or job spec ``settings`` (read by name), those ``job`` carries."""
    return {name: getattr(settings, name) for name in ALGORITHMS if job is None or job in ALGORITHMS[name].jobs}


def check_sections(sections: Mapping[str, Any], settings: Settings) -> None:
    """Every algorithm's :meth:`Algorithm.check` of its section against ``settings``.

    Raises:
        ValueError: from the first algorithm that refuses them.
    """
    for name, section in sections.items():
        ALGORITHMS[name].check(section, settings)


def make_train_hooks(sections: Mapping[str, Any], loss: PolicyLossConfig) -> dict[str, TrainHooks]:
    """The trainer hooks of the algorithms on in a run with these sections and loss, by name."""
    hooks = {}
    for name, section in sections.items():
        made = ALGORITHMS[name].train_hooks(section, loss)
        if made is not None:
            hooks[name] = made
    return hooks


def make_generation_hooks(sections: Mapping[str, Any]) -> list[GenerationHooks]:
    """The generation hooks of the algorithms on in a stage with these sections."""
    made = (ALGORITHMS[name].generation_hooks(section) for name, section in sections.items())
    return [hooks for hooks in made if hooks is not None]


def declared_columns() -> list[RolloutColumn]:
    """Every registered algorithm's declared rollout columns, in registry order.

    Raises:
        ValueError: two algorithms declare one column name with different types.
    """
    seen: dict[str, RolloutColumn] = {}
    for name in ALGORITHMS:
        for column in ALGORITHMS[name].columns:
            other = seen.get(column.name)
            if other is not None and other.field.type != column.field.type:
                raise ValueError(f"algorithm {name} declares rollout column {column.name!r} with another type")
            seen.setdefault(column.name, column)
    return list(seen.values())


def excluding_columns() -> list[str]:
    """The declared columns with ``excludes`` set: a row where one is true is never trained on."""
    return [c.name for c in declared_columns() if c.excludes]


def provided_inputs(sections: Mapping[str, Any], loss: PolicyLossConfig) -> set[str]:
    """The loss inputs the algorithms on in a run (those whose :meth:`Algorithm.train_hooks` are not None)
    provide."""
    return {
        i
        for name, section in sections.items()
        if ALGORITHMS[name].train_hooks(section, loss) is not None
        for i in ALGORITHMS[name].inputs
    }


def stage_prompts(sections: Mapping[str, Any], prompts: int) -> int:
    """The prompts a stage samples for a schedule's ``prompts``, after every algorithm's
    :meth:`Algorithm.stage_prompts`."""
    for name, section in sections.items():
        prompts = ALGORITHMS[name].stage_prompts(section, prompts)
    return prompts
