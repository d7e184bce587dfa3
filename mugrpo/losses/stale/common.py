"""What every stale-data correction shares: the masked importance-sampling surrogate and the correction metrics.

Metrics (keys of ``LossOutput.stats``, so of each ``train_steps`` row's ``loss_metrics`` map), over the correction's
units (tokens or responses, as each loss's docstring says):

- ``correction_masked_frac``: the fraction of units the correction dropped from the loss;
- ``correction_clipped_frac``: the fraction of units whose weight it truncated;
- ``correction_w_mean``, ``correction_w_sq_mean``: mean of the weights w it applied (0 where it dropped a unit) and
  of their squares. Both are means over units, so they merge exactly over micro-batches and ranks, and the update's
  effective sample size ESS = (sum w)^2 / (n sum w^2) = w_mean^2 / w_sq_mean (Kong 1992; :func:`effective_sample_size`)
  follows from the merged update's values (``mugrpo sql``'s ``stage_corrections`` view computes it).
"""

from __future__ import annotations

from mugrpo.common.lazy import torch
from mugrpo.losses.kl import LOG_RATIO_CLAMP
from mugrpo.losses.metrics import MetricStat
from mugrpo.losses.pipeline import TokenSurrogate, importance_ratio

MASKED_FRAC = "correction_masked_frac"
CLIPPED_FRAC = "correction_clipped_frac"
WEIGHT_MEAN = "correction_w_mean"
WEIGHT_SQ_MEAN = "correction_w_sq_mean"


def correction_stats(
    weights: torch.Tensor, units: torch.Tensor, masked: torch.Tensor, clipped: torch.Tensor | None = None
) -> dict[str, MetricStat]:
    """The correction metrics of one loss call (module docstring).

    Args:
        weights: [B, T] or [B] importance weights the correction applied (0 on dropped units), any float dtype.
        units: bool, same shape: the units counted (response tokens, or non-empty responses).
        masked: bool, same shape: the units dropped.
        clipped: bool, same shape: the units whose weight was truncated; None: none.

    Returns:
        name -> :class:`MetricStat` (means over ``units``).
    """
    w = weights.detach().double()
    none = torch.zeros_like(units)
    return {
        MASKED_FRAC: MetricStat.fraction(masked & units, units),
        CLIPPED_FRAC: MetricStat.fraction((none if clipped is None else clipped) & units, units),
        WEIGHT_MEAN: MetricStat.masked_mean(w, units),
        WEIGHT_SQ_MEAN: MetricStat.masked_mean(w * w, units),
    }


def effective_sample_size(w_mean: float, w_sq_mean: float) -> float:
    """ESS / n = (sum w)^2 / (n sum w^2) = w_mean^2 / w_sq_mean, in [0, 1] (Kong 1992; 1: uniform weights).

    Args:
        w_mean, w_sq_mean: the mean weight and mean squared weight over the n units (``correction_w_mean``,
            ``correction_w_sq_mean``).

    Returns:
        The normalized ESS; 0.0 when every weight is 0 (every unit dropped).
    """
    return 0.0 if w_sq_mean <= 0.0 else w_mean * w_mean / w_sq_mean


def bounded_weight(log_weight: torch.Tensor) -> torch.Tensor:
    """w = exp(min(log w, 20)): an importance weight that cannot overflow, for weights computed from log-ratios
    that no other bound limits (A-3PO's behavior weight pi_prox / pi_behav = exp(alpha log rho) with no
    ``loss.a3po.weight_cap``, arXiv 2512.06547; decoupled PPO, Hilton et al. 2022, arXiv 2110.00641).

    exp overflows fp32 to +inf once log w > 88.72 (log of the largest float32), and the loss then becomes -inf or
    NaN. Clamping at 88.72 would not be enough: a weight near 3.4e38 times a loss term of magnitude above 1 (PPO's
    clipped term is 1.2 |A|) still overflows. So the bound is the library's bound on every importance ratio,
    ``LOG_RATIO_CLAMP`` = 20 (w <= e^20 = 4.85e8; :func:`mugrpo.losses.pipeline.importance_ratio`, ``seq_is``'s
    log W, the k3 estimator): a bounded weight times a bounded ratio times A stays finite in fp32. Only the upper
    side is bounded: a very negative log w underflows to 0, which is finite, and is left as it was.

    Below the bound (log w <= 20) the clamp is the identity, so the result is bitwise exp(log w); the weights of
    inputs with log w > 20 change (from up to 3.4e38, or inf, to 4.85e8). NaN stays NaN; -inf gives 0.

    Args:
        log_weight: log importance weights, any shape and float dtype (detached where it is a weight).

    Returns:
        Same shape and dtype: exp(min(log_weight, 20)), in [0, 4.85e8].
    """
    return torch.exp(log_weight.clamp(max=LOG_RATIO_CLAMP))


def masked_is_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, keep: torch.Tensor) -> TokenSurrogate:
    """The importance-sampled policy gradient with a mask as its only trust region:
    l_t = -keep_t * rho_t * A_t, rho_t = exp(log_ratio_t) (the masked objective of M2PO, arXiv 2510.01161, as
    AReaL documents it; the masked-IS objective of IcePop / MIS). A dropped token has loss 0 and no gradient but
    stays in the normalizer.

    Args:
        log_ratio: [B, T] log(pi_theta / pi_behav), differentiable, 0 at padding.
        advantages: [B, T] advantages (no gradient).
        keep: [B, T] bool, the tokens kept.

    Returns:
        :class:`TokenSurrogate` with no clipped token (the standard clip fractions stay 0).
    """
    ratio = importance_ratio(log_ratio)
    loss = torch.where(keep, -advantages * ratio, torch.zeros((), dtype=ratio.dtype, device=ratio.device))
    none = torch.zeros_like(keep)
    return TokenSurrogate(loss=loss, clipped_low=none, clipped_high=none, dual_clipped=none)
