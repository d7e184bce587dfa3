"""Registry of reward components, looked up by the names used in ``RewardConfig.components``.

A reward component scores one response against its gold answer::

    fn(item: RewardInput, answer: str | None) -> float

``answer`` is the response's predicted answer as extracted by :func:`mugrpo.answers.extract_answer`
(computed once per response and shared by all components). Components run inside the scorer's worker
processes, so they must be module-level functions (picklable by reference) and their module must be
importable in a fresh interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["REWARD_FUNCTIONS", "RewardFn", "RewardInput", "get_reward_fn", "register_reward"]


@dataclass(frozen=True, slots=True)
class RewardInput:
    """One response to score."""

    response_text: str
    """The sampled response, decoded (prompt excluded)."""
    ground_truth: str
    """Gold answer string, as produced by :func:`mugrpo.answers.extract_gold`."""


RewardFn = Callable[[RewardInput, "str | None"], float]
"""``fn(item, answer) -> float``: one reward component of one response."""

REWARD_FUNCTIONS: dict[str, RewardFn] = {}
"""Reward components by name; fill with :func:`register_reward`."""


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering a reward component under ``name``.

    Re-registering a function of the same qualified name (its module imported twice, e.g. once as
    ``__main__``) replaces it; a different function under a taken name raises ``ValueError``.
    """

    def decorator(fn: RewardFn) -> RewardFn:
        existing = REWARD_FUNCTIONS.get(name)
        if existing is not None and existing.__qualname__ != fn.__qualname__:
            raise ValueError(f"reward component {name!r} is already registered ({existing.__module__})")
        REWARD_FUNCTIONS[name] = fn
        return fn

    return decorator


def get_reward_fn(name: str) -> RewardFn:
    """The reward component registered as ``name``.

    Raises:
        ValueError: unknown name; the message lists the registered ones.
    """
    try:
        return REWARD_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown reward component {name!r}; registered: {sorted(REWARD_FUNCTIONS)}") from None
