"""Rollout-level replay buffer GRPO (arXiv 2606.04560): the buffer, its configuration, its state in the store and
its trainer hooks (:mod:`.algorithm`, registered as ``replay``).

==============  ======================================================================================
module          what
==============  ======================================================================================
``config``      the ``replay`` config section
``buffer``      entries, age and capacity eviction, priority draws (pure)
``session``     one stage's per-update bookkeeping: compose a batch, record it, audit rows
``state``       the buffer's state in the store (checkpoints, stage commits)
``records``     the ``replay`` audit table, in parts aligned with checkpoints
``algorithm``   the hooks the trainer calls
==============  ======================================================================================
"""

from mugrpo.algorithms.replay.algorithm import Replay, ReplayTrainHooks
from mugrpo.algorithms.replay.buffer import (
    BUFFER_SCHEMA,
    Eviction,
    ReplayBuffer,
    ReplayEntry,
    draw_probabilities,
    num_replayed,
    priority,
    weighted_sample_without_replacement,
)
from mugrpo.algorithms.replay.config import ReplayConfig

__all__ = [
    "BUFFER_SCHEMA",
    "Eviction",
    "Replay",
    "ReplayBuffer",
    "ReplayConfig",
    "ReplayEntry",
    "ReplayTrainHooks",
    "draw_probabilities",
    "num_replayed",
    "priority",
    "weighted_sample_without_replacement",
]
