"""AdamW and the learning-rate schedule of a training job (:class:`mugrpo.schedules.lr.LRSchedule`)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from mugrpo.config import TrainSection
from mugrpo.schedules.lr import LRSchedule


def build_optimizer(params: Iterable[torch.nn.Parameter], train: TrainSection) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter, arXiv 1711.05101) over ``params`` with the section's lr, betas and decay."""
    return torch.optim.AdamW(params, lr=train.lr, betas=tuple(train.betas), weight_decay=train.weight_decay)


def build_lr_schedule(train: TrainSection, total_updates: int) -> LRSchedule:
    """The LR schedule of ``train`` over ``total_updates`` global updates."""
    return LRSchedule(train.lr, train.warmup_updates, total_updates, train.lr_schedule)
