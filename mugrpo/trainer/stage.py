"""What the steps of a stage's training share: the trainer's live objects and the stage being trained."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate import Accelerator

from mugrpo.algorithms import TrainHooks
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.data import MinibatchOrder, RolloutSet
from mugrpo.trainer.optim import LRSchedule
from mugrpo.trainer.spec import TrainSpec


@dataclass
class StageRun:
    """What the steps of one stage's training share (built by :meth:`mugrpo.trainer.loop.Trainer.run_stage`).

    Attributes:
        spec, store, layout: the stage's spec, the run's store and layout.
        data: the stage's training rollouts.
        hooks: the algorithms on in the stage, by name.
        order: the stage's minibatch order.
        schedule: the LR schedule (positioned at the resume point).
        start_step: the stage update the stage resumes after (0 at its start).
        reference: the frozen reference policy of the KL penalty, or None.
        trainer_behavior: per rollout, the trainer's behavior log-probs for truncated IS, or None.
        checkpoint_s: seconds spent writing checkpoints so far.
        group_of: row index of a rollout -> index of its group (set when the update loop starts).
    """

    spec: TrainSpec
    store: Store
    layout: RunLayout
    data: RolloutSet
    hooks: Mapping[str, TrainHooks]
    order: MinibatchOrder | None = None
    schedule: LRSchedule | None = None
    start_step: int = 0
    reference: torch.nn.Module | None = None
    trainer_behavior: list[torch.Tensor] | None = None
    checkpoint_s: float = 0.0
    group_of: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class LivePolicy:
    """The trainer's live objects (:class:`mugrpo.trainer.loop.Trainer`): the accelerator, the policy wrapper and
    the optimizer as accelerate prepared them, the unwrapped HF policy and its tokenizer."""

    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    policy: Any
    tokenizer: Any

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
