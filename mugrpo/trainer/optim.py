"""AdamW and the learning-rate schedule of a training job (:class:`mugrpo.schedules.lr.LRSchedule`)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from mugrpo.config import TrainSection
from mugrpo.schedules.lr import LRSchedule

#: ``train.optimizer_impl`` -> torch.optim.AdamW's implementation arguments.
_IMPLEMENTATIONS: dict[str, dict[str, bool]] = {
    "auto": {},  # torch's choice by device: foreach on CUDA, for-loop on the CPU
    "for-loop": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def build_optimizer(params: Iterable[torch.nn.Parameter], train: TrainSection) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter, arXiv 1711.05101) over ``params`` with the section's lr, betas and decay, run by
    the implementation ``train.optimizer_impl`` names ('auto', 'foreach' and 'for-loop' give bitwise-equal weights)."""
    return torch.optim.AdamW(
        params,
        lr=train.lr,
        betas=tuple(train.betas),
        weight_decay=train.weight_decay,
        **_IMPLEMENTATIONS[train.optimizer_impl],
    )


def build_lr_schedule(train: TrainSection, total_updates: int) -> LRSchedule:
    """The LR schedule of ``train`` over ``total_updates`` global updates."""
    return LRSchedule(train.lr, train.warmup_updates, total_updates, train.lr_schedule)
