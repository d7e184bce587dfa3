"""One stage of replay-buffer training: the per-update bookkeeping the trainer calls (arXiv 2606.04560).

Per global update ``g`` (:meth:`StageReplay.compose`, then :meth:`StageReplay.record`):

1. evict entries older than ``tau_max`` (age ``g - 1 - birth``);
2. draw ``k = round(r x fresh)`` entries without replacement, P(i) proportional to ``(|A_i| + eps)^alpha``,
   excluding the update's fresh rollouts, seeded by (run seed, g); nothing while ``g <= warmup_updates``;
3. train on fresh + replayed rollouts: each replayed rollout keeps the behavior log-probs and advantage of its
   committed row (its importance ratio is against its own behavior policy);
4. insert the fresh rollouts of non-zero-variance groups, born at their ``policy_version``; FIFO capacity.

Replayed rows are read by reference from the committed rollout Parquet of their stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from mugrpo.algorithms.contracts import RolloutRef
from mugrpo.algorithms.replay.buffer import Eviction, ReplayBuffer, ReplayEntry, RolloutKey, num_replayed


def rollout_key(r: RolloutRef) -> RolloutKey:
    """``(stage, prompt_id, sample_idx)``: how a buffer entry references its rollout."""
    return (r.stage, r.prompt_id, r.sample_idx)


@dataclass
class UpdateBatch:
    """The rollouts of one fresh-anchored update and the replay columns of its ``train_steps`` row."""

    fresh: list[RolloutRef]
    replayed: list[RolloutRef]
    drawn: list[ReplayEntry]
    evicted_age: int
    buffer_size: int

    @property
    def rollouts(self) -> list[RolloutRef]:
        return self.fresh + self.replayed


class StageReplay:
    """The buffer during one stage, with the rows its entries reference.

    Args:
        buffer: the buffer as the stage starts (or as its resumed checkpoint left it).
        rows: every rollout an entry may reference, by (stage, prompt_id, sample_idx).
        seed: the draw seed (derived from the run seed); each update's generator is seeded with (seed, update).
    """

    def __init__(self, buffer: ReplayBuffer, rows: dict[RolloutKey, RolloutRef], seed: int) -> None:
        self.buffer, self.rows, self.seed = buffer, rows, seed

    def compose(self, update: int, fresh: list[RolloutRef]) -> UpdateBatch:
        """Steps 1-2 for global update ``update``.

        Raises:
            KeyError: an entry references a rollout missing from ``rows`` (naming it).
        """
        evicted = self.buffer.evict_stale(update)
        size = len(self.buffer)
        k = num_replayed(self.buffer.config.ratio, len(fresh))
        drawn = self.buffer.draw(k, update, self.seed, exclude=[rollout_key(r) for r in fresh])
        missing = [e.key for e in drawn if e.key not in self.rows]
        if missing:
            raise KeyError(f"replay entries reference rollouts that are not loaded: {missing[:5]}")
        replayed = [self.rows[e.key] for e in drawn]
        return UpdateBatch(fresh, replayed, drawn, evicted.by_age, size)

    def record(self, update: int, batch: UpdateBatch) -> tuple[dict, Eviction]:
        """Step 4, after the update: insert the fresh rollouts of non-zero-variance groups (their row's
        ``zero_variance`` flag); returns the row's replay columns and the eviction."""
        evicted = self.buffer.insert(
            (rollout_key(r), r.policy_version, r.advantage) for r in batch.fresh if not r.zero_variance
        )
        ages = [e.age(update) for e in batch.drawn]
        columns = {
            "num_fresh": len(batch.fresh),
            "num_replayed": len(batch.replayed),
            "replay_age_mean": sum(ages) / len(ages) if ages else None,
            "replay_age_max": max(ages) if ages else None,
            "replay_buffer_size": batch.buffer_size,
            "replay_evicted_age": batch.evicted_age,
            "replay_evicted_capacity": evicted.by_capacity,
        }
        return columns, evicted

    @staticmethod
    def audit_rows(run_id: str, stage: int, stage_update: int, update: int, batch: UpdateBatch) -> list[dict]:
        """One ``replay`` table row per rollout the update used (fresh first, then replayed in draw order)."""
        rows = []
        for r in batch.fresh:
            rows.append(_audit(run_id, stage, stage_update, update, r, replayed=False, priority=None))
        for r, e in zip(batch.replayed, batch.drawn, strict=True):
            rows.append(_audit(run_id, stage, stage_update, update, r, replayed=True, priority=e.priority))
        return rows


def _audit(run_id, stage, stage_update, update, r: RolloutRef, *, replayed: bool, priority: float | None) -> dict:
    return {
        "run_id": run_id,
        "stage": stage,
        "update": update,
        "stage_update": stage_update,
        "rollout_stage": r.stage,
        "prompt_id": r.prompt_id,
        "sample_idx": r.sample_idx,
        "replayed": replayed,
        "birth_update": r.policy_version,
        "age": update - 1 - r.policy_version,
        "advantage": r.advantage,
        "priority": priority,
    }
