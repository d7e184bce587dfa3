"""What a stage's training reads: :class:`StageRun`, frozen and complete, built by
:func:`mugrpo.trainer.setup.setup_stage`; the update loop, the checkpoints and the commit read only from it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator

from mugrpo.algorithms import TrainHooks
from mugrpo.policy.adapters import LoraSection
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.data import MinibatchOrder, RolloutSet
from mugrpo.trainer.optim import LRSchedule
from mugrpo.trainer.spec import TrainSpec


@dataclass(frozen=True)
class LivePolicy:
    """The trainer's live objects: the accelerator, the policy wrapper and the optimizer as accelerate prepared
    them, the unwrapped HF policy and its tokenizer (what a checkpoint and the published policy are written from)."""

    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    policy: Any
    tokenizer: Any

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0


@dataclass(frozen=True)
class StageModel:
    """The policy being trained and what scores it.

    Attributes:
        accelerator: the job's accelerator (device, processes, gradient sync).
        module: :class:`~mugrpo.trainer.forward.PolicyTokenLogprobs` over the policy, as accelerate prepared it
            (DDP/FSDP wrapper or itself); called on [B, T] token ids, gives [B, R] response log-probs.
        policy: the unwrapped HF causal LM (a PEFT model under LoRA).
        tokenizer: its tokenizer.
        reference: the frozen reference policy of the KL penalty (same call as ``module``), or None.
    """

    accelerator: Accelerator
    module: torch.nn.Module
    policy: Any
    tokenizer: Any
    reference: torch.nn.Module | None

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0


@dataclass(frozen=True)
class StageOptimizer:
    """AdamW as accelerate prepared it (its state at the resume point) and the LR schedule (positioned there)."""

    optimizer: torch.optim.Optimizer
    schedule: LRSchedule


@dataclass(frozen=True)
class UpdatePlan:
    """Which rollouts each update trains on.

    Attributes:
        order: the stage's minibatch order (update ``u`` takes ``order.minibatch(u - 1)``).
        group_of: row index of a rollout -> index of its group in ``data.groups``.
        start_step: the stage update the stage resumes after (0 at its start): the loop runs the updates after it.
        trainer_behavior: per rollout, the trainer's behavior log-probs [R_i] for truncated IS (``loss.tis_cap``),
            or None.
    """

    order: MinibatchOrder
    group_of: Mapping[int, int]
    start_step: int
    trainer_behavior: list[torch.Tensor] | None


@dataclass(frozen=True)
class Precision:
    """The dtype decisions of the stage: fp32 master weights and AdamW moments (checked at setup), the autocast of
    the forward passes, and the dtype checkpoints store (docs/precision.md).

    Attributes:
        mixed_precision: accelerate's mode, "no" or "bf16".
        autocast: the context of every training forward pass (``accelerator.autocast``; nothing when "no").
        checkpoint_dtype: ``train.checkpoint_dtype`` as a torch dtype (weights and moments rounded to it on save).
    """

    mixed_precision: str
    autocast: Callable[[], AbstractContextManager]
    checkpoint_dtype: torch.dtype


@dataclass(frozen=True)
class StageRun:
    """Everything one stage's training reads, from setup to commit (:func:`mugrpo.trainer.setup.setup_stage`).

    Attributes:
        spec, store, layout: the stage's spec, the run's store and layout.
        model: the policy being trained, its tokenizer and the KL reference.
        lora: the adapters' section when the policy trains LoRA adapters (None: full fine-tuning).
        optimizer: AdamW and the LR schedule, at the resume point.
        data: the stage's training rollouts.
        plan: the minibatch order, the groups, the resume point, the truncated-IS log-probs.
        hooks: the algorithms on in the stage, by name, their state restored.
        precision: the dtype decisions.
        recompute_s: seconds of setup's behavior log-prob recompute pass (training time, not switch).
    """

    spec: TrainSpec
    store: Store
    layout: RunLayout
    model: StageModel
    lora: LoraSection | None
    optimizer: StageOptimizer
    data: RolloutSet
    plan: UpdatePlan
    hooks: Mapping[str, TrainHooks]
    precision: Precision
    recompute_s: float

    @property
    def live(self) -> LivePolicy:
        """The live objects a checkpoint and the published policy are written from."""
        m = self.model
        return LivePolicy(m.accelerator, m.module, self.optimizer.optimizer, m.policy, m.tokenizer)
