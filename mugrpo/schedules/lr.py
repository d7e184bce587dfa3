"""The learning-rate schedule: linear warmup, then constant, cosine or linear decay (a registry of multipliers).

The learning rate is a pure function of the global update index, so a resumed job recomputes it exactly; the
schedule's state (the last update it set) is still saved in checkpoints to check that. ``train.lr_schedule`` names
an entry of :data:`LR_SCHEDULES`, checked when the config is loaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

from mugrpo.common.registry import Registry


class Optimizer(Protocol):
    """What the schedule sets the lr of: a torch optimizer (its ``param_groups``)."""

    param_groups: list[dict[str, Any]]


#: Post-warmup LR multipliers ``f(progress in [0, 1)) -> factor`` by ``train.lr_schedule``.
LR_SCHEDULES: Registry[Callable[[float], float]] = Registry("lr schedule")


@LR_SCHEDULES.register("constant")
def _constant(progress: float) -> float:
    return 1.0


@LR_SCHEDULES.register("cosine")
def _cosine(progress: float) -> float:
    """Cosine decay to 0 (Loshchilov & Hutter, SGDR, arXiv 1608.03983, Eq. 5 with eta_min = 0)."""
    return 0.5 * (1.0 + math.cos(math.pi * progress))


@LR_SCHEDULES.register("linear")
def _linear(progress: float) -> float:
    return 1.0 - progress


class LRSchedule:
    """lr(u) for global update u (1-based).

    lr(u) = lr * u / warmup for u <= warmup (linear warmup, the first update already has a non-zero lr), then
    lr * f((u - 1 - warmup) / (total - warmup)) with f the named schedule, so the first update after warmup runs
    at the full lr and the decay reaches 0 just after the last update.

    Args:
        base_lr: peak learning rate.
        warmup_updates: warmup length in updates (0 = none).
        total_updates: horizon of the decay (updates of the whole run).
        name: a key of :data:`LR_SCHEDULES`.

    Raises:
        UnknownNameError: unknown name (a ValueError).
    """

    def __init__(self, base_lr: float, warmup_updates: int, total_updates: int, name: str):
        LR_SCHEDULES[name]  # raises UnknownNameError (a ValueError) listing the registered names
        self.base_lr, self.warmup, self.total, self.name = base_lr, warmup_updates, max(1, total_updates), name
        self.last_update = 0
        self._lrs: list[float] = []  # lr(1), lr(2), ... as far as cumulative_lr has needed them

    def lr(self, update: int) -> float:
        """Learning rate of 1-based global update ``update``."""
        if update <= self.warmup:
            return self.base_lr * update / self.warmup
        span = max(1, self.total - self.warmup)
        progress = min(max((update - 1 - self.warmup) / span, 0.0), 1.0)
        return self.base_lr * LR_SCHEDULES[self.name](progress)

    def cumulative_lr(self, update: int) -> float:
        """T * eta of the run after global update ``update``: sum of lr(u) over u = 1..update (arXiv 2607.01083:
        collapse time scales with it), summed exactly (``math.fsum``) from the schedule alone, so it is the same
        after a resume as in an uninterrupted run. 0 for ``update`` <= 0."""
        while len(self._lrs) < update:
            self._lrs.append(self.lr(len(self._lrs) + 1))
        return math.fsum(self._lrs[: max(update, 0)])

    def apply(self, optimizer: Optimizer, update: int) -> float:
        """Set the lr of every param group for ``update``; returns it."""
        lr = self.lr(update)
        for group in optimizer.param_groups:
            group["lr"] = lr
        self.last_update = update
        return lr

    def state_dict(self) -> dict:
        return {
            "name": self.name,
            "base_lr": self.base_lr,
            "warmup": self.warmup,
            "total": self.total,
            "last_update": self.last_update,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the position; raises ValueError if the saved schedule differs from this one."""
        mine = self.state_dict()
        diff = {k: (state.get(k), mine[k]) for k in ("name", "base_lr", "warmup", "total") if state.get(k) != mine[k]}
        if diff:
            raise ValueError(f"checkpoint LR schedule differs from the spec's (saved, spec): {diff}")
        self.last_update = int(state["last_update"])
