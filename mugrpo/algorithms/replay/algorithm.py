"""Rollout-level replay-buffer GRPO (arXiv 2606.04560) behind the trainer's hook points.

State and where it lives:

- the buffer (:class:`~mugrpo.algorithms.replay.buffer.ReplayBuffer`): saved in every checkpoint as
  ``replay_buffer.parquet`` and at every stage commit as ``replay_buffer/stage=k/buffer.parquet``
  (:mod:`mugrpo.algorithms.replay.state`); a stage starts from its checkpoint, else from the previous commit;
- the rows its entries reference: this stage's rollouts, and earlier stages' read by reference from their committed
  Parquet (kept across the stages of a warm segment, re-read when missing);
- the ``replay`` audit table (:mod:`mugrpo.algorithms.replay.records`) and the replay columns of ``train_steps``.

Per update (:mod:`mugrpo.algorithms.replay.session`): :meth:`ReplayTrainHooks.compose` evicts and draws the replayed
rollouts, the trainer trains on fresh + replayed, :meth:`ReplayTrainHooks.after_update` inserts the fresh rollouts
and returns the row's replay columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mugrpo.algorithms.auditing import AuditFindings, RunQuery
from mugrpo.algorithms.base import Algorithm
from mugrpo.algorithms.contracts import RolloutRef, Settings
from mugrpo.algorithms.registry import ALGORITHMS
from mugrpo.algorithms.replay import audit
from mugrpo.algorithms.replay.buffer import RolloutKey
from mugrpo.algorithms.replay.config import ReplayConfig
from mugrpo.algorithms.replay.records import audit_part_records, delete_audit_parts_after, write_audit_part
from mugrpo.algorithms.replay.session import StageReplay, UpdateBatch, rollout_key
from mugrpo.algorithms.replay.state import (
    CHECKPOINT_FILE,
    buffer_from_bytes,
    buffer_to_bytes,
    read_stage_buffer,
    write_stage_buffer,
)
from mugrpo.algorithms.training import (
    CheckpointAt,
    CommitRecord,
    SavedState,
    StageCommit,
    StageStart,
    StepRecord,
    TrainHooks,
    UpdateRows,
)
from mugrpo.common.seeds import derive_seed
from mugrpo.losses.config import PolicyLossConfig


class ReplayTrainHooks(TrainHooks):
    """The buffer during training: one per trainer, so the rows of earlier stages stay loaded across a warm
    segment's stages.

    Args:
        config: the ``replay`` section.
    """

    compose_changes_state = True  # compose evicts stale entries from the buffer

    def __init__(self, config: ReplayConfig) -> None:
        self.config = config
        #: Rollouts the buffer may reference, by stage (kept across warm stages; re-read when missing).
        self._rows: dict[int, dict[RolloutKey, RolloutRef]] = {}
        self._session: StageReplay | None = None
        self._batch: UpdateBatch | None = None  # the current update's composition
        self._audit: list[dict] = []  # audit rows of the updates since the last checkpoint
        self._run_id, self._stage = "", 0

    @property
    def session(self) -> StageReplay:
        if self._session is None:
            raise RuntimeError("replay hooks called before start()")
        return self._session

    def start(self, ctx: StageStart) -> None:
        """The buffer of the stage's checkpoint, else the one the previous stage committed (empty before stage 0),
        with the rows its entries reference; on the main process, audit parts after the resumed update go.

        Raises:
            ValueError: a checkpoint without a replay buffer state.
            FileNotFoundError: the previous stage committed without one.
        """
        if ctx.resume is not None:
            raw, where = ctx.resume.read_file(CHECKPOINT_FILE), ctx.resume.uri(CHECKPOINT_FILE)
            if raw is None:
                raise ValueError(f"{where} is missing: the checkpoint was written without replay.enabled")
            buffer = buffer_from_bytes(raw, self.config, where)
        else:
            buffer = read_stage_buffer(ctx.store, ctx.layout, ctx.stage - 1, self.config)
        for stage in ctx.rollout_stages:
            self._rows[stage] = {rollout_key(r): r for r in ctx.rollouts if r.stage == stage}
        needed = {e.stage for e in buffer.entries} | set(ctx.rollout_stages)
        for stage in sorted(needed - set(self._rows)):
            self._rows[stage] = {rollout_key(r): r for r in ctx.load_rollouts(stage)}
        for stage in set(self._rows) - needed:
            del self._rows[stage]
        rows = {key: r for by_key in self._rows.values() for key, r in by_key.items()}
        self._session = StageReplay(buffer, rows, derive_seed(ctx.seed, "replay-draw"))
        self._run_id, self._stage, self._audit, self._batch = ctx.layout.run_id, ctx.stage, [], None
        if ctx.is_main:
            delete_audit_parts_after(ctx.store, ctx.layout, ctx.stage, ctx.resume.step if ctx.resume else 0)

    def compose(self, rows: UpdateRows) -> Sequence[RolloutRef]:
        """Evict, then draw ``k = round(ratio x fresh)`` rollouts for the update (none during the warmup)."""
        self._batch = self.session.compose(rows.update, list(rows.fresh))
        return self._batch.replayed

    def after_update(self, rows: UpdateRows, metrics: Mapping[str, float]) -> StepRecord:
        """Insert the update's fresh rollouts; the row's replay columns; the update's audit rows (kept until the
        next checkpoint)."""
        if self._batch is None:
            raise RuntimeError("replay: after_update without compose")
        columns, _ = self.session.record(rows.update, self._batch)
        self._audit.extend(
            StageReplay.audit_rows(self._run_id, self._stage, rows.stage_update, rows.update, self._batch)
        )
        self._batch = None
        return StepRecord(columns=columns)

    def checkpoint(self, ctx: CheckpointAt) -> SavedState:
        """The audit part of the updates since the last checkpoint (main process), and the buffer's state as a
        file of the checkpoint."""
        audit, self._audit = self._audit, []
        if not ctx.is_main:
            return SavedState()
        write_audit_part(ctx.store, ctx.layout, ctx.stage, ctx.stage_update, audit)
        return SavedState(files={CHECKPOINT_FILE: buffer_to_bytes(self.session.buffer)})

    def commit(self, ctx: StageCommit) -> CommitRecord:
        """The stage's audit parts and the buffer after its last update (written now), with the count of replayed
        rollouts and the buffer's size."""
        buffer = self.session.buffer
        files = [*audit_part_records(ctx.store, ctx.layout, ctx.stage)]
        files.append(write_stage_buffer(ctx.store, ctx.layout, ctx.stage, buffer))
        counts = {"replayed": int(sum(ctx.steps["num_replayed"])), "replay_buffer_size": len(buffer)}
        return CommitRecord(files=files, counts=counts)

    def carry_over(self, ctx: StageCommit) -> CommitRecord:
        """No update, no eviction: the previous stage's buffer is committed unchanged as this stage's."""
        self._rows.clear()
        buffer = read_stage_buffer(ctx.store, ctx.layout, ctx.stage - 1, self.config)
        return CommitRecord(files=[write_stage_buffer(ctx.store, ctx.layout, ctx.stage, buffer)])


