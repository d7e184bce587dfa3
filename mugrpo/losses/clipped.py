"""Token-level clipped surrogates: ``grpo`` (PPO/GRPO/DAPO clip) and ``mu_grpo`` (relaxed clip + veto)."""

from __future__ import annotations

from mugrpo.common.lazy import torch
from mugrpo.losses.config import PolicyLossConfig
from mugrpo.losses.interface import LossContext, LossOutput
from mugrpo.losses.pipeline import TokenSurrogate, apply_veto, finalize_loss, importance_ratio, prepare_batch
from mugrpo.losses.registry import POLICY_LOSSES, clip_range, token_surrogate


def clipped_surrogate(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip_c: float | None = None,
) -> TokenSurrogate:
    """Per-token PPO clipped surrogate loss.

    l_t = -min(rho_t * A_t, clip(rho_t, clip_low, clip_high) * A_t)       (PPO, arXiv 1707.06347, Eq. 7)
    and, with dual clip, l_t = min(l_t, -c * A_t) where A_t < 0            (Ye et al., arXiv 1912.09729,
    dual-clip PPO)

    Args:
        log_ratio: [B, T] log(pi_theta / pi_behav), differentiable; rho_t = exp(log_ratio), clamped to
            [-20, 20] in log space first (:func:`importance_ratio`).
        advantages: [B, T] advantages (no gradient).
        clip_low: lower bound of the ratio clip range (1 - eps_low for PPO; 0 for Mu-GRPO).
        clip_high: upper bound (1 + eps_high for PPO/DAPO; 5 for Mu-GRPO).
        dual_clip_c: dual-clip constant c > 1, or None.

    Returns:
        :class:`TokenSurrogate` with [B, T] losses and the masks of tokens whose gradient a clip removed.
    """
    ratio = importance_ratio(log_ratio)
    loss = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(clip_low, clip_high))
    negative = advantages < 0
    dual_clipped = torch.zeros_like(negative)
    if dual_clip_c is not None:
        cap = -advantages * dual_clip_c
        dual_clipped = negative & (loss > cap)
        loss = torch.where(dual_clipped, cap, loss)
    detached = ratio.detach()
    return TokenSurrogate(
        loss=loss,
        clipped_low=negative & (detached < clip_low),
        clipped_high=(advantages > 0) & (detached > clip_high),
        dual_clipped=dual_clipped,
    )


@POLICY_LOSSES.register("grpo")
@token_surrogate
@clip_range(lambda config, _eps: (1.0 - config.eps_low, 1.0 + config.eps_high))
def grpo_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """GRPO's clipped surrogate (arXiv 2402.03300, Eq. 3 without its KL term; KL is ``kl_coef``).

    Per token: -min(rho_t A, clip(rho_t, 1 - eps_low, 1 + eps_high) A); eps_high > eps_low is DAPO's
    clip-higher (arXiv 2503.14476); ``dual_clip_c`` caps the loss of A < 0 tokens at -c A. The veto is off
    unless
    ``config.veto_enabled`` is True (the "GRPO + veto" ablation).

    Args:
        logprobs: [B, T] log pi_theta of the response tokens (requires grad).
        behavior_logprobs: [B, T] log pi_behav from the sampler (no grad).
        advantages: [B] sequence-level (broadcast over tokens) or [B, T] advantages.
        response_mask: [B, T] bool or 0/1, True on response tokens (build it from lengths, not token values).
        config: :class:`PolicyLossConfig`.
        context: optional :class:`LossContext` (global counts, reference log-probs, entropy, TIS inputs).

    Returns:
        :class:`LossOutput`.

    Raises:
        ValueError: mismatched shapes or a context field the config needs is missing.
    """
    batch = prepare_batch(logprobs, behavior_logprobs, advantages, response_mask, config, context)
    surrogate = clipped_surrogate(
        batch.log_ratio, batch.advantages, 1.0 - config.eps_low, 1.0 + config.eps_high, config.dual_clip_c
    )
    veto = apply_veto(batch, config) if config.veto_enabled else None
    return finalize_loss(batch, surrogate, config, veto)


@POLICY_LOSSES.register("mu_grpo")
@token_surrogate
@clip_range(lambda config, _eps: (config.ratio_min, config.ratio_max))
def mu_grpo_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """Mu-GRPO's loss (arXiv 2605.17570): relaxed clipping plus the negative-advantage veto.

    Per token: -min(rho_t A, clip(rho_t, ratio_min, ratio_max) A) with the relaxed range [0, 5] by default,
    over the tokens the veto keeps (:func:`mugrpo.losses.veto.negative_advantage_veto_mask`, scope
    ``config.veto_scope``, threshold ``config.veto_delta``); ``config.veto_enabled=False`` turns the veto off.
    The paper's aggregation is a token mean over unmasked tokens (``agg_mode="token-mean"``).

    Arguments, return value and errors as :func:`grpo_loss`.
    """
    batch = prepare_batch(logprobs, behavior_logprobs, advantages, response_mask, config, context)
    surrogate = clipped_surrogate(
        batch.log_ratio, batch.advantages, config.ratio_min, config.ratio_max, config.dual_clip_c
    )
    veto = apply_veto(batch, config) if config.veto_enabled is not False else None
    return finalize_loss(batch, surrogate, config, veto)
