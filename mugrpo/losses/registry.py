"""Registry of policy losses, looked up by ``PolicyLossConfig.name``, and what a loss needs from the trainer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mugrpo.losses.config import PolicyLossConfig
from mugrpo.losses.interface import LossContext, LossOutput, PolicyLossFn
from mugrpo.registry import Registry

#: Policy losses by ``PolicyLossConfig.name``; add one with ``@POLICY_LOSSES.register("name")``.
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


@dataclass(frozen=True)
class LossRequirements:
    """What a registered loss needs from the trainer beyond the four core tensors.

    Attributes:
        whole_groups: every group must sit whole in one micro-batch and one update (``train.group_minibatches``),
            because the loss compares the responses of a group with each other.
        positive_labels: each response needs a positive/negative label (``LossContext.positive``), computed by the
            data path from the rollout rows with ``PolicyLossConfig.positive_rule``.
    """

    whole_groups: bool = False
    positive_labels: bool = False


def requires(*, whole_groups: bool = False, positive_labels: bool = False) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator declaring a loss's :class:`LossRequirements` (apply it below ``@POLICY_LOSSES.register``)."""

    def mark(fn: PolicyLossFn) -> PolicyLossFn:
        fn.requirements = LossRequirements(whole_groups=whole_groups, positive_labels=positive_labels)
        return fn

    return mark


#: ``(config, clip_eps) -> (low, high)``: the ratio clip range of a loss, floats or [B] tensors (per response,
#: from ``LossContext.clip_eps`` [B] or None).
ClipRangeFn = Callable[[PolicyLossConfig, "torch.Tensor | None"], "tuple[torch.Tensor | float, torch.Tensor | float]"]


def clip_range(bounds: ClipRangeFn) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator declaring the importance-ratio clip range a loss applies (apply it below
    ``@POLICY_LOSSES.register``); the trainer's health panel counts the tokens whose ratio to the sampler falls
    outside it (``sampler_clip_frac``). A loss without one (e.g. conspo) declares none."""

    def mark(fn: PolicyLossFn) -> PolicyLossFn:
        fn.clip_range = bounds
        return fn

    return mark


def loss_clip_range(
    config: PolicyLossConfig, clip_eps: torch.Tensor | None = None
) -> tuple[torch.Tensor | float, torch.Tensor | float] | None:
    """The clip range [low, high] of the loss named by ``config.name`` for responses with per-group clip ranges
    ``clip_eps`` ([B] or None): floats or [B] tensors; None when the loss declares no clip range.

    Raises:
        UnknownNameError: no policy loss is registered as ``config.name``.
    """
    bounds = getattr(POLICY_LOSSES[config.name], "clip_range", None)
    return None if bounds is None else bounds(config, clip_eps)


def token_surrogate(fn: PolicyLossFn) -> PolicyLossFn:
    """Decorator declaring that a loss is a clipped token surrogate: at importance ratio 1 every response token's
    term is ``-A_i`` (no clip, no veto acts) and the terms are aggregated by ``PolicyLossConfig.agg_mode`` (PPO's
    clip, arXiv 1707.06347 Eq. 7; Mu-GRPO's relaxed clip). The harness audit recomputes such a loss's update-1 value
    from stored rows (:mod:`mugrpo.audit.normalizer`). Apply it below ``@POLICY_LOSSES.register``."""
    fn.token_surrogate = True
    return fn


def is_token_surrogate(name: str) -> bool:
    """Whether the loss registered as ``name`` declared :func:`token_surrogate`.

    Raises:
        UnknownNameError: no policy loss is registered as ``name``.
    """
    return bool(getattr(POLICY_LOSSES[name], "token_surrogate", False))


def loss_requirements(name: str) -> LossRequirements:
    """The :class:`LossRequirements` of the loss registered as ``name`` (none declared: no requirement).

    Raises:
        UnknownNameError: no policy loss is registered as ``name``.
    """
    return getattr(POLICY_LOSSES[name], "requirements", LossRequirements())


def check_trainer_settings(config: PolicyLossConfig, *, group_minibatches: bool) -> None:
    """Check that the training settings give the loss what it needs.

    Raises:
        ValueError: the loss needs whole groups per update and ``train.group_minibatches`` is off.
        UnknownNameError: unknown loss name.
    """
    if loss_requirements(config.name).whole_groups and not group_minibatches:
        raise ValueError(
            f"loss.name={config.name} compares the responses of a group with each other, so a group must never be "
            "split across updates or micro-batches: set train.group_minibatches=true"
        )


def compute_policy_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """Call the loss named by ``config.name`` (see :class:`PolicyLossFn` for the arguments).

    Raises:
        UnknownNameError: no policy loss is registered as ``config.name``.
    """
    fn = POLICY_LOSSES[config.name]
    return fn(logprobs, behavior_logprobs, advantages, response_mask, config, context=context)
