"""Sequence-level importance sampling: one weight per response, the sequence likelihood ratio, truncated
(``seq_is``) or self-normalised over the batch (``seq_snis``).

Choice (docs/algorithms/stale-corrections.md): the weight is exp of the *sum* of the token log-ratios, i.e. the
exact ratio pi_theta(o|q) / pi_behav(o|q) of the sampled response (unbiased importance sampling of a sequence-level
objective; the "sequence" level of verl's and ms-swift's rollout-correction importance sampling). The *mean*
(geometric-mean ratio, exp(mean_t log rho_t)) is GSPO's length-normalised ratio (arXiv 2507.18071, loss ``gspo``)
and the statistic of the geometric sequence mask (``geo_mask``); it is not an importance weight of the sequence.
"""

from __future__ import annotations

import math

from pydantic import Field

from mugrpo.common.lazy import torch
from mugrpo.losses.config import LossSection, PolicyLossConfig, loss_section
from mugrpo.losses.interface import LossContext, LossOutput
from mugrpo.losses.kl import LOG_RATIO_CLAMP
from mugrpo.losses.pipeline import PreparedBatch, TokenSurrogate, finalize_loss, prepare_batch
from mugrpo.losses.registry import POLICY_LOSSES, token_surrogate
from mugrpo.losses.stale.common import correction_stats


