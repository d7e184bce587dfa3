"""M2PO: Second-Moment Trust Policy Optimization (arXiv 2510.01161)."""

from __future__ import annotations

import math

from pydantic import Field

from mugrpo.common.lazy import torch
from mugrpo.losses.config import LossSection, PolicyLossConfig, loss_section
from mugrpo.losses.interface import LossContext, LossOutput
from mugrpo.losses.metrics import MetricStat
from mugrpo.losses.pipeline import finalize_loss, importance_ratio, prepare_batch
from mugrpo.losses.registry import POLICY_LOSSES, token_surrogate
from mugrpo.losses.stale.common import correction_stats, masked_is_surrogate


def m2po_keep_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor, tau: float) -> torch.Tensor:
    """M2PO's second-moment mask: drop the tokens of largest M2_t = (log rho_t)^2 until the mean M2 of the tokens
    kept is below ``tau`` (the second-moment mask of arXiv 2510.01161, step 2 of AReaL's M2PO page; the greedy
    suffix-mean rule of AReaL's ``get_m2po_loss_mask``, which this function differs from as listed below).

    With the response tokens' M2 sorted descending, m_(1) >= ... >= m_(N), the number dropped is the smallest k with
    mean(m_(k+1), ..., m_(N)) < tau, and tokens k+1..N are kept.

    - **Drop-all edge (ours, not AReaL's).** When every suffix mean is >= tau (i.e. even the single smallest M2 is
      >= tau), this function drops every token, so the loss is 0 with no gradient. AReaL's ``get_m2po_loss_mask``
      instead keeps one token, the last in its descending order (one of smallest M2), and masks the other N - 1.
      At tau = 0.04, M2 >= tau <=> |log rho| >= 0.2, so only a batch drifted on every token gets there.
    - **Tie order.** The sort is stable over the response tokens taken in row-major order (response i, then
      position t), so among tokens of equal M2 (e.g. log rho = +x and -x) the earlier one (lower i, then lower t) is
      dropped first and the later one is kept. AReaL sorts with an unstable ``torch.sort(descending=True)``, so its
      tie order is unspecified.
    - M2 and the suffix means are computed in float64 (AReaL: in the log-probs' dtype).

    Args:
        log_ratio: [B, T] log(pi_theta / pi_behav) (nats), detached.
        response_mask: [B, T] bool: the tokens the second moment is over (the batch).
        tau: the threshold tau_M2 > 0 (nats^2).

    Returns:
        [B, T] bool, the response tokens kept (all False on the drop-all edge).
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


@loss_section("m2po")
class M2POConfig(LossSection):
    """m2po's own knobs (``loss.m2po.*``, second-moment token mask, arXiv 2510.01161)."""

    tau: float = Field(default=0.04, gt=0.0)
    """M2PO's second-moment threshold tau_M2 (arXiv 2510.01161; 0.04 as in AReaL's M2PO example config,
    m2_threshold: 0.04): the tokens of largest (log rho_t)^2 are dropped until the mean over the kept tokens of the
    batch is below it."""
    behavior_weight_cap: float | None = Field(default=None, gt=0.0)
    """M2PO (arXiv 2510.01161): also drop the tokens whose importance ratio pi_theta / pi_behav exceeds it, on top
    of the second-moment mask (AReaL's M2PO example trains with behav_imp_weight_cap: 5.0). None: no cap."""


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
    behavior_weight_cap: float | None = None,
) -> LossOutput:
    """M2PO's objective: importance sampling under a second-moment trust region (arXiv 2510.01161).

    M2_hat = (1/N) sum_t (log rho_t)^2 over the batch's response tokens (the paper's M2 estimator, step 1 of
    AReaL's M2PO page);
    M_t from :func:`m2po_keep_mask` with tau_M2 = ``config.m2po.tau`` (default 0.04: the value of AReaL's M2PO
    example config, ``m2_threshold: 0.04``; the paper's text was not available to confirm its own), and with
    ``behavior_weight_cap`` = C also M_t = 0 where rho_t > C;
    J = (1/sum_i |o_i|) sum_{i,t} M_t rho_t A_t (the masked objective, no PPO clip, as AReaL's M2PO page states it;
    the paper's equation numbers were not available, so the page is the source cited).

    Choices (docs/algorithms/stale-corrections.md): rho is against the stale behavior policy, recomputed each
    update from the current policy (detached); AReaL measures it against its recomputed proximal policy. "The
    batch" is the loss call's micro-batch (AReaL masks per micro-batch too; the staleness bench trains an update as
    one micro-batch). Aggregation by ``config.agg_mode`` (token-mean is the objective's 1 / sum_i |o_i| normalizer).
    Where every token's M2 is >= tau_M2 every token is dropped; AReaL keeps one (:func:`m2po_keep_mask`).

    Behavior-weight cap. AReaL's M2PO example (``examples/math/gsm8k_m2po.yaml``) trains with its decoupled loss
    and ``behav_imp_weight_cap: 5.0``: a token whose behavior importance weight pi_prox / pi_behav exceeds 5 is
    dropped (weight 0, kept in the normalizer), on top of the M2 mask. Here there is no proximal policy and the one
    ratio is rho_t = pi_theta / pi_behav (pi_prox = pi_theta, which is what AReaL's recomputed pi_prox equals at its
    example's single minibatch per step), so the cap drops the tokens with rho_t > C, compared in log space
    (log rho_t > log C), on top of the M2 mask, which stays over every response token as in AReaL.
    By default (None) there is no cap, unlike AReaL's example; ``loss.m2po.behavior_weight_cap=5.0`` gives its value.

    Metrics over response tokens: ``correction_masked_frac`` (tokens dropped by the M2 mask or the cap),
    ``correction_w_mean`` / ``correction_w_sq_mean`` of M_t rho_t (ESS), ``m2po_m2`` (M2_hat before masking) and
    ``m2po_m2_kept`` (over the tokens kept).

    Args:
        logprobs: [B, T] log pi_theta of the response tokens (requires grad).
        behavior_logprobs: [B, T] log pi_behav from the sampler (no grad).
        advantages: [B] or [B, T] advantages.
        response_mask: [B, T] bool, True on response tokens.
        config: :class:`PolicyLossConfig` (``m2po.tau``, ``agg_mode``, ``kl_coef``).
        context: optional :class:`LossContext`.
        behavior_weight_cap: C > 0: also drop the tokens with rho_t > C; None (default):
            ``config.m2po.behavior_weight_cap`` (itself None by default: no cap).

    Returns:
        :class:`LossOutput`.

    Raises:
        ValueError: mismatched shapes, a context field the config needs is missing, ``config.veto_enabled``, or
            ``behavior_weight_cap`` <= 0.
    """
    if config.veto_enabled:
        raise ValueError("veto_enabled=True: m2po masks tokens by its second moment; the veto does not combine with it")
    if behavior_weight_cap is None:
        behavior_weight_cap = config.m2po.behavior_weight_cap
    if behavior_weight_cap is not None and not behavior_weight_cap > 0:
        raise ValueError(f"m2po behavior_weight_cap must be > 0 (or None: no cap), got {behavior_weight_cap}")
    batch = prepare_batch(logprobs, behavior_logprobs, advantages, response_mask, config, context)
    log_ratio = batch.log_ratio.detach()
    keep = m2po_keep_mask(log_ratio, batch.response_mask, config.m2po.tau)
    if behavior_weight_cap is not None:
        keep = keep & (log_ratio <= math.log(behavior_weight_cap))
    surrogate = masked_is_surrogate(batch.log_ratio, batch.advantages, keep)
    weight = torch.where(keep, importance_ratio(log_ratio), 0.0)
    surrogate.extra_stats.update(correction_stats(weight, batch.response_mask, ~keep))
    m2 = log_ratio.double() ** 2
    surrogate.extra_stats["m2po_m2"] = MetricStat.masked_mean(m2, batch.response_mask)
    surrogate.extra_stats["m2po_m2_kept"] = MetricStat.masked_mean(m2, keep)
    return finalize_loss(batch, surrogate, config)
