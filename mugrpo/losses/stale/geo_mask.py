"""The geometric sequence mask: drop a whole response whose geometric-mean token ratio leaves a narrow band."""

from __future__ import annotations

import math

from pydantic import Field

from mugrpo.common.lazy import torch
from mugrpo.losses.config import LossSection, PolicyLossConfig, loss_section
from mugrpo.losses.gspo import sequence_log_ratio
from mugrpo.losses.interface import LossContext, LossOutput
from mugrpo.losses.metrics import MetricStat
from mugrpo.losses.pipeline import finalize_loss, importance_ratio, prepare_batch
from mugrpo.losses.registry import POLICY_LOSSES, token_surrogate
from mugrpo.losses.stale.common import correction_stats, masked_is_surrogate


def geometric_keep_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which responses the geometric sequence mask keeps.

    g_i = exp((1/|o_i|) sum_t log rho_it);  keep_i = low <= g_i <= high   (compared in log space)

    Args:
        log_ratio: [B, T] per-token log(pi_theta / pi_behav) (nats), 0 at padding.
        response_mask: [B, T] bool.
        low, high: the band (0 < low <= 1 <= high).

    Returns:
        ([B] bool keep per response (False for an empty one), [B] log g_i).
    """
    log_g = sequence_log_ratio(log_ratio, response_mask)
    keep = response_mask.any(dim=-1) & (log_g >= math.log(low)) & (log_g <= math.log(high))
    return keep, log_g


@loss_section("geo_mask")
class GeoMaskConfig(LossSection):
    """geo_mask's own knobs (``loss.geo_mask.*``, SkyRL's geometric sequence mask)."""

    low: float = Field(default=0.99, gt=0.0, le=1.0)
    """Lower bound of geo_mask's band: a response with geometric-mean token ratio exp(mean_t log rho_t) < it is
    dropped (SkyRL's off-policy correction, sequence_mask_metric=geometric, documented default 0.99)."""
    high: float = Field(default=1.01, ge=1.0)
    """Upper bound of geo_mask's band: a response with geometric-mean token ratio > it is dropped (SkyRL's
    documented default 1.01)."""


@POLICY_LOSSES.register("geo_mask")
@token_surrogate  # at ratio 1 every token term is -A_i: the audit recomputes update 1
def geo_mask_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """Token importance sampling over the responses a geometric sequence mask keeps.

    g_i = exp((1/|o_i|) sum_t log rho_it);  M_i = 1[geo_mask.low <= g_i <= geo_mask.high]
    l_it = -M_i rho_it A_i                                   (aggregated by ``config.agg_mode``)

    SkyRL's off-policy correction ``sequence_mask_metric: geometric`` (SkyRL docs, "Off-policy correction"; its
    documented thresholds 0.99 / 1.01 are the defaults of ``geo_mask.low`` / ``geo_mask.high``); g_i is GSPO's
    length-normalised sequence ratio (arXiv 2507.18071). SkyRL applies the mask on top of its PPO loss to correct the
    sampler/learner mismatch of one step; here the one ratio is against the stale behavior policy and the mask is
    the only trust region (no PPO clip), recomputed every update from the current policy (detached), like the
    Mu-GRPO veto. A dropped response's tokens keep their place in the normalizer with loss 0.

    Metrics: ``correction_masked_frac`` = response tokens dropped, ``geo_mask_response_frac`` = responses dropped,
    ``correction_w_mean`` / ``correction_w_sq_mean`` of the applied token weights M_i rho_it (ESS over tokens).
    Arguments, return value and errors as :func:`mugrpo.losses.stale.seq_is.seq_is_loss`.
    """
    if config.veto_enabled:
        raise ValueError("veto_enabled=True: the negative-advantage veto does not apply to geo_mask (a response mask)")
    batch = prepare_batch(logprobs, behavior_logprobs, advantages, response_mask, config, context)
    keep_seq, _ = geometric_keep_mask(
        batch.log_ratio.detach(), batch.response_mask, config.geo_mask.low, config.geo_mask.high
    )
    keep = batch.response_mask & keep_seq.unsqueeze(-1)
    surrogate = masked_is_surrogate(batch.log_ratio, batch.advantages, keep)
    weight = torch.where(keep, importance_ratio(batch.log_ratio.detach()), 0.0)
    surrogate.extra_stats.update(correction_stats(weight, batch.response_mask, ~keep))
    nonempty = batch.response_mask.any(dim=-1)
    surrogate.extra_stats["geo_mask_response_frac"] = MetricStat.fraction(~keep_seq, nonempty)
    return finalize_loss(batch, surrogate, config)
