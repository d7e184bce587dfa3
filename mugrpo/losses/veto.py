"""Negative-advantage veto of Mu-GRPO (arXiv 2605.17570).

In a response with advantage A < 0, a token whose importance ratio rho_t = pi_theta / pi_behav has fallen below a
tiny threshold delta is a *trigger*: the policy has already pushed that token down almost to zero, and continuing to
push the tokens around it down collapses the policy. kappa is the first trigger of the response. The veto removes
tokens from the loss in one of four scopes (the paper's notation):

========================  =================================================================
``trigger`` (T)           the trigger tokens only (the paper: still collapses)
``suffix`` (S_kappa)      every response token at a position t > kappa (kappa itself is kept)
``non_trigger_suffix``    S_kappa minus the trigger tokens (H_kappa = S_kappa \\ T)
``sequence`` (S_seq)      the whole response, once it has a trigger
========================  =================================================================

The mask is recomputed at every update from the current ratios and carries no gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from mugrpo.common.lazy import torch

# (trigger [B, T], after_kappa [B, T], response_mask [B, T]) -> vetoed [B, T]; all bool
VetoScopeFn = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]
VETO_SCOPES: dict[str, VetoScopeFn] = {}


def _register(name: str) -> Callable[[VetoScopeFn], VetoScopeFn]:
    def add(fn: VetoScopeFn) -> VetoScopeFn:
        VETO_SCOPES[name] = fn
        return fn

    return add


@_register("trigger")
def _trigger_only(trigger: torch.Tensor, after_kappa: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return trigger


@_register("suffix")
def _suffix(trigger: torch.Tensor, after_kappa: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return after_kappa & mask


@_register("non_trigger_suffix")
def _non_trigger_suffix(trigger: torch.Tensor, after_kappa: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return after_kappa & mask & ~trigger


@_register("sequence")
def _sequence(trigger: torch.Tensor, after_kappa: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return trigger.any(dim=-1, keepdim=True) & mask


@dataclass(frozen=True)
class VetoInfo:
    """What the veto saw and did (all detached).

    Attributes:
        trigger_mask: [B, T] bool, the trigger tokens (response token, A_t < 0, rho_t < delta).
        first_trigger: [B] int64, kappa of each response, -1 when it has no trigger.
        vetoed_mask: [B, T] bool, response tokens removed from the loss (the complement of keep_mask within
            response_mask).
    """

    trigger_mask: torch.Tensor
    first_trigger: torch.Tensor
    vetoed_mask: torch.Tensor


def _first_true_position(flags: torch.Tensor) -> torch.Tensor:
    """[B, T] bool -> [B] int64 index of the first True of each row, -1 for a row without one."""
    if flags.shape[-1] == 0:
        return torch.full(flags.shape[:-1], -1, dtype=torch.long, device=flags.device)
    first = flags.long().argmax(dim=-1)  # argmax returns the first maximal index
    return torch.where(flags.any(dim=-1), first, -1)


def negative_advantage_veto_mask(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    delta: float,
    scope: str,
) -> tuple[torch.Tensor, VetoInfo]:
    """Mask of the tokens that stay in the loss after Mu-GRPO's negative-advantage veto.

    Args:
        log_ratio: [B, T] log(pi_theta / pi_behav) per token (any float dtype; compared in log space, so a
            ratio of 1e-30 is handled exactly).
        advantages: [B] sequence-level or [B, T] token-level advantages. A token can be a trigger only where
            its advantage is < 0 (with [B] advantages: only in responses with A < 0).
        response_mask: [B, T] bool (or 0/1), True on response tokens.
        delta: trigger threshold in (0, 1): a token is a trigger when rho_t < delta.
        scope: "trigger", "suffix", "non_trigger_suffix" or "sequence" (see the module docstring).

    Returns:
        keep_mask: [B, T] bool, response tokens that stay in the loss.
        info: :class:`VetoInfo`.

    Raises:
        ValueError: unknown scope, delta outside (0, 1), or mismatched shapes.
    """
    try:
        scope_fn = VETO_SCOPES[scope]
    except KeyError:
        raise ValueError(f"unknown veto_scope {scope!r}; known: {', '.join(sorted(VETO_SCOPES))}") from None
    if not 0.0 < delta < 1.0:
        raise ValueError(f"veto delta must be in (0, 1), got {delta}")
    if log_ratio.shape != response_mask.shape:
        raise ValueError(f"log_ratio {tuple(log_ratio.shape)} and response_mask {tuple(response_mask.shape)} differ")
    with torch.no_grad():  # a mask: no gradient flows through it
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(-1)
        mask = response_mask.bool()
        trigger = mask & (advantages < 0) & (log_ratio < math.log(delta))
        triggers_so_far = trigger.cumsum(dim=-1)
        after_kappa = (triggers_so_far - trigger.long()) > 0  # a trigger occurred strictly before t
        first_trigger = _first_true_position(trigger)
        vetoed = scope_fn(trigger, after_kappa, mask)
        return mask & ~vetoed, VetoInfo(trigger, first_trigger, vetoed)
