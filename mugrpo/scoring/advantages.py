"""Group-relative advantage estimators (one registry, looked up by ``AdvantageConfig.estimator``).

A *group* is the G responses sampled for one prompt. Every estimator maps a flat batch of scalar
rewards and the group id of each response to one advantage per response, computed only from that
response's own group, and flags the responses of *zero-variance* groups (every member got the same
reward: the group carries no learning signal).

Estimators
----------
``grpo``
    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)  (DeepSeekMath / GRPO, arXiv 2402.03300, Sec. 4.1.2,
    outcome supervision). ``std`` is the *sample* standard deviation (Bessel's correction, ddof=1) by default,
    as in verl's and TRL's GRPO (``torch.std`` is unbiased); ``AdvantageConfig.std_ddof=0`` selects the
    population one. The paper's formula does not say which.
``dr_grpo``
    A_i = r_i - mean(r_group), no division by std (Dr. GRPO, arXiv 2503.20783, Sec. 3.1: the std
    normalisation biases updates towards too-easy and too-hard questions).

An algorithm package may register its own estimator (AGPO's dispersion-normalized ``agpo``,
:mod:`mugrpo.algorithms.agpo.advantages`).

Zero-variance groups get advantage exactly 0 under every estimator (set explicitly: with floats,
``r - mean`` of equal rewards can be ~1e-17, which ``/ (0 + eps)`` would blow up to ~1e-11 or worse),
and ``zero_variance`` is True for each of their responses. A group of one response is zero-variance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mugrpo.common.registry import Registry

if TYPE_CHECKING:
    import torch

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageConfig",
    "AdvantageFn",
    "GroupStats",
    "compute_advantages",
    "group_stats",
]

ArrayLike: TypeAlias = "np.ndarray | torch.Tensor | Sequence[Any]"
AdvantageFn: TypeAlias = Callable[[ArrayLike, ArrayLike, "AdvantageConfig"], tuple[np.ndarray, np.ndarray]]
"""``fn(rewards [N], group_ids [N], config) -> (advantages [N] float32, zero_variance [N] bool)``."""

ADVANTAGE_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")
"""Advantage estimators by name; add one with ``@ADVANTAGE_ESTIMATORS.register("name")``."""


class AdvantageConfig(BaseModel):
    """How rewards become advantages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    estimator: str = Field(
        "grpo",
        description="Registered estimator name: 'grpo' (GRPO, arXiv 2402.03300), 'dr_grpo' "
        "(Dr. GRPO, arXiv 2503.20783) or 'agpo' (dispersion-normalized, AGPO arXiv 2605.20722).",
    )
    eps: float = Field(
        1e-6,
        gt=0.0,
        description="Added to the group std in the GRPO denominator (arXiv 2402.03300 leaves it unspecified; "
        "1e-6 as in verl; TRL uses 1e-4).",
    )
    std_ddof: int = Field(
        1,
        ge=0,
        le=1,
        description="Delta degrees of freedom of the group std used by 'grpo': 1 = sample std (Bessel; verl and "
        "TRL), 0 = population std. The GRPO paper does not specify.",
    )

    dispersion: Literal["std", "mad", "iqr"] = Field(
        "std",
        description="Reward dispersion of AGPO (arXiv 2605.20722), used by the 'agpo' estimator and AGPO's probe "
        "sigma: std (sample std), mad (median absolute deviation x 1.4826) or iqr (interquartile range / 1.349).",
    )

    @field_validator("estimator")
    @classmethod
    def _known_estimator(cls, name: str) -> str:
        ADVANTAGE_ESTIMATORS[name]  # raises UnknownNameError (a ValueError) listing the registered names
        return name


@dataclass(frozen=True)
class GroupStats:
    """Per-response statistics of each response's group; every array has shape [N]."""

    rewards: np.ndarray
    """float64 rewards."""
    mean: np.ndarray
    """float64 mean reward of the response's group."""
    std: np.ndarray
    """float64 std of the group's rewards (``ddof`` as requested; 0 for zero-variance groups)."""
    size: np.ndarray
    """int64 number of responses in the group."""
    zero_variance: np.ndarray
    """bool: every reward of the group is equal (or the group has one response)."""
    group: np.ndarray
    """int64 index of the response's group (groups numbered in sorted group id order)."""


def _to_numpy(values: ArrayLike) -> np.ndarray:
    """numpy view of a numpy array, a sequence, or a torch tensor (duck-typed: no torch import here)."""
    if hasattr(values, "detach"):
        return values.detach().cpu().numpy()
    return np.asarray(values)


