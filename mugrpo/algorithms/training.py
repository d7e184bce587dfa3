"""The trainer's hook points (:class:`TrainHooks`) and the frozen contexts they receive, in the order the trainer
calls them (:mod:`mugrpo.algorithms.base`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mugrpo.algorithms.contracts import RolloutRef
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import FileRecord

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

    #: Whether :meth:`compose` changes the algorithm's state (a replay buffer's eviction). An update whose compose
    #: changed state is never dropped on a preemption notice: it runs to its end (:mod:`mugrpo.trainer.preemption`).
    compose_changes_state: ClassVar[bool] = False

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
