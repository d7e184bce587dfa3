"""IcePop / masked importance sampling (MIS): drop the tokens whose importance ratio leaves a band."""

from __future__ import annotations

import dataclasses
import math

from pydantic import Field

from mugrpo.common.lazy import torch
from mugrpo.losses.config import LossSection, PolicyLossConfig, loss_section
from mugrpo.losses.interface import LossContext, LossOutput
from mugrpo.losses.pipeline import finalize_loss, importance_ratio, prepare_batch
from mugrpo.losses.registry import POLICY_LOSSES, clip_range, token_surrogate
from mugrpo.losses.stale.common import correction_stats, masked_is_surrogate


def token_band_keep(log_ratio: torch.Tensor, response_mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """M_t = 1[low <= rho_t <= high] on response tokens (compared in log space).

    Args:
        log_ratio: [B, T] log(pi_theta / pi_behav) (nats).
        response_mask: [B, T] bool.
        low, high: the band (0 < low <= 1 <= high).

    Returns:
        [B, T] bool, the response tokens kept.
    """
    return response_mask & (log_ratio >= math.log(low)) & (log_ratio <= math.log(high))


@loss_section("icepop")
class IcePopConfig(LossSection):
    """icepop's own knobs (``loss.icepop.*``, IcePop / masked IS token band, arXiv 2510.18855)."""

    low: float = Field(default=0.5, gt=0.0, le=1.0)
    """Lower bound alpha of icepop's token band: a token with ratio rho_t < alpha gets no gradient (IcePop, Ring-1T,
    arXiv 2510.18855; masked IS lower threshold 1/2.0 = 0.5 of verl and ms-swift)."""
    high: float = Field(default=2.0, ge=1.0)
    """Upper bound beta of icepop's token band: a token with ratio rho_t > beta gets no gradient (IcePop, arXiv
    2510.18855; masked IS threshold 2.0 of verl and ms-swift)."""


@POLICY_LOSSES.register("icepop")
@token_surrogate  # at ratio 1 every token term is -A_i: the audit recomputes update 1
@clip_range(lambda config, _inputs: (config.icepop.low, config.icepop.high))  # the band: tokens outside are dropped
def icepop_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """Token-level masked importance sampling.

    M_t = 1[icepop.low <= rho_t <= icepop.high];  l_t = -M_t rho_t A_t   (aggregated by ``config.agg_mode``)

    IcePop (Ring-1T, arXiv 2510.18855: "discrepancy masking", tokens whose train/infer probability ratio leaves
    [alpha, beta] get no gradient) and verl's / ms-swift's token-level masked IS (``token_mask``, upper threshold
    2.0, lower 1/2.0). Defaults [0.5, 2.0] (the MIS defaults of verl and ms-swift); IcePop's own band is a
    tunable of the paper. Those methods mask the sampler/learner mismatch ratio beside a PPO clip on the
    old/current ratio; here the one ratio is against the stale behavior policy and the mask is the only trust region
    (no PPO clip). Dropped tokens keep their place in the normalizer with loss 0.

    Metrics over response tokens: ``correction_masked_frac`` (tokens dropped), ``correction_w_mean`` /
    ``correction_w_sq_mean`` of M_t rho_t (ESS). The band is the loss's declared clip range
    (:func:`mugrpo.losses.loss_clip_range`), and the dropped tokens get no gradient as PPO's clipped ones do, so they
    count in the standard clip fractions with PPO's definitions: ``clip_frac_high`` the dropped tokens with A > 0 and
    rho_t > icepop.high, ``clip_frac_low`` those with A < 0 and rho_t < icepop.low (the harness audit's idle-clip
    rule reads the first, :mod:`mugrpo.audit.idle_clip`). Arguments, return value and errors as
    :func:`mugrpo.losses.stale.seq_is.seq_is_loss`.
    """
    if config.veto_enabled:
        raise ValueError("veto_enabled=True: icepop masks tokens by its own band; the veto does not combine with it")
    batch = prepare_batch(logprobs, behavior_logprobs, advantages, response_mask, config, context)
    log_ratio = batch.log_ratio.detach()
    keep = token_band_keep(log_ratio, batch.response_mask, config.icepop.low, config.icepop.high)
    dropped = batch.response_mask & ~keep
    surrogate = dataclasses.replace(
        masked_is_surrogate(batch.log_ratio, batch.advantages, keep),
        clipped_high=dropped & (batch.advantages > 0) & (log_ratio > math.log(config.icepop.high)),
        clipped_low=dropped & (batch.advantages < 0) & (log_ratio < math.log(config.icepop.low)),
    )
    weight = torch.where(keep, importance_ratio(log_ratio), 0.0)
    surrogate.extra_stats.update(correction_stats(weight, batch.response_mask, ~keep))
    return finalize_loss(batch, surrogate, config)
