"""Registry of policy losses, looked up by ``PolicyLossConfig.name``, and what a loss needs from the trainer."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from mugrpo.common.lazy import torch
from mugrpo.common.registry import Registry
from mugrpo.losses.config import PolicyLossConfig
from mugrpo.losses.inputs import ROLLOUT_INPUTS, RowFn
from mugrpo.losses.interface import LossContext, LossOutput, PolicyLossFn

#: Policy losses by ``PolicyLossConfig.name``; add one with ``@POLICY_LOSSES.register("name")``.
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


@dataclass(frozen=True)
class LossRequirements:
    """What a registered loss needs from the trainer beyond the four core tensors.

    Attributes:
        whole_groups: every group must sit whole in one micro-batch and one update (``train.group_minibatches``),
            because the loss compares the responses of a group with each other.
        inputs: names of the per-rollout inputs it reads from ``LossContext.inputs``, each provided by a rollout
            input (:data:`mugrpo.losses.inputs.ROLLOUT_INPUTS`) or by an algorithm (``Algorithm.inputs``).
    """

    whole_groups: bool = False
    inputs: tuple[str, ...] = ()


def requires(*, whole_groups: bool = False, inputs: tuple[str, ...] = ()) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator declaring a loss's :class:`LossRequirements` (apply it below ``@POLICY_LOSSES.register``)."""

    def mark(fn: PolicyLossFn) -> PolicyLossFn:
        fn.requirements = LossRequirements(whole_groups=whole_groups, inputs=tuple(inputs))
        return fn

    return mark


#: ``(config, inputs) -> (low, high) | None``: the ratio clip range of a loss, floats or [B] tensors (per response,
#: from the batch's per-rollout inputs, e.g. AGPO's ``clip_eps``), or None where the inputs give none.
ClipRangeFn = Callable[
    [PolicyLossConfig, "Mapping[str, torch.Tensor]"], "tuple[torch.Tensor | float, torch.Tensor | float] | None"
]


def clip_range(bounds: ClipRangeFn) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator declaring the importance-ratio clip range a loss applies (apply it below
    ``@POLICY_LOSSES.register``); the trainer's health panel counts the tokens whose ratio to the sampler falls
    outside it (``sampler_clip_frac``). A loss without one (e.g. conspo) declares none."""

    def mark(fn: PolicyLossFn) -> PolicyLossFn:
        fn.clip_range = bounds
        return fn

    return mark


def loss_clip_range(
    config: PolicyLossConfig, inputs: Mapping[str, torch.Tensor] | None = None
) -> tuple[torch.Tensor | float, torch.Tensor | float] | None:
    """The clip range [low, high] of the loss named by ``config.name`` for responses with the per-rollout
    ``inputs`` of their batch (``TokenBatch.inputs``): floats or [B] tensors; None when the loss declares no clip
    range (or its inputs are absent).

    Raises:
        UnknownNameError: no policy loss is registered as ``config.name``.
    """
    bounds = getattr(POLICY_LOSSES[config.name], "clip_range", None)
    return None if bounds is None else bounds(config, inputs or {})


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


def check_trainer_settings(
    config: PolicyLossConfig,
    *,
    group_minibatches: bool,
    provided: Collection[str] | None = None,
    reward_components: Collection[str] | None = None,
) -> None:
    """Check that the training settings give the loss what it needs.

    Args:
        provided: the loss inputs the run's algorithms provide (``Algorithm.inputs`` of those on); None: not
            known here (the inputs are then not checked).
        reward_components: the run's reward components, checked by the loss's rollout inputs
            (:attr:`~mugrpo.losses.inputs.RolloutInput.check`); None: not known here.

    Raises:
        ValueError: the loss needs whole groups per update and ``train.group_minibatches`` is off, or an input
            that neither a rollout input nor an algorithm of the run provides.
        UnknownNameError: unknown loss name.
    """
    needs = loss_requirements(config.name)
    if needs.whole_groups and not group_minibatches:
        raise ValueError(
            f"loss.name={config.name} compares the responses of a group with each other, so a group must never be "
            "split across updates or micro-batches: set train.group_minibatches=true"
        )
    if reward_components is not None:
        for name in needs.inputs:
            check = ROLLOUT_INPUTS[name].check if name in ROLLOUT_INPUTS else None
            if check is not None:
                check(config, reward_components)
    if provided is None:
        return
    missing = [n for n in needs.inputs if n not in ROLLOUT_INPUTS and n not in provided]
    if missing:
        raise ValueError(
            f"loss.name={config.name} needs the per-rollout input(s) {missing}, which no rollout input "
            f"(mugrpo.losses.inputs) and no algorithm on in this run provides (provided: {sorted(provided) or 'none'})"
        )


def row_inputs(config: PolicyLossConfig) -> dict[str, RowFn]:
    """The row functions of the rollout inputs the loss ``config.name`` declares, by name ({}: none): the data path
    applies each to every rollout row it loads (:func:`mugrpo.trainer.data.load_rollouts`).

    Raises:
        UnknownNameError: unknown loss name.
    """
    return {n: ROLLOUT_INPUTS[n].make(config) for n in loss_requirements(config.name).inputs if n in ROLLOUT_INPUTS}


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
