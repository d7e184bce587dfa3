"""Per-rollout loss inputs: what a loss reads beyond the four core tensors and the trainer's normalizers, by name.

A loss declares the inputs it needs, ``@requires(inputs=("positive",))`` (:func:`mugrpo.losses.requires`), and
reads them from ``LossContext.inputs`` (``context.input("positive")``). Each name has exactly one provider:

- a **rollout input** registered in :data:`ROLLOUT_INPUTS`: a function of one rollout row, computed by the data path
  when the trainer loads the stage's rollouts (ConSPO's positive/negative label, arXiv 2605.12969), with optional
  **update statistics** computed over the whole optimizer update before its forward pass (ConSPO's count of valid
  groups, its loss normalizer);
- an **algorithm** that lists the name in ``Algorithm.inputs`` (:mod:`mugrpo.algorithms`) and returns its values
  from ``TrainHooks.before_update`` (AGPO's per-group clip range ``clip_eps``, arXiv 2605.20722).

The trainer carries them by name and never by meaning: ``Rollout.inputs`` -> ``TokenBatch.inputs`` ([B] tensors,
one per name) -> ``LossContext.inputs`` (those tensors for one micro-batch, plus the update statistics as floats).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mugrpo.common.lazy import torch
from mugrpo.common.registry import Registry
from mugrpo.losses.config import PolicyLossConfig


class RowFn(Protocol):
    """A rollout input's value for one rollout row, and a stable text of how it is computed."""

    def __call__(self, row: Mapping[str, Any]) -> Any:
        """The value for ``row`` (a rollout row as a dict of its columns).

        Raises:
            ValueError: the row cannot give a value (the data path names the file and row).
        """
        ...

    def describe(self) -> str:
        """A stable text of the rule: part of the data fingerprint a resumed checkpoint is checked against."""
        ...


#: ``fn(values, group_index, nonempty) -> float``: a statistic of a whole optimizer update (every micro-batch and
#: rank) over one rollout input's values, each row's group id and whether its response is non-empty.
UpdateStatFn = Callable[[Sequence[Any], Sequence[int], Sequence[bool]], float]


@dataclass(frozen=True)
class RolloutInput:
    """A per-rollout loss input computed from each rollout row when the trainer loads it.

    Attributes:
        dtype: the name of the [B] tensor's torch dtype in ``TokenBatch.inputs`` and ``LossContext.inputs`` ("bool",
            "int64", "float32").
        columns: the rollout columns ``make(config)`` reads (the trainer loads them).
        make: ``make(loss_config) -> RowFn``, the row function of a run's loss settings.
        update_stats: statistic name (a ``LossContext.inputs`` key, a float) -> its :data:`UpdateStatFn`.
        check: ``check(loss_config, reward_components)``, called when a run config is validated: raises
            ValueError (naming the config keys) when the run's rewards cannot give the input; None: no check.
    """

    dtype: str
    columns: tuple[str, ...]
    make: Callable[[PolicyLossConfig], RowFn]
    update_stats: Mapping[str, UpdateStatFn] = field(default_factory=dict)
    check: Callable[[PolicyLossConfig, Collection[str]], None] | None = None


#: Rollout inputs by name; register one with ``ROLLOUT_INPUTS.register("name")(RolloutInput(...))``.
ROLLOUT_INPUTS: Registry[RolloutInput] = Registry("rollout input")


def input_tensor(values: Sequence[Any], name: str) -> torch.Tensor:
    """The [B] tensor of one input's per-rollout values: bool for booleans, int64 for integers, else float32
    (the registered dtype of a rollout input, when ``name`` is one).

    Raises:
        ValueError: a value is None (a rollout the input's provider gave none).
    """
    if any(v is None for v in values):
        raise ValueError(f"loss input {name!r} has no value for some rollouts of the batch")
    if name in ROLLOUT_INPUTS:
        return torch.tensor(list(values), dtype=getattr(torch, ROLLOUT_INPUTS[name].dtype))
    if all(isinstance(v, bool) for v in values):
        return torch.tensor(list(values), dtype=torch.bool)
    return torch.tensor([float(v) for v in values], dtype=torch.float32)
