"""Reducible metrics: each metric is a (total, count) pair plus a reduction, so micro-batches and data-parallel
ranks combine exactly (a mean of means would weight a short micro-batch like a long one)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from mugrpo.common.lazy import torch

Reduction = Literal["mean", "sum", "max"]


@dataclass(frozen=True)
class MetricStat:
    """One metric of one loss call, kept in a form that merges exactly.

    Attributes:
        total: 0-d detached tensor: the sum of the values (``mean``, ``sum``) or their maximum (``max``;
            -inf when there were none).
        count: 0-d detached tensor: how many values went into ``total``.
        reduction: ``mean`` -> value = total / count; ``sum`` -> value = total; ``max`` -> value = total.
            Across micro-batches or ranks, totals and counts are summed (``max``: totals are max-ed), e.g.
            with ``all_reduce(SUM)`` / ``all_reduce(MAX)``.
    """

    total: torch.Tensor
    count: torch.Tensor
    reduction: Reduction

    @classmethod
    def masked_mean(cls, values: torch.Tensor, mask: torch.Tensor) -> MetricStat:
        """Mean of ``values`` over the True entries of ``mask`` (same shape)."""
        values = values.detach().to(torch.float64)
        return cls(torch.where(mask, values, 0.0).sum(), mask.sum().to(torch.float64), "mean")

    @classmethod
    def masked_max(cls, values: torch.Tensor, mask: torch.Tensor) -> MetricStat:
        """Maximum of ``values`` over the True entries of ``mask`` (same shape)."""
        values = values.detach().to(torch.float64)
        total = torch.where(mask, values, float("-inf")).amax() if values.numel() else _scalar(-torch.inf, values)
        return cls(total, mask.sum().to(torch.float64), "max")

    @classmethod
    def fraction(cls, flags: torch.Tensor, mask: torch.Tensor) -> MetricStat:
        """Fraction of the True entries of ``mask`` where ``flags`` is True."""
        return cls.masked_mean(flags.to(torch.float64), mask)

    @classmethod
    def scalar(
        cls, value: torch.Tensor | float, reduction: Reduction = "mean", like: torch.Tensor | None = None
    ) -> MetricStat:
        """A single value (``mean``: averaged over calls; ``sum``: added over calls)."""
        total = value.detach().to(torch.float64) if isinstance(value, torch.Tensor) else _scalar(value, like)
        return cls(total, torch.ones_like(total), reduction)

    def merge(self, other: MetricStat) -> MetricStat:
        """Combine with the same metric from another micro-batch or rank."""
        if other.reduction != self.reduction:
            raise ValueError(f"cannot merge a {self.reduction!r} metric with a {other.reduction!r} one")
        total = torch.maximum(self.total, other.total) if self.reduction == "max" else self.total + other.total
        return MetricStat(total, self.count + other.count, self.reduction)

    def value(self) -> torch.Tensor:
        """The metric's value; 0 when no value went into it (e.g. E[ratio | A<0] with no A<0 token)."""
        if self.reduction == "sum":
            return self.total
        empty = self.count == 0
        if self.reduction == "max":
            return torch.where(empty, torch.zeros_like(self.total), self.total)
        return torch.where(empty, torch.zeros_like(self.total), self.total / self.count.clamp_min(1))


def _scalar(value: float, like: torch.Tensor | None) -> torch.Tensor:
    device = like.device if like is not None else None
    return torch.tensor(value, dtype=torch.float64, device=device)


def merge_stats(stats: Iterable[dict[str, MetricStat]]) -> dict[str, MetricStat]:
    """Merge metric dicts from several loss calls key by key (a key missing from some calls is allowed)."""
    merged: dict[str, MetricStat] = {}
    for one in stats:
        for name, stat in one.items():
            merged[name] = merged[name].merge(stat) if name in merged else stat
    return merged
