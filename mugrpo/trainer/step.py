"""One optimizer update: micro-batched forward/backward with gradient accumulation, clipping, a non-finite guard,
then the AdamW step.

Normalization by global counts: every micro-batch's loss is divided by the token (or sequence) count of the whole
minibatch (``LossContext.global_num_tokens`` / ``global_num_seqs``), so the accumulated gradient is the gradient
of the minibatch's loss however the minibatch is cut into micro-batches or sharded over ranks. Data-parallel
wrappers (DDP, FSDP) average gradients over the W ranks, so each rank's loss is multiplied by W to undo that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from accelerate import Accelerator

from mugrpo.losses import LossContext, LossOutput, MetricStat, PolicyLossConfig, compute_policy_loss, merge_stats
from mugrpo.trainer.batch import TokenBatch
from mugrpo.trainer.health import gather_rows, health_panel, token_health_rows


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm of an update was NaN or infinite; no optimizer step was taken.

    Attributes:
        what: "loss" or "grad_norm".
        value: the offending value.
        prompt_ids: sorted distinct prompt ids of the whole minibatch (this rank's share).
    """

    def __init__(self, what: str, value: float, prompt_ids: list[str]):
        self.what, self.value, self.prompt_ids = what, value, prompt_ids
        shown = ", ".join(prompt_ids[:20]) + (" ..." if len(prompt_ids) > 20 else "")
        super().__init__(f"non-finite {what} ({value}) in a minibatch of prompts: {shown}")


class UpdateDropped(Exception):
    """An update abandoned before its optimizer step (a preemption notice: the rest of it and a checkpoint did not
    fit in the grace); parameters and optimizer state are those of before the update."""


@dataclass
class UpdateResult:
    """Outcome of one optimizer update.

    Attributes:
        metrics: loss metrics reduced over micro-batches and ranks (names as in the train_steps table).
        grad_norm: total gradient L2 norm before clipping.
        num_tokens: response tokens of the minibatch (all ranks).
        num_sequences: responses of the minibatch (all ranks).
        seconds: wall time of the update (forward, backward, step).
        health: the update's token health panel against the sampler (:mod:`mugrpo.trainer.health`).
    """

    metrics: dict[str, float]
    grad_norm: float
    num_tokens: int
    num_sequences: int
    seconds: float
    health: dict[str, float | None] = dataclasses.field(default_factory=dict)


def _reduce_across_ranks(accelerator: Accelerator, stats: dict[str, MetricStat]) -> dict[str, float]:
    """Combine per-rank metric totals and counts exactly (sum, or max for ``max`` metrics), then evaluate."""
    if accelerator.num_processes > 1:
        names = sorted(stats)
        device = accelerator.device
        totals = torch.stack([stats[n].total for n in names]).to(device)
        counts = torch.stack([stats[n].count for n in names]).to(device)
        is_max = torch.tensor([stats[n].reduction == "max" for n in names], device=device)
        summed = accelerator.reduce(torch.where(is_max, 0.0, totals), reduction="sum")
        maxed = accelerator.reduce(torch.where(is_max, totals, -torch.inf), reduction="max") if is_max.any() else summed
        counts = accelerator.reduce(counts, reduction="sum")
        stats = {
            n: MetricStat(torch.where(is_max[i], maxed[i], summed[i]), counts[i], stats[n].reduction)
            for i, n in enumerate(names)
        }
    return {name: float(stat.value()) for name, stat in stats.items()}


def train_update(
    accelerator: Accelerator,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[TokenBatch],
    loss_config: PolicyLossConfig,
    *,
    global_num_tokens: int,
    global_num_seqs: int,
    max_grad_norm: float,
    max_response_len: int | None = None,
    reference: torch.nn.Module | None = None,
    trainer_behavior_logprobs: list[torch.Tensor] | None = None,
    update_statistics: Mapping[str, float] | None = None,
    progress: float | None = None,
    before_micro_batch: Callable[[int, int], None] | None = None,
) -> UpdateResult:
    """Run one optimizer update over this rank's micro-batches.

    Args:
        accelerator: the job's accelerator (device, autocast, gradient sync, clipping).
        model: the prepared :class:`mugrpo.trainer.forward.PolicyTokenLogprobs`.
        optimizer: the prepared optimizer; its lr must already be set for this update.
        micro_batches: this rank's share of the minibatch, already collated (CPU or device).
        loss_config: the policy loss (looked up by name in the registry).
        global_num_tokens: response tokens of the whole minibatch over all ranks (the token-mean normalizer).
        global_num_seqs: non-empty responses of the whole minibatch over all ranks (the seq-mean normalizer).
        max_grad_norm: gradient-norm clipping threshold.
        max_response_len: Dr. GRPO's constant normalizer (``seq-mean-token-sum-norm``).
        reference: frozen reference policy wrapper, required when ``loss_config.kl_coef > 0``.
        trainer_behavior_logprobs: per micro-batch [B, R] trainer-recomputed behavior log-probs (TIS), or None.
        update_statistics: the rollout inputs' statistics of the whole minibatch over all ranks (e.g. ConSPO's
            ``num_valid_groups``, :func:`mugrpo.trainer.data.update_statistics`), given to the loss in
            ``LossContext.inputs``; None: none.
        progress: training progress lambda_t in [0, 1] of this update (a loss's schedule input), or None.
        before_micro_batch: called as ``(i, n)`` before micro-batch ``i`` of ``n``; it may raise
            :class:`UpdateDropped` (a preemption notice): then no step is taken and the gradients are zeroed.

    Returns:
        :class:`UpdateResult`.

    Raises:
        NonFiniteError: the minibatch's loss or gradient norm is NaN/inf; gradients are zeroed and no step is taken,
            so parameters and optimizer state are those of before the update.
    """
    start = time.perf_counter()
    world = accelerator.num_processes
    context = LossContext(
        global_num_tokens=float(max(global_num_tokens, 1)),
        global_num_seqs=float(max(global_num_seqs, 1)),
        max_response_len=max_response_len,
        progress=progress,
        inputs=dict(update_statistics or {}),
    )
    outputs, loss_sum, health_rows = _backward_micro_batches(
        accelerator, model, micro_batches, loss_config, context, reference, trainer_behavior_logprobs,
        before_micro_batch,
    )  # fmt: skip

    prompt_ids = sorted({p for b in micro_batches for p in b.prompt_ids})
    total_loss = float(accelerator.reduce(loss_sum, reduction="sum")) if world > 1 else float(loss_sum)
    if not math.isfinite(total_loss):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError("loss", total_loss, prompt_ids)
    grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), max_grad_norm))
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError("grad_norm", grad_norm, prompt_ids)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    metrics = _reduce_across_ranks(accelerator, merge_stats(o.stats for o in outputs))
    health = health_panel(gather_rows(accelerator, torch.cat(health_rows)))
    return UpdateResult(
        metrics=metrics,
        grad_norm=grad_norm,
        num_tokens=global_num_tokens,
        num_sequences=global_num_seqs,
        seconds=time.perf_counter() - start,
        health=health,
    )


