"""GSPO: Group Sequence Policy Optimization (arXiv 2507.18071), with a sequence-level importance ratio."""

from __future__ import annotations

from mugrpo.common.lazy import torch
from mugrpo.losses.clipped import clipped_surrogate
from mugrpo.losses.config import PolicyLossConfig
from mugrpo.losses.interface import LossContext, LossOutput
from mugrpo.losses.metrics import MetricStat
from mugrpo.losses.pipeline import finalize_loss, importance_ratio, prepare_batch
from mugrpo.losses.registry import POLICY_LOSSES, clip_range


def sequence_log_ratio(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """log s_i = (1/|o_i|) sum_t log(pi_theta / pi_behav)(o_it): GSPO's sequence ratio (arXiv 2507.18071), in log space.

    Args:
        log_ratio: [B, T] per-token log-ratios, 0 at padding.
        response_mask: [B, T] bool.

    Returns:
        [B] log sequence ratios (0 for an empty response), differentiable.
    """
    lengths = response_mask.sum(dim=-1).clamp_min(1)
    return torch.where(response_mask, log_ratio, 0.0).sum(dim=-1) / lengths


@POLICY_LOSSES.register("gspo")
@clip_range(lambda config, _eps: (1.0 - config.eps_low, 1.0 + config.eps_high))  # on the sequence ratio
def gspo_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """GSPO's clipped objective with the sequence-level ratio s_i = exp(mean_t log rho_it).

    Implemented in its GSPO-token form (arXiv 2507.18071, section "GSPO-token"): token t uses
    s_it = sg[s_i] * pi_theta(o_it) / sg[pi_theta(o_it)], whose value is s_i and whose gradient is
    s_i * grad log pi_theta(o_it); with sequence-level advantages and ``agg_mode="seq-mean-token-mean"`` this is
    exactly GSPO's sequence objective (1/G) sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i). The
    paper's clip range is tiny (eps_low 3e-4, eps_high 4e-4): set it in the config. The token veto does not apply.
    A token whose behavior log-prob is -inf makes its sequence's ratio +inf: bounded at e^20 like every ratio
    (:func:`mugrpo.losses.pipeline.importance_ratio`), so that sequence's loss is finite and has no gradient.

    Arguments, return value and errors as :func:`mugrpo.losses.clipped.grpo_loss`; also raises ValueError when
    ``config.veto_enabled`` is True.
    """
    if config.veto_enabled:
        raise ValueError("veto_enabled=True: the negative-advantage veto is token-level; gspo's ratio is per sequence")
    batch = prepare_batch(logprobs, behavior_logprobs, advantages, response_mask, config, context)
    seq_log_ratio = sequence_log_ratio(batch.log_ratio, batch.response_mask)
    # The token term carries the gradient only. A token of behavior log-prob -inf (log rho = +inf) would make it
    # inf - inf = NaN: it enters as 0 with no gradient, and its sequence's ratio (+inf) is bounded at e^20 by the
    # surrogate (importance_ratio), which then gives the whole sequence no gradient. Finite tokens keep their bits.
    finite = torch.where(torch.isfinite(batch.log_ratio), batch.log_ratio, 0.0)
    token_log_ratio = seq_log_ratio.detach().unsqueeze(-1) + finite - finite.detach()
    surrogate = clipped_surrogate(
        token_log_ratio, batch.advantages, 1.0 - config.eps_low, 1.0 + config.eps_high, config.dual_clip_c
    )
    nonempty = batch.response_mask.any(dim=-1)
    surrogate.extra_stats["seq_ratio_mean"] = MetricStat.masked_mean(importance_ratio(seq_log_ratio), nonempty)
    return finalize_loss(batch, surrogate, config)
