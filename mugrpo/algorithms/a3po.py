"""A-3PO: decoupled PPO whose proximal policy is interpolated, not recomputed (arXiv 2512.06547; AReaL's
``prox_logp_method: loglinear``, docs/algorithms/prox_approx.md of inclusionAI/AReaL).

Decoupled PPO (Hilton et al. 2022, "Batch size-invariance for policy optimization", arXiv 2110.00641) splits the
behavior importance weight from the trust region: per token

    J_t = (pi_prox / pi_behav) * min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A),   r_t = pi_theta / pi_prox,

with pi_prox a recent policy, one update behind the current one. Computing pi_prox costs a forward pass per update;
A-3PO interpolates it in log space between the stored behavior log-probs and the current policy's (detached):

    log pi_prox = log pi_behav + alpha (sg[log pi_theta] - log pi_behav),
    alpha = (v_prox - v_behav) / (v_theta - v_behav)

with v the policy versions (optimizer updates taken). Here v_behav is the rollout's ``policy_version``, v_theta =
the updates the current policy has taken (the update being trained minus one) and v_prox = v_theta -
``a3po.proximal_lag`` (1: one update behind, AReaL's proximal policy), no earlier than v_behav; alpha = 0 where
v_theta = v_behav (the policy is the behavior policy). The trainer hands this module each rollout's alpha as the loss
input ``a3po_alpha`` (:class:`A3POTrainHooks`), since the versions are the trainer's; no forward pass is added.

Choices the paper leaves open are in docs/algorithms/stale-corrections.md.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mugrpo.algorithms.base import Algorithm
from mugrpo.algorithms.contracts import Settings
from mugrpo.algorithms.registry import ALGORITHMS
from mugrpo.algorithms.training import TrainHooks, UpdateInputs, UpdateRows
from mugrpo.common.lazy import torch
from mugrpo.losses import (
    POLICY_LOSSES,
    LossContext,
    LossOutput,
    LossSection,
    MetricStat,
    PolicyLossConfig,
    loss_section,
    requires,
    token_surrogate,
)
from mugrpo.losses.clipped import clipped_surrogate
from mugrpo.losses.pipeline import TokenSurrogate, finalize_loss, prepare_batch
from mugrpo.losses.stale import bounded_weight, correction_stats

#: The policy loss of this algorithm, and its per-rollout input (the interpolation weight alpha).
LOSS_NAME = "a3po"
ALPHA = "a3po_alpha"


class A3POConfig(BaseModel):
    """Settings of A-3PO's proximal-policy interpolation (arXiv 2512.06547); the loss's knobs are in ``loss.a3po``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    proximal_lag: int = Field(
        default=1,
        ge=1,
        description="Updates the proximal policy is behind the current one: v_prox = v_theta - proximal_lag, "
        "alpha = (v_prox - v_behav) / (v_theta - v_behav) (arXiv 2512.06547; AReaL's proximal policy is one "
        "training step behind, so 1).",
    )


def interpolation_weight(staleness: int, lag: int) -> float:
    """alpha = (v_prox - v_behav) / (v_theta - v_behav) with v_theta - v_behav = ``staleness`` (updates the current
    policy is ahead of the rollout's behavior policy) and v_prox = max(v_theta - lag, v_behav).

    Returns:
        alpha in [0, 1): 0 when ``staleness`` <= ``lag`` (the proximal policy is the behavior policy).

    Raises:
        ValueError: a negative staleness (a rollout sampled by a later policy than the one trained).
    """
    if staleness < 0:
        raise ValueError(f"staleness {staleness} < 0: a rollout's behavior policy is newer than the trained policy")
    return 0.0 if staleness == 0 else max(staleness - lag, 0) / staleness