def _backward_micro_batches(
    accelerator: Accelerator,
    model: torch.nn.Module,
    micro_batches: list[TokenBatch],
    loss_config: PolicyLossConfig,
    update_context: LossContext,
    reference: torch.nn.Module | None,
    trainer_behavior_logprobs: list[torch.Tensor] | None,
    before_micro_batch: Callable[[int, int], None] | None = None,
) -> tuple[list[LossOutput], torch.Tensor, list[torch.Tensor]]:
    """Forward and backward of each micro-batch, gradients accumulated (synchronized across ranks on the last one
    only). ``update_context`` holds the update's normalizers; each micro-batch adds its own tensors. Returns the
    detached loss outputs, the sum of the micro-batch losses (float64) and each micro-batch's health rows
    (:func:`mugrpo.trainer.health.token_health_rows`: the same forward's log-probs against the sampler's)."""
    world = accelerator.num_processes
    outputs: list[LossOutput] = []
    health_rows: list[torch.Tensor] = []
    loss_sum = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    for i, cpu_batch in enumerate(micro_batches):
        if before_micro_batch is not None:
            try:
                before_micro_batch(i, len(micro_batches))
            except UpdateDropped:
                model.zero_grad(set_to_none=True)  # the micro-batches before it accumulated gradients: gone
                raise
        batch = cpu_batch.to(accelerator.device)
        last = i == len(micro_batches) - 1
        sync = contextlib.nullcontext() if last else accelerator.no_sync(model)
        with sync:
            with accelerator.autocast():  # bf16 autocast (train.mixed_precision) or nothing; log-probs are fp32
                logit_var = torch.empty(batch.response_ids.shape, dtype=torch.float32, device=accelerator.device)
                logprobs, entropy = model(batch, logit_var_out=logit_var)
                ref_logprobs = None
                if reference is not None:
                    with torch.no_grad():
                        ref_logprobs, _ = reference(batch, return_entropy=False)
            tis = trainer_behavior_logprobs[i].to(accelerator.device) if trainer_behavior_logprobs else None
            context = dataclasses.replace(
                update_context,
                ref_logprobs=ref_logprobs,
                entropy=entropy,
                trainer_behavior_logprobs=tis,
                group_index=batch.group_index,
                inputs={**update_context.inputs, **batch.inputs},
            )
            out = compute_policy_loss(
                logprobs, batch.behavior_logprobs, batch.advantages, batch.response_mask, loss_config, context=context
            )
            accelerator.backward(out.loss * world)
        loss_sum += out.loss.detach().double()
        outputs.append(LossOutput(loss=out.loss.detach(), stats=out.stats))
        health_rows.append(token_health_rows(batch, logprobs, logit_var, loss_config))
    return outputs, loss_sum, health_rows


@torch.no_grad()
def token_mean_entropy(accelerator: Accelerator, model: torch.nn.Module, batches: list[TokenBatch]) -> float:
    """Token-mean entropy (nats) of the policy ``model`` over the response tokens of ``batches`` on every rank (a
    no-grad forward pass under the training autocast; a collective with several processes)."""
    total = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    count = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    for cpu_batch in batches:
        batch = cpu_batch.to(accelerator.device)
        with accelerator.autocast():
            _, entropy = model(batch)
        total += torch.where(batch.response_mask, entropy.double(), 0.0).sum()
        count += batch.response_mask.sum()
    if accelerator.num_processes > 1:
        total = accelerator.reduce(total, reduction="sum")
        count = accelerator.reduce(count, reduction="sum")
    return float(total / count.clamp_min(1))
