"""The data contracts the hooks share: references to rollout rows, the rollout columns an algorithm declares,
and the settings its config checks see (:mod:`mugrpo.algorithms.base` explains where each is used)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import pyarrow as pa

from mugrpo.losses.config import PolicyLossConfig


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