class A3POTrainHooks(TrainHooks):
    """Gives the loss each rollout's alpha before every update (no state: alpha is a function of the versions)."""

    def __init__(self, config: A3POConfig) -> None:
        self.config = config

    def before_update(self, rows: UpdateRows) -> UpdateInputs:
        taken = rows.update - 1  # optimizer updates the policy being trained has taken: v_theta
        alphas = [
            interpolation_weight(taken - r.policy_version, self.config.proximal_lag) for r in (*rows.fresh, *rows.extra)
        ]
        return UpdateInputs(values={ALPHA: alphas})


@ALGORITHMS.register("a3po")
class A3PO(Algorithm):
    """A-3PO: on with ``loss.name=a3po`` (the ``a3po`` section is optional: its defaults apply when absent)."""

    name = "a3po"
    section = A3POConfig
    optional = True
    jobs = frozenset({"train"})
    description = (
        "A-3PO (arXiv 2512.06547): decoupled PPO with the proximal policy interpolated between the behavior and the "
        "current policy; on with loss.name=a3po. None = the defaults."
    )
    inputs = (ALPHA,)

    @classmethod
    def check(cls, section: Any, settings: Settings) -> None:
        """An ``a3po`` section only acts with ``loss.name=a3po``.

        Raises:
            ValueError: the section is given with another loss (it would silently do nothing).
        """
        if section is not None and settings.loss is not None and settings.loss.name != LOSS_NAME:
            raise ValueError(
                f"the a3po section sets A-3PO's proximal policy, which only loss.name=a3po uses (loss.name is "
                f"{settings.loss.name!r}): set loss.name=a3po or drop the section"
            )

    @classmethod
    def train_hooks(cls, section: Any, loss: PolicyLossConfig) -> TrainHooks | None:
        return A3POTrainHooks(section or A3POConfig()) if loss.name == LOSS_NAME else None


@loss_section(LOSS_NAME)
class A3POLossConfig(LossSection):
    """a3po's own loss knob (``loss.a3po.*``, decoupled PPO's behavior-weight cap, arXiv 2512.06547)."""

    weight_cap: float | None = Field(default=5.0, gt=1.0)
    """A-3PO (arXiv 2512.06547): tokens whose behavior importance weight pi_prox / pi_behav exceeds it get no
    gradient (decoupled PPO's behavior-weight cap; 5.0 as AReaL's decoupled-loss example configs,
    behav_imp_weight_cap: 5.0). None: no cap."""