def group_stats(rewards: ArrayLike, group_ids: ArrayLike, ddof: int = 1) -> GroupStats:
    """Group mean/std/size of each response, broadcast back to the responses.

    Args:
        rewards: [N] scalar rewards (numpy, torch or a sequence).
        group_ids: [N] group (prompt) id of each response: ints or strings; responses of a group may be in
            any order and interleaved with other groups.
        ddof: 1 for the sample std, 0 for the population std.

    Raises:
        ValueError: not 1-D, lengths differ, N = 0, or a reward is NaN/inf.
    """
    r = _to_numpy(rewards).astype(np.float64)
    ids = _to_numpy(group_ids)
    if r.ndim != 1 or ids.ndim != 1:
        raise ValueError(f"rewards and group_ids must be 1-D, got shapes {r.shape} and {ids.shape}")
    if r.shape != ids.shape:
        raise ValueError(f"rewards has {r.shape[0]} entries but group_ids has {ids.shape[0]}")
    if r.size == 0:
        raise ValueError("no rewards given (N = 0)")
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
        raise ValueError(f"rewards must be finite; entry {int(bad[0])} is {float(r[bad[0]])!r}")

    _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    sums = np.bincount(inverse, weights=r)
    means = sums / counts
    centered = r - means[inverse]
    sq = np.bincount(inverse, weights=centered**2)
    group_min = np.full(counts.shape, np.inf)
    group_max = np.full(counts.shape, -np.inf)
    np.minimum.at(group_min, inverse, r)
    np.maximum.at(group_max, inverse, r)
    zero_var = (group_min == group_max) | (counts <= ddof)
    denom = np.maximum(counts - ddof, 1)
    stds = np.where(zero_var, 0.0, np.sqrt(sq / denom))
    return GroupStats(
        rewards=r,
        mean=means[inverse],
        std=stds[inverse],
        size=counts[inverse].astype(np.int64),
        zero_variance=zero_var[inverse],
        group=inverse.astype(np.int64),
    )


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards: ArrayLike, group_ids: ArrayLike, config: AdvantageConfig) -> tuple[np.ndarray, np.ndarray]:
    """GRPO group-normalised advantage A_i = (r_i - mean) / (std + eps) (arXiv 2402.03300, Sec. 4.1.2).

    Shapes: rewards [N], group_ids [N] -> advantages [N] float32, zero_variance [N] bool.
    """
    stats = group_stats(rewards, group_ids, ddof=config.std_ddof)
    adv = (stats.rewards - stats.mean) / (stats.std + config.eps)
    adv[stats.zero_variance] = 0.0
    return adv.astype(np.float32), stats.zero_variance


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo_advantages(
    rewards: ArrayLike, group_ids: ArrayLike, config: AdvantageConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Dr. GRPO advantage A_i = r_i - mean, no std normalisation (arXiv 2503.20783, Sec. 3.1).

    Shapes: rewards [N], group_ids [N] -> advantages [N] float32, zero_variance [N] bool.
    """
    stats = group_stats(rewards, group_ids, ddof=config.std_ddof)
    adv = stats.rewards - stats.mean
    adv[stats.zero_variance] = 0.0
    return adv.astype(np.float32), stats.zero_variance


def compute_advantages(
    rewards: ArrayLike,
    group_ids: ArrayLike,
    config: AdvantageConfig,
    *,
    expected_group_size: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages of a batch with the estimator named by ``config.estimator``.

    Args:
        rewards: [N] scalar rewards.
        group_ids: [N] group id (e.g. prompt id) of each response, any order.
        config: estimator choice and its parameters.
        expected_group_size: G; when given, every group must hold exactly G responses (an incomplete group
            would be normalised with the wrong statistics).

    Returns:
        ``(advantages [N] float32, zero_variance [N] bool)`` as numpy arrays, in the input order.

    Raises:
        ValueError: malformed inputs, or a group whose size differs from ``expected_group_size`` (the
            message names the group and its size).
    """
    if expected_group_size is not None:
        ids = _to_numpy(group_ids)
        uniq, counts = np.unique(ids, return_counts=True)
        wrong = np.flatnonzero(counts != expected_group_size)
        if wrong.size:
            examples = ", ".join(f"{uniq[i].item()!r} has {int(counts[i])}" for i in wrong[:5])
            raise ValueError(
                f"{wrong.size} group(s) do not have the expected group size {expected_group_size}: {examples}"
            )
    estimator = ADVANTAGE_ESTIMATORS[config.estimator]
    return estimator(rewards, group_ids, config)
