"""Rollout-level replay buffer GRPO (arXiv 2606.04560): the buffer, its configuration and its state in the store."""

from mugrpo.replay.buffer import (
    BUFFER_SCHEMA,
    Eviction,
    ReplayBuffer,
    ReplayEntry,
    draw_probabilities,
    num_replayed,
    priority,
    weighted_sample_without_replacement,
)
from mugrpo.replay.config import ReplayConfig

__all__ = [
    "BUFFER_SCHEMA",
    "Eviction",
    "ReplayBuffer",
    "ReplayConfig",
    "ReplayEntry",
    "draw_probabilities",
    "num_replayed",
    "priority",
    "weighted_sample_without_replacement",
]
