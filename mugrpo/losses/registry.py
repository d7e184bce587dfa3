"""Registry of policy losses, looked up by ``PolicyLossConfig.name``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mugrpo.losses.config import PolicyLossConfig
from mugrpo.losses.interface import LossContext, LossOutput, PolicyLossFn

POLICY_LOSSES: dict[str, PolicyLossFn] = {}


class UnknownPolicyLossError(LookupError):
    """Raised when a policy loss name is not registered."""


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering ``fn`` as the policy loss called ``name``.

    Raises:
        ValueError: ``name`` is already registered (two losses silently sharing a name would be a config bug).
    """

    def add(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered ({POLICY_LOSSES[name]!r})")
        POLICY_LOSSES[name] = fn
        return fn

    return add


def registered_policy_losses() -> list[str]:
    """Sorted names of the registered policy losses."""
    return sorted(POLICY_LOSSES)


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``.

    Raises:
        UnknownPolicyLossError: no such loss; the message lists the registered names.
    """
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise UnknownPolicyLossError(
            f"unknown policy loss {name!r}; registered: {', '.join(registered_policy_losses())}"
        ) from None


def compute_policy_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """Call the loss named by ``config.name`` (see :class:`PolicyLossFn` for the arguments)."""
    fn = get_policy_loss(config.name)
    return fn(logprobs, behavior_logprobs, advantages, response_mask, config, context=context)
