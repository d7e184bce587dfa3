"""Steps every policy loss shares: validate and prepare the inputs, then turn per-token surrogate losses into a
:class:`LossOutput` (veto, truncated importance sampling, aggregation, KL penalty, metrics).

A loss function is then three lines: ``prepare_batch`` -> its own per-token surrogate -> ``finalize_loss``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mugrpo.common.lazy import torch
from mugrpo.losses.aggregation import aggregate_token_values
from mugrpo.losses.config import PolicyLossConfig
from mugrpo.losses.interface import LossContext, LossOutput
from mugrpo.losses.kl import KL_ESTIMATORS, LOG_RATIO_CLAMP, kl_estimate
from mugrpo.losses.metrics import MetricStat
from mugrpo.losses.veto import VetoInfo, negative_advantage_veto_mask


def importance_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """rho = exp(log_ratio), with log_ratio clamped to [-20, 20] first.

    The clamp keeps rho in [2.1e-9, 4.9e8], finite in fp32 and in products with advantages; beyond it the
    token's gradient through rho is zero (the same bound verl uses).
    """
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


@dataclass(frozen=True)
class PreparedBatch:
    """Validated fp32 inputs of a policy loss. Padding positions hold 0 (never NaN/inf) in every tensor.

    Attributes:
        logprobs: [B, T] log pi_theta of the response tokens (differentiable).
        log_ratio: [B, T] log(pi_theta / pi_behav) (differentiable). pi_behav is the sampler's log-probs, or the
            trainer's recomputation of them when truncated importance sampling is on.
        advantages: [B, T] advantages, broadcast from [B] when sequence-level (no gradient).
        response_mask: [B, T] bool, True on response tokens.
        tis_weight: [B, T] min(pi_behav_trainer / pi_behav_sampler, tis_cap), or None when TIS is off.
        tis_capped: [B, T] bool, tokens whose TIS weight hit the cap, or None.
        context: the (possibly empty) :class:`LossContext`.
    """

    logprobs: torch.Tensor
    log_ratio: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    tis_weight: torch.Tensor | None
    tis_capped: torch.Tensor | None
    context: LossContext


@dataclass(frozen=True)
class TokenSurrogate:
    """Per-token output of a surrogate objective, before veto, TIS weighting and aggregation.

    Attributes:
        loss: [B, T] per-token loss (to be minimized).
        clipped_low: [B, T] bool, A < 0 and the ratio is below the clip range (no gradient).
        clipped_high: [B, T] bool, A > 0 and the ratio is above the clip range (no gradient).
        dual_clipped: [B, T] bool, A < 0 and the loss hit the dual-clip cap -c * A (no gradient).
    """

    loss: torch.Tensor
    clipped_low: torch.Tensor
    clipped_high: torch.Tensor
    dual_clipped: torch.Tensor
    extra_stats: dict[str, MetricStat] = field(default_factory=dict)


def _check_shape(name: str, tensor: torch.Tensor, shape: torch.Size) -> None:
    if tensor.shape != shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)} (like logprobs)")


def prepare_batch(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    context: LossContext | None,
) -> PreparedBatch:
    """Validate shapes and the context fields the config needs, cast to fp32 and zero the padding.

    Raises:
        ValueError: a shape mismatch (naming the argument), or a context field required by the config is missing
            (``ref_logprobs`` when ``kl_coef > 0``, ``trainer_behavior_logprobs`` when ``tis_cap`` is set).
    """
    context = context or LossContext()
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [batch, tokens], got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    _check_shape("behavior_logprobs", behavior_logprobs, shape)
    _check_shape("response_mask", response_mask, shape)
    if advantages.shape not in (shape[:1], shape):
        raise ValueError(f"advantages has shape {tuple(advantages.shape)}, expected [{shape[0]}] or {list(shape)}")
    for name in ("ref_logprobs", "entropy", "trainer_behavior_logprobs"):
        value = getattr(context, name)
        if value is not None:
            _check_shape(f"LossContext.{name}", value, shape)
    rows = {"group_index": context.group_index} | {f"inputs[{n!r}]": v for n, v in context.inputs.items()}
    for name, value in rows.items():
        if isinstance(value, torch.Tensor) and value.shape != shape[:1]:
            raise ValueError(f"LossContext.{name} has shape {tuple(value.shape)}, expected [{shape[0]}]")
    if config.kl_coef > 0 and context.ref_logprobs is None:
        raise ValueError(f"kl_coef={config.kl_coef} needs LossContext.ref_logprobs (reference policy log-probs)")

    mask = response_mask.bool()
    zero = torch.zeros((), dtype=torch.float32, device=logprobs.device)
    behavior = behavior_logprobs.detach().float()
    tis_weight = tis_capped = None
    if config.tis_cap is not None:
        if context.trainer_behavior_logprobs is None:
            raise ValueError(f"tis_cap={config.tis_cap} needs LossContext.trainer_behavior_logprobs")
        trainer_behavior = context.trainer_behavior_logprobs.detach().float()
        log_weight = torch.where(mask, trainer_behavior - behavior, zero)
        tis_capped = mask & (log_weight >= math.log(config.tis_cap))
        tis_weight = torch.exp(log_weight.clamp(max=math.log(config.tis_cap)))
        behavior = trainer_behavior
    logprobs = torch.where(mask, logprobs.float(), zero)
    advantages = advantages.detach().float()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand(shape)
    return PreparedBatch(
        logprobs=logprobs,
        log_ratio=torch.where(mask, logprobs - behavior, zero),
        advantages=torch.where(mask, advantages, zero),
        response_mask=mask,
        tis_weight=tis_weight,
        tis_capped=tis_capped,
        context=context,
    )


def apply_veto(batch: PreparedBatch, config: PolicyLossConfig) -> tuple[torch.Tensor, VetoInfo]:
    """Mu-GRPO's negative-advantage veto on the batch's current ratios (see :mod:`mugrpo.losses.veto`)."""
    return negative_advantage_veto_mask(
        batch.log_ratio.detach(), batch.advantages, batch.response_mask, config.veto_delta, config.veto_scope
    )


def finalize_loss(
    batch: PreparedBatch,
    surrogate: TokenSurrogate,
    config: PolicyLossConfig,
    veto: tuple[torch.Tensor, VetoInfo] | None = None,
) -> LossOutput:
    """Aggregate the per-token surrogate into the loss and compute the standard metrics.

    loss = agg(w_t * l_t over kept tokens) + kl_coef * agg(KL_t over response tokens), where w_t is the TIS
    weight (1 without TIS) and agg is ``config.agg_mode`` normalized by response-token/sequence counts (vetoed
    tokens count in the normalizer with loss 0). The KL penalty is not vetoed: the veto edits the policy-gradient
    signal, not the regularizer.
    """
    mask = batch.response_mask
    keep, info = veto if veto is not None else (mask, _no_veto(mask))
    token_loss = surrogate.loss if batch.tis_weight is None else surrogate.loss * batch.tis_weight
    zero = torch.zeros((), dtype=token_loss.dtype, device=token_loss.device)
    policy_loss, is_global = aggregate_token_values(
        torch.where(keep, token_loss, zero), mask, config.agg_mode, batch.context
    )
    return _with_kl_and_totals(batch, policy_loss, is_global, _standard_stats(batch, surrogate, keep, info), config)


def finalize_sequence_loss(
    batch: PreparedBatch,
    policy_loss: torch.Tensor,
    is_global: bool,
    config: PolicyLossConfig,
    extra_stats: dict[str, MetricStat],
) -> LossOutput:
    """The :class:`LossOutput` of a loss that is not a sum of per-token surrogates (ConSPO, arXiv 2605.12969).

    loss = policy_loss + kl_coef * agg(KL_t over response tokens), exactly as in :func:`finalize_loss`; the
    standard metrics are reported with no clipped and no vetoed token (such a loss has neither).

    Args:
        batch: the prepared inputs.
        policy_loss: scalar policy term of this micro-batch (differentiable).
        is_global: whether ``policy_loss`` is normalized by counts of the whole update (micro-batch losses add up).
        config: the loss config (``kl_coef``, ``kl_estimator``, ``agg_mode`` of the KL term).
        extra_stats: the loss's own metrics.
    """
    mask = batch.response_mask
    none = torch.zeros_like(mask)
    surrogate = TokenSurrogate(torch.zeros_like(batch.logprobs), none, none, none, extra_stats)
    return _with_kl_and_totals(
        batch, policy_loss, is_global, _standard_stats(batch, surrogate, mask, _no_veto(mask)), config
    )


def _with_kl_and_totals(
    batch: PreparedBatch,
    policy_loss: torch.Tensor,
    is_global: bool,
    stats: dict[str, MetricStat],
    config: PolicyLossConfig,
) -> LossOutput:
    """Add the optional KL penalty to the policy term and the ``policy_loss`` / ``loss`` metrics."""
    mask = batch.response_mask
    zero = torch.zeros((), dtype=torch.float32, device=policy_loss.device)
    loss = policy_loss
    if config.kl_coef > 0:
        ref = torch.where(mask, batch.context.ref_logprobs.detach().float(), zero)
        kl_tokens = kl_estimate(batch.logprobs, ref, config.kl_estimator)
        kl_agg = config.kl_agg_mode or config.agg_mode
        kl_loss, _ = aggregate_token_values(kl_tokens, mask, kl_agg, batch.context)
        loss = loss + config.kl_coef * kl_loss
        stats["kl_ref"] = MetricStat.masked_mean(kl_tokens, mask)
    # With global normalizers each micro-batch's loss is its share of the update's loss: shares add up.
    reduction = "sum" if is_global else "mean"
    stats["policy_loss"] = MetricStat.scalar(policy_loss, reduction)
    stats["loss"] = MetricStat.scalar(loss, reduction)
    return LossOutput(loss=loss, stats=stats)


def _no_veto(mask: torch.Tensor) -> VetoInfo:
    none = torch.zeros_like(mask)
    return VetoInfo(none, torch.full(mask.shape[:1], -1, dtype=torch.long, device=mask.device), none)


def _standard_stats(
    batch: PreparedBatch, surrogate: TokenSurrogate, keep: torch.Tensor, veto: VetoInfo
) -> dict[str, MetricStat]:
    """The metrics every loss reports (docs/design.md, "Algorithms").

    Token fractions are over response tokens; clip fractions count only kept (non-vetoed) tokens. Ratio metrics
    are over all response tokens, vetoed ones included, since they describe the policy, not the loss; the exception
    is ``ratio_max_pos_adv``, the largest ratio among the kept tokens with A > 0: the tokens an upper clip bound
    acts on, so ``clip_frac_high`` is > 0 whenever it exceeds that bound (the harness audit's idle-clip rule,
    :mod:`mugrpo.audit.idle_clip`; 0 when no kept token has A > 0).
    """
    mask = batch.response_mask
    log_ratio = batch.log_ratio.detach()
    ratio = importance_ratio(log_ratio)
    stats = {
        "clip_frac_low": MetricStat.fraction(surrogate.clipped_low & keep, mask),
        "clip_frac_high": MetricStat.fraction(surrogate.clipped_high & keep, mask),
        "dual_clip_frac": MetricStat.fraction(surrogate.dual_clipped & keep, mask),
        "veto_token_frac": MetricStat.fraction(veto.vetoed_mask, mask),
        "veto_response_frac": MetricStat.fraction(veto.vetoed_mask.any(dim=-1), mask.any(dim=-1)),
        "trigger_count": MetricStat.scalar(veto.trigger_mask.sum(), "sum"),
        "ratio_mean": MetricStat.masked_mean(ratio, mask),
        "ratio_max": MetricStat.masked_max(ratio, mask),
        "ratio_mean_neg_adv": MetricStat.masked_mean(ratio, mask & (batch.advantages < 0)),
        "ratio_max_pos_adv": MetricStat.masked_max(ratio, mask & keep & (batch.advantages > 0)),
        # KL(pi_behav || pi_theta) by k3 with r = pi_theta / pi_behav, unbiased on tokens sampled from pi_behav.
        "approx_kl_behavior": MetricStat.masked_mean(KL_ESTIMATORS["k3"](log_ratio), mask),
    }
    if batch.context.entropy is not None:
        stats["entropy"] = MetricStat.masked_mean(batch.context.entropy.float(), mask)
    if batch.tis_weight is not None:
        stats["tis_weight_mean"] = MetricStat.masked_mean(batch.tis_weight, mask)
        stats["tis_capped_frac"] = MetricStat.fraction(batch.tis_capped, mask)
    stats.update(surrogate.extra_stats)
    return stats
