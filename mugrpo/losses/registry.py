"""Registry of policy losses, looked up by ``PolicyLossConfig.name``."""

from __future__ import annotations

import torch

from mugrpo.losses.config import PolicyLossConfig
from mugrpo.losses.interface import LossContext, LossOutput, PolicyLossFn
from mugrpo.registry import Registry

#: Policy losses by ``PolicyLossConfig.name``; add one with ``@POLICY_LOSSES.register("name")``.
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


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