@ALGORITHMS.register("replay")
class Replay(Algorithm):
    """Rollout-level replay-buffer GRPO (arXiv 2606.04560): a training-side algorithm with its own switch."""

    name = "replay"
    section = ReplayConfig
    optional = False
    jobs = frozenset({"train"})
    description = "The rollout-level replay buffer (arXiv 2606.04560); off by default."

    @classmethod
    def check(cls, section: Any, settings: Settings) -> None:
        """Replay keeps each rollout's stored behavior log-probs and draws single rollouts, so it cannot be combined
        with recomputed behavior log-probs, truncated IS or whole-group minibatches.

        Raises:
            ValueError: naming the conflicting key.
        """
        if not section.enabled:
            return
        if settings.recompute_behavior_logprobs:
            raise ValueError(
                "replay.enabled needs train.recompute_behavior_logprobs: false (replayed rollouts keep "
                "their stored behavior log-probs)"
            )
        if settings.loss is not None and settings.loss.tis_cap is not None:
            raise ValueError(
                "replay.enabled needs loss.tis_cap: null (no trainer behavior log-probs for replayed rows)"
            )
        if settings.group_minibatches:
            raise ValueError("replay.enabled needs train.group_minibatches: false (the replay unit is one rollout)")

    @classmethod
    def audit_batches(cls, section: Any, rows: RunQuery, max_repeat: int) -> AuditFindings | None:
        """Replay draws distinct in a row and ages within tau_max (:mod:`.audit`)."""
        return audit.audit_batches(section, rows, max_repeat)

    @classmethod
    def audit_order(cls, section: Any, rows: RunQuery) -> list[str]:
        """Each update's rollouts as the replay table records them (:mod:`.audit`)."""
        return audit.audit_order(section, rows)

    @classmethod
    def train_hooks(cls, section: Any, loss: PolicyLossConfig) -> TrainHooks | None:
        return ReplayTrainHooks(section) if section.enabled else None
