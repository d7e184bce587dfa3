"""M2PO: Second-Moment Trust Policy Optimization (arXiv 2510.01161)."""

from __future__ import annotations

import torch

from mugrpo.losses.config import PolicyLossConfig
from mugrpo.losses.interface import LossContext, LossOutput
from mugrpo.losses.metrics import MetricStat
from mugrpo.losses.pipeline import finalize_loss, importance_ratio, prepare_batch
from mugrpo.losses.registry import POLICY_LOSSES, token_surrogate
from mugrpo.losses.stale.common import correction_stats, masked_is_surrogate


def m2po_keep_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor, tau: float) -> torch.Tensor:
    """M2PO's second-moment mask: drop the tokens of largest M2_t = (log rho_t)^2 until the mean M2 of the tokens
    kept is below ``tau`` (arXiv 2510.01161's second-moment mask; the greedy rule of AReaL's
    ``get_m2po_loss_mask``).

    With the response tokens' M2 sorted descending, m_(1) >= ... >= m_(N), the kept set is the smallest k such that
    mean(m_(k+1), ..., m_(N)) < tau: tokens k+1..N are kept. When even the single smallest M2 is >= tau, every token
    is dropped (the rule's limit; M2 < tau <=> |log rho| < 0.2 at tau = 0.04, so only a wholly drifted batch gets
    there).

    Args:
        log_ratio: [B, T] log(pi_theta / pi_behav) (nats), detached.
        response_mask: [B, T] bool: the tokens the second moment is over (the batch).
        tau: the threshold tau_M2 > 0 (nats^2).

    Returns:
        [B, T] bool, the response tokens kept.
    """
    m2 = (log_ratio.double() ** 2)[response_mask]
    n = m2.numel()
    keep_flat = torch.zeros(n, dtype=torch.bool, device=log_ratio.device)
    if n:
        order = torch.sort(m2, descending=True, stable=True).indices
        ordered = m2[order]
        suffix_mean = ordered.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, device=m2.device, dtype=m2.dtype)
        below = torch.nonzero(suffix_mean < tau).flatten()
        first = int(below[0]) if below.numel() else n
        keep_flat[order[first:]] = True
    keep = torch.zeros_like(response_mask)
    keep[response_mask] = keep_flat
    return keep


@POLICY_LOSSES.register("m2po")
@token_surrogate  # at ratio 1 every token term is -A_i: the audit recomputes update 1
def m2po_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """M2PO's objective: importance sampling under a second-moment trust region (arXiv 2510.01161).

    M2_hat = (1/N) sum_t (log rho_t)^2 over the batch's response tokens (the paper's M2 estimator);
    M_t from :func:`m2po_keep_mask` with tau_M2 = ``config.m2po_tau`` (default 0.04: the value of AReaL's M2PO
    example config, ``m2_threshold: 0.04``; the paper's text was not available to confirm its own);
    J = (1/sum_i |o_i|) sum_{i,t} M_t rho_t A_t (the masked objective, no PPO clip, as AReaL's M2PO page states it).

    Choices (docs/algorithms/stale-corrections.md): rho is against the stale behavior policy, recomputed each
    update from the current policy (detached); AReaL measures it against its recomputed proximal policy. "The
    batch" is the loss call's micro-batch (AReaL masks per micro-batch too; the staleness bench trains an update as
    one micro-batch). Aggregation by ``config.agg_mode`` (token-mean is the objective's 1 / sum_i |o_i| normalizer).

    Metrics over response tokens: ``correction_masked_frac``, ``correction_w_mean`` / ``correction_w_sq_mean`` of
    M_t rho_t (ESS), ``m2po_m2`` (M2_hat before masking) and ``m2po_m2_kept`` (after). Arguments, return value and
    errors as :func:`mugrpo.losses.stale.seq_is.seq_is_loss`.
    """
    if config.veto_enabled:
        raise ValueError("veto_enabled=True: m2po masks tokens by its second moment; the veto does not combine with it")
    batch = prepare_batch(logprobs, behavior_logprobs, advantages, response_mask, config, context)
    log_ratio = batch.log_ratio.detach()
    keep = m2po_keep_mask(log_ratio, batch.response_mask, config.m2po_tau)
    surrogate = masked_is_surrogate(batch.log_ratio, batch.advantages, keep)
    weight = torch.where(keep, importance_ratio(log_ratio), 0.0)
    surrogate.extra_stats.update(correction_stats(weight, batch.response_mask, ~keep))
    m2 = log_ratio.double() ** 2
    surrogate.extra_stats["m2po_m2"] = MetricStat.masked_mean(m2, batch.response_mask)
    surrogate.extra_stats["m2po_m2_kept"] = MetricStat.masked_mean(m2, keep)
    return finalize_loss(batch, surrogate, config)
