"""AGPO's policy loss (arXiv 2605.20722; released code wandugu/paper_agpo): the PPO clipped surrogate with a
symmetric clip range per group, eps_g, computed by the trainer's clip-range controller
(:class:`mugrpo.algorithms.agpo.ClipRangeController`) and passed as the loss input ``clip_eps``
(``LossContext.inputs``, provided by AGPO's trainer hooks: ``AGPO.inputs``).

It is :func:`mugrpo.losses.clipped.clipped_surrogate` with per-row bounds [1 - eps_g, 1 + eps_g] and the shared
KL machinery (``kl_coef``, ``kl_estimator``, ``kl_agg_mode``): the released code's loss is
``-mean_seq token-mean min(rho A, clip(rho, 1-eps, 1+eps) A) + beta * token-mean(logp - logp_ref)``, i.e.
``agg_mode=seq-mean-token-mean``, ``kl_estimator=k1`` (k1 = -log(pi_ref/pi_theta) = logp - logp_ref),
``kl_agg_mode=token-mean``, ``kl_coef=0.03`` (configs/gsm8k-smollm2-agpo.yaml).
"""

from __future__ import annotations

from mugrpo.common.lazy import torch
from mugrpo.losses.clipped import clipped_surrogate
from mugrpo.losses.config import PolicyLossConfig
from mugrpo.losses.interface import LossContext, LossOutput
from mugrpo.losses.metrics import MetricStat
from mugrpo.losses.pipeline import finalize_loss, prepare_batch
from mugrpo.losses.registry import POLICY_LOSSES, clip_range, requires

#: The loss input AGPO's trainer hooks provide: the [B] symmetric clip range of each response's group.
CLIP_EPS = "clip_eps"


def _clip_bounds(_config: PolicyLossConfig, inputs) -> tuple[torch.Tensor, torch.Tensor] | None:
    """[1 - eps_g, 1 + eps_g] per response; None without ``clip_eps`` (no per-group range known)."""
    eps = inputs.get(CLIP_EPS)
    return None if eps is None else (1.0 - eps, 1.0 + eps)


def kl_step_per_response(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """max(0, mean_t(logp_old - logp_new)) of each response: [B] (AGPO's KL_step before the mean over responses).

    Args:
        log_ratio: [B, T] logp_new - logp_old (0 on padding).
        response_mask: [B, T] bool.
    """
    tokens = response_mask.sum(-1).clamp(min=1)
    return (-(log_ratio.detach() * response_mask).sum(-1) / tokens).clamp(min=0.0)


@POLICY_LOSSES.register("agpo")
@requires(inputs=(CLIP_EPS,))
@clip_range(_clip_bounds)
def agpo_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """AGPO's loss (arXiv 2605.20722): per token -min(rho_t A, clip(rho_t, 1 - eps_g, 1 + eps_g) A), eps_g the
    response's group clip range from the loss input ``clip_eps`` [B]; aggregated by ``config.agg_mode`` plus the
    optional KL penalty. ``dual_clip_c`` applies as for ``grpo``; the veto is never applied.

    Metric beyond the standard ones: ``agpo_kl_step``, the mean over non-empty responses of
    max(0, mean_t(logp_old - logp_new)) with logp_new the policy of this forward pass (before the update).

    Arguments as :func:`mugrpo.losses.clipped.grpo_loss`.

    Raises:
        ValueError: the input ``clip_eps`` is missing, not [B], or outside (0, 1); shape mismatches.
    """
    batch = prepare_batch(logprobs, behavior_logprobs, advantages, response_mask, config, context)
    eps = batch.context.input(CLIP_EPS, "loss.name=agpo").detach().float().to(logprobs.device)
    if bool(((eps <= 0) | (eps >= 1)).any()):
        raise ValueError(f"the loss input clip_eps must lie in (0, 1), got min {eps.min():.4g} max {eps.max():.4g}")
    bounds = eps.unsqueeze(-1)
    surrogate = clipped_surrogate(batch.log_ratio, batch.advantages, 1.0 - bounds, 1.0 + bounds, config.dual_clip_c)
    nonempty = batch.response_mask.any(-1)
    surrogate.extra_stats["agpo_kl_step"] = MetricStat.masked_mean(
        kl_step_per_response(batch.log_ratio, batch.response_mask), nonempty
    )
    return finalize_loss(batch, surrogate, config)