def sequence_log_weight(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """log W_i = sum_t log(pi_theta / pi_behav)(o_it): the log of the sequence likelihood ratio.

    Args:
        log_ratio: [B, T] per-token log-ratios (nats), 0 at padding.
        response_mask: [B, T] bool.

    Returns:
        [B] log sequence weights (0 for an empty response), differentiable.
    """
    return torch.where(response_mask, log_ratio, 0.0).sum(dim=-1)


def _weighted_surrogate(batch: PreparedBatch, weight: torch.Tensor) -> TokenSurrogate:
    """l_it = -sg[w_i] * A_i * pi_theta(o_it) / sg[pi_theta(o_it)]: value -w_i A_i, gradient -w_i A_i grad log
    pi_theta(o_it), so the summed gradient of a response is w_i A_i grad log pi_theta(o_i) (REINFORCE with a
    sequence importance weight).

    The unit factor is exp(log pi_theta - sg[log pi_theta]), not exp(log rho - sg[log rho]): the two have the same
    value (1) and the same gradient (log pi_behav carries none), but log rho is +inf where log pi_behav = -inf, and
    inf - inf would make the token's loss NaN.

    Args:
        batch: the prepared inputs ([B, T] tensors).
        weight: [B] sequence weights w_i (detached here), finite.

    Returns:
        :class:`TokenSurrogate` with [B, T] losses (0 at padding) and no clipped token.
    """
    unit = torch.exp(batch.logprobs - batch.logprobs.detach())
    loss = -(weight.detach().unsqueeze(-1) * batch.advantages) * unit
    none = torch.zeros_like(batch.response_mask)
    return TokenSurrogate(loss=torch.where(batch.response_mask, loss, 0.0), clipped_low=none, clipped_high=none,
                          dual_clipped=none)  # fmt: skip


@loss_section("seq_is")
class SeqISConfig(LossSection):
    """seq_is's own knob (``loss.seq_is.*``, sequence-level truncated importance sampling)."""

    cap: float | None = Field(default=2.0, gt=0.0)
    """Truncation C of seq_is's sequence weight w_i = min(exp(sum_t log rho_it), C) (sequence-level truncated IS,
    Yao et al. 2025; default 2.0: the upper IS threshold of verl's and ms-swift's rollout correction). None:
    untruncated."""


@POLICY_LOSSES.register("seq_is")
@token_surrogate  # at ratio 1 every token term is -A_i: the audit recomputes update 1
def seq_is_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """Sequence-level truncated importance sampling.

    w_i = min(exp(sum_t log rho_it), C),  rho_it = pi_theta(o_it | q, o_<it) / pi_behav(o_it | q, o_<it)
    grad J = sum_i w_i A_i grad log pi_theta(o_i | q)         (aggregated over tokens by ``config.agg_mode``)

    Importance sampling of the sequence-level objective E_{o ~ pi_theta}[A(o)] from pi_behav samples (Precup et al.
    2000, per-episode IS; the "sequence" level of truncated IS for the sampler/learner mismatch, Yao et al. 2025,
    "Your efficient RL framework secretly brings you off-policy RL training"). C = ``config.seq_is.cap`` (default 2.0,
    the default upper threshold of ms-swift's and verl's rollout-correction IS); None: no truncation. log W is
    clamped to [-20, 20] before exp. No PPO clip: the truncation is the only trust region.

    A token the behavior policy could not have sampled (``behavior_logprobs`` = -inf on a response token; the
    trainer's data path refuses such rows, :mod:`mugrpo.trainer.data`, but a direct call may pass one) has
    log rho = +inf, so log W_i = +inf and the formula gives w_i = C (``correction_clipped_frac`` counts it), or e^20
    with no cap: finite, as ``icepop``, ``m2po`` and ``geo_mask`` (which drop the token or its response) and
    ``grpo`` / ``mu_grpo`` (which bound its ratio at e^20) stay finite on it. A -inf at padding is ignored.

    Metrics (:mod:`mugrpo.losses.stale.common`) over non-empty responses: ``correction_clipped_frac`` = responses
    whose weight hit C; ``correction_w_mean`` / ``correction_w_sq_mean`` of w_i (ESS).

    Args:
        logprobs: [B, T] log pi_theta of the response tokens (requires grad).
        behavior_logprobs: [B, T] log pi_behav from the sampler (no grad).
        advantages: [B] or [B, T] advantages (sequence-level: one value per response).
        response_mask: [B, T] bool, True on response tokens.
        config: :class:`PolicyLossConfig` (``seq_is.cap``, ``agg_mode``, ``kl_coef``).
        context: optional :class:`LossContext`.

    Returns:
        :class:`LossOutput`.

    Raises:
        ValueError: mismatched shapes, a context field the config needs is missing, or ``config.veto_enabled``.
    """
    if config.veto_enabled:
        raise ValueError("veto_enabled=True: the negative-advantage veto is token-level; seq_is weighs whole responses")
    batch = prepare_batch(logprobs, behavior_logprobs, advantages, response_mask, config, context)
    log_w = sequence_log_weight(batch.log_ratio.detach(), batch.response_mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    clipped = torch.zeros_like(log_w, dtype=torch.bool)
    if config.seq_is.cap is not None:
        clipped = log_w >= math.log(config.seq_is.cap)
        log_w = log_w.clamp(max=math.log(config.seq_is.cap))
    weight = torch.exp(log_w)
    surrogate = _weighted_surrogate(batch, weight)
    nonempty = batch.response_mask.any(dim=-1)
    surrogate.extra_stats.update(correction_stats(weight, nonempty, torch.zeros_like(nonempty), clipped))
    return finalize_loss(batch, surrogate, config)


@POLICY_LOSSES.register("seq_snis")
@token_surrogate  # at ratio 1 every token term is -A_i: the audit recomputes update 1
def seq_snis_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """Self-normalised sequence-level importance sampling (SNIS).

    W_i = exp(sum_t log rho_it),  w_i = n W_i / sum_j W_j   (over the n non-empty responses of the batch)
    grad J = sum_i w_i A_i grad log pi_theta(o_i | q)       (aggregated over tokens by ``config.agg_mode``)

    The self-normalised importance-sampling estimator (Kahn and Marshall 1953; Owen, "Monte Carlo theory, methods and
    examples", 2013, ch. 9; for off-policy policy gradients, Swaminathan and Joachims 2015, SNIPS): biased but
    consistent, each weight bounded by n, no threshold. The weights are normalized in log space
    (log w_i = log W_i - logsumexp_j log W_j + log n), so no W overflows. "The batch" is the loss call's micro-batch:
    the staleness bench trains each update in one micro-batch, where it is the update (a choice, written in
    docs/algorithms/stale-corrections.md).

    A response with log W_i = +inf (``behavior_logprobs`` = -inf on one of its tokens: a token the behavior policy
    could not have sampled; the trainer's data path refuses such rows, a direct call may pass one) gets the limit of
    the formula as its W_i grows without bound: the k responses with W = +inf share the batch's weight equally,
    w_i = n / k, and every other response gets w = 0 (finite, as the other corrections are on such a token; with
    k = 1 it is the limit of n W_i / sum_j W_j). A batch with no such response is unaffected by this rule.

    Metrics over non-empty responses: ``correction_w_mean`` (1 by construction) and ``correction_w_sq_mean`` (ESS =
    1 / w_sq_mean); nothing is clipped or masked. Arguments, return value and errors as :func:`seq_is_loss`.
    """
    if config.veto_enabled:
        raise ValueError("veto_enabled=True: the negative-advantage veto is token-level; seq_snis weighs responses")
    batch = prepare_batch(logprobs, behavior_logprobs, advantages, response_mask, config, context)
    nonempty = batch.response_mask.any(dim=-1)
    log_w = sequence_log_weight(batch.log_ratio.detach(), batch.response_mask)
    count = nonempty.sum().clamp_min(1)
    log_norm = torch.logsumexp(torch.where(nonempty, log_w, float("-inf")), dim=0)
    weight = torch.where(nonempty, torch.exp(log_w - log_norm) * count, 0.0)
    infinite = nonempty & (log_w == math.inf)  # W_i = +inf: the limit, n / k each (docstring)
    n_infinite = infinite.sum()
    limit = torch.where(infinite, count / n_infinite.clamp_min(1), 0.0).to(weight.dtype)
    weight = torch.where(n_infinite > 0, limit, weight)
    surrogate = _weighted_surrogate(batch, weight)
    surrogate.extra_stats.update(correction_stats(weight, nonempty, torch.zeros_like(nonempty)))
    return finalize_loss(batch, surrogate, config)