def decoupled_log_ratios(
    log_ratio: torch.Tensor, logprobs: torch.Tensor, alpha: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split log rho_t = log(pi_theta / pi_behav) at the proximal policy (arXiv 2512.06547):
    log w_t = alpha_i sg[log rho_t] (behavior weight) and log r_t = log rho_t - alpha_i sg[log rho_t] (PPO ratio).

    A token whose behavior log-prob is -inf (log rho = +inf: the behavior policy could not have sampled it) would
    give 0 * inf and inf - inf = NaN. There pi_prox = pi_behav^(1 - alpha) pi_theta^alpha, so for alpha in (0, 1)
    both w and r are +inf (then bounded at e^20 by :func:`bounded_weight` and
    :func:`mugrpo.losses.pipeline.importance_ratio`, r with no gradient); alpha = 0 gives w = 1 (the proximal policy
    is the behavior policy: plain PPO, as ``grpo`` on that token) and alpha = 1 gives r = pi_theta / sg[pi_theta]
    (value 1, the gradient of log pi_theta). Finite tokens are computed exactly as the formulas above.

    Args:
        log_ratio: [B, T] log rho_t (differentiable through ``logprobs``), 0 at padding.
        logprobs: [B, T] log pi_theta of the same tokens (finite; requires grad).
        alpha: [B] interpolation weights in [0, 1].

    Returns:
        (log w [B, T] without gradient, log r [B, T] differentiable).
    """
    alpha = alpha.unsqueeze(-1)
    log_rho = log_ratio.detach()
    finite = torch.isfinite(log_rho)
    log_w = torch.where(finite, alpha * log_rho, torch.where(alpha > 0, torch.inf, 0.0))
    own = logprobs - logprobs.detach()  # value 0, the gradient of log pi_theta
    log_r = torch.where(finite, log_ratio - alpha * log_rho, own + torch.where(alpha < 1, torch.inf, 0.0))
    return log_w, log_r


@POLICY_LOSSES.register("a3po")
@token_surrogate  # at ratio 1 every token term is -A_i: the audit recomputes update 1
@requires(inputs=(ALPHA,))
def a3po_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """A-3PO's decoupled PPO loss (arXiv 2512.06547; module docstring for alpha).

    log w_t = log pi_prox - log pi_behav = alpha_i sg[log rho_t]            (behavior weight, no gradient)
    log r_t = log pi_theta - log pi_prox = log rho_t - alpha_i sg[log rho_t]
    l_t = -M_t w_t min(r_t A_i, clip(r_t, 1 - eps_low, 1 + eps_high) A_i),  M_t = 1[w_t <= a3po.weight_cap]

    with rho_t = pi_theta / pi_behav. ``eps_low`` / ``eps_high`` are PPO's (0.2), ``dual_clip_c`` applies to the
    surrogate, ``loss.a3po.weight_cap`` (default 5.0) drops tokens of a larger behavior weight (decoupled PPO's
    cap). The gradient is that of the decoupled objective with pi_prox fixed: w_t grad r_t where the clip leaves it.
    A behavior log-prob of -inf stays finite with or without the cap (:func:`decoupled_log_ratios`).

    Metrics over response tokens: the standard clip fractions (of r_t), ``correction_masked_frac`` (tokens over the
    cap), ``correction_w_mean`` / ``correction_w_sq_mean`` of M_t w_t (ESS), ``a3po_alpha_mean`` (over responses).

    Args:
        logprobs: [B, T] log pi_theta of the response tokens (requires grad).
        behavior_logprobs: [B, T] log pi_behav from the sampler (no grad).
        advantages: [B] or [B, T] advantages.
        response_mask: [B, T] bool, True on response tokens.
        config: :class:`PolicyLossConfig`.
        context: :class:`LossContext` whose ``inputs`` hold ``a3po_alpha``, [B] in [0, 1] (the trainer hooks give
            it; a test passes it).

    Returns:
        :class:`LossOutput`.

    Raises:
        ValueError: mismatched shapes, no ``a3po_alpha`` input, or ``config.veto_enabled``.
    """
    if config.veto_enabled:
        raise ValueError("veto_enabled=True: the negative-advantage veto is Mu-GRPO's; a3po has its own weight cap")
    batch = prepare_batch(logprobs, behavior_logprobs, advantages, response_mask, config, context)
    alpha = torch.as_tensor(batch.context.input(ALPHA, "loss.name=a3po"), device=logprobs.device).float()
    mask = batch.response_mask
    log_w, log_r = decoupled_log_ratios(batch.log_ratio, batch.logprobs, alpha)
    cap = config.a3po.weight_cap
    keep = mask if cap is None else mask & (log_w <= math.log(cap))
    weight = torch.where(keep, bounded_weight(log_w), 0.0)  # exp, bounded: finite at any alpha * log rho
    inner = clipped_surrogate(log_r, batch.advantages, 1.0 - config.eps_low, 1.0 + config.eps_high, config.dual_clip_c)
    surrogate = TokenSurrogate(
        loss=torch.where(keep, weight * inner.loss, 0.0),
        clipped_low=inner.clipped_low & keep,
        clipped_high=inner.clipped_high & keep,
        dual_clipped=inner.dual_clipped & keep,
    )
    surrogate.extra_stats.update(correction_stats(weight, mask, mask & ~keep))
    surrogate.extra_stats["a3po_alpha_mean"] = MetricStat.masked_mean(alpha.double(), mask.any(dim=-1))
    return finalize_loss(batch, surrogate, config)
