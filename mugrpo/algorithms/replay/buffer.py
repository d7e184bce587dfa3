"""The rollout-level replay buffer (arXiv 2606.04560): entries, age and capacity eviction, priority draws.

The unit is one rollout (one response), referenced by ``(stage, prompt_id, sample_idx)``: its tokens, behavior
log-probs and advantage stay in the committed rollout Parquet and are read from there, frozen at birth, never
recomputed. An entry also keeps its birth update (``policy_version`` of its rollout: the optimizer update count when
its stage's behavior policy was frozen) and its priority ``(|A| + eps)^alpha``.

Ages are counted in optimizer updates: at global update ``g`` (1-based; the policy being updated has taken ``g - 1``
steps) an entry born at ``b`` has age ``g - 1 - b``, the same convention as the ``staleness`` column of
``train_steps`` (a stage's own rollouts have age 0 at its first update). Entries with age > tau_max are evicted
before every draw. Insertion order is FIFO order for the capacity backstop.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from mugrpo.algorithms.replay.config import ReplayConfig

RolloutKey = tuple[int, str, int]  # (stage, prompt_id, sample_idx)

#: Columns of the buffer's stored state (one row per entry, in insertion order).
BUFFER_SCHEMA = pa.schema(
    [
        pa.field("stage", pa.int32(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("sample_idx", pa.int32(), nullable=False),
        pa.field("birth_update", pa.int64(), nullable=False),
        pa.field("advantage", pa.float64(), nullable=False),
        pa.field("priority", pa.float64(), nullable=False),
    ]
)


def num_replayed(ratio: float, fresh: int) -> int:
    """k = round(ratio x fresh), rounded half up (Python's ``round`` rounds half to even: 2.5 -> 2; we take 3).

    Raises:
        ValueError: negative ratio or fresh count.
    """
    if ratio < 0 or fresh < 0:
        raise ValueError(f"ratio ({ratio}) and fresh ({fresh}) must be >= 0")
    return int(math.floor(ratio * fresh + 0.5))


def priority(advantage: float, alpha: float, eps: float = 1e-6) -> float:
    """Unnormalized priority (|A| + eps)^alpha of a rollout with advantage ``advantage`` (arXiv 2606.04560)."""
    return (abs(advantage) + eps) ** alpha


def draw_probabilities(priorities: np.ndarray) -> np.ndarray:
    """P(i) = p_i / sum_j p_j: the probability that entry i is the first one drawn. Shape [n] -> [n].

    Raises:
        ValueError: an empty array or a non-positive / non-finite priority.
    """
    p = np.asarray(priorities, dtype=np.float64)
    if p.size == 0 or not np.all(np.isfinite(p)) or np.any(p <= 0):
        raise ValueError(f"priorities must be a non-empty array of finite positive values, got {p!r}")
    return p / p.sum()


def weighted_sample_without_replacement(priorities: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
    """Draw ``min(k, n)`` distinct indices of [n] priorities, each draw proportional to the remaining priorities.

    Efraimidis-Spirakis (Inf. Proc. Letters 97(5), 2006): keys log(u_i) / p_i, the k largest win. The result, in
    draw order, has the law of successive sampling: first index i with P(i) = p_i / sum p, the next one
    proportional to the priorities left, and so on.
    """
    p = np.asarray(priorities, dtype=np.float64)
    k = min(k, p.size)
    if k <= 0:
        return []
    u = rng.random(p.size)
    keys = np.log(np.maximum(u, np.finfo(np.float64).tiny)) / p
    order = np.argsort(-keys, kind="stable")
    return [int(i) for i in order[:k]]


@dataclass(frozen=True)
class ReplayEntry:
    """One buffered rollout: its reference, birth update, frozen advantage and priority."""

    stage: int
    prompt_id: str
    sample_idx: int
    birth_update: int
    advantage: float
    priority: float

    @property
    def key(self) -> RolloutKey:
        return (self.stage, self.prompt_id, self.sample_idx)

    def age(self, update: int) -> int:
        """Age at global update ``update`` (1-based): ``update - 1 - birth_update``."""
        return update - 1 - self.birth_update


@dataclass(frozen=True)
class Eviction:
    """Entries removed by one eviction pass."""

    by_age: int = 0
    by_capacity: int = 0


class ReplayBuffer:
    """Rollout references in insertion (FIFO) order, with :meth:`evict_stale`, :meth:`insert` and :meth:`draw`.

    A plain object with :meth:`state_dict` / :meth:`load_state_dict` (docs/design.md); the trainer decides when its
    state is stored (with every checkpoint and at the stage commit).
    """

    def __init__(self, config: ReplayConfig) -> None:
        self.config = config
        self._entries: OrderedDict[RolloutKey, ReplayEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: RolloutKey) -> bool:
        return key in self._entries

    @property
    def entries(self) -> list[ReplayEntry]:
        """The entries, oldest inserted first."""
        return list(self._entries.values())

    def insert(self, rollouts: Iterable[tuple[RolloutKey, int, float]]) -> Eviction:
        """Insert ``(key, birth_update, advantage)`` triples (a key already present keeps its first entry), then
        evict the oldest inserted entries beyond ``capacity``. Zero-variance groups must be left out by the caller.
        """
        for key, birth, advantage in rollouts:
            if key not in self._entries:
                p = priority(advantage, self.config.alpha, self.config.priority_eps)
                self._entries[key] = ReplayEntry(*key, birth_update=int(birth), advantage=float(advantage), priority=p)
        over = max(0, len(self._entries) - self.config.capacity)
        for _ in range(over):
            self._entries.popitem(last=False)
        return Eviction(by_capacity=over)

    def evict_stale(self, update: int) -> Eviction:
        """Remove entries whose age at global update ``update`` exceeds ``tau_max`` (age == tau_max stays)."""
        stale = [k for k, e in self._entries.items() if e.age(update) > self.config.tau_max]
        for key in stale:
            del self._entries[key]
        return Eviction(by_age=len(stale))

    def draw(self, k: int, update: int, seed: int, exclude: Iterable[RolloutKey] = ()) -> list[ReplayEntry]:
        """Draw ``min(k, eligible)`` entries without replacement, P(i) proportional to priority, for ``update``.

        Eligible: every entry not in ``exclude`` (the update's fresh rollouts). Nothing is drawn during the
        warmup (``update <= warmup_updates``). The draw is a pure function of (buffer, k, update, seed):
        the generator is seeded with ``(seed, update)``, so a resumed run draws what an uninterrupted one drew.
        """
        if update <= self.config.warmup_updates or k <= 0:
            return []
        banned = set(exclude)
        eligible = [e for e in self._entries.values() if e.key not in banned]
        if not eligible:
            return []
        rng = np.random.default_rng([seed % 2**63, update])
        picked = weighted_sample_without_replacement(np.array([e.priority for e in eligible]), k, rng)
        return [eligible[i] for i in picked]

    # state
    def to_table(self) -> pa.Table:
        """The state as a compact table (references, birth update, advantage, priority), insertion order."""
        cols = {f.name: [getattr(e, f.name) for e in self._entries.values()] for f in BUFFER_SCHEMA}
        return pa.table(cols, schema=BUFFER_SCHEMA)

    def load_table(self, table: pa.Table, where: str = "replay buffer") -> None:
        """Replace the state with the rows of ``table`` (see :meth:`to_table`).

        Raises:
            ValueError: missing columns or a duplicate rollout reference, naming ``where``.
        """
        missing = [f.name for f in BUFFER_SCHEMA if f.name not in table.column_names]
        if missing:
            raise ValueError(f"{where}: missing columns {missing}")
        self._entries = OrderedDict()
        for row in table.select(BUFFER_SCHEMA.names).to_pylist():
            entry = ReplayEntry(**row)
            if entry.key in self._entries:
                raise ValueError(f"{where}: rollout {entry.key} appears twice")
            self._entries[entry.key] = entry

    def state_dict(self) -> dict:
        """JSON-able state (the entries as column lists)."""
        return {"entries": self.to_table().to_pydict()}

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        self.load_table(pa.table(state["entries"], schema=BUFFER_SCHEMA))
