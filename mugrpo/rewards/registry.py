"""Registry of reward components, looked up by the names used in ``RewardConfig.components``.

A reward component scores one response against its gold answer::

    fn(item: RewardInput, answer: str | None) -> float

``answer`` is the response's predicted answer as extracted by :func:`mugrpo.data.answers.extract_answer`
(computed once per response and shared by all components). Both ``answer`` and ``item.ground_truth`` may hold several
answers, encoded as ``\\boxed{a}, \\boxed{b}`` (:func:`mugrpo.data.answers.join_answers`; read them back with
:func:`mugrpo.data.answers.split_answers`). Components run inside the scorer's worker
processes, so they must be module-level functions (picklable by reference) and their module must be
importable in a fresh interpreter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mugrpo.common.registry import Registry

__all__ = ["REWARD_FUNCTIONS", "RewardFn", "RewardInput"]


@dataclass(frozen=True, slots=True)
class RewardInput:
    """One response to score."""

    response_text: str
    """The sampled response, decoded (prompt excluded)."""
    ground_truth: str
    """Gold answer string, as produced by :func:`mugrpo.data.answers.extract_gold`."""
    task_ref: str | None = None
    """reasoning-gym problems: the task entry that scores them (:attr:`mugrpo.data.datasets.Problem.task_ref`)."""

    @classmethod
    def for_problem(cls, problem, response_text: str) -> RewardInput:
        """The input scoring ``response_text`` against a :class:`mugrpo.data.datasets.Problem`."""
        return cls(response_text, problem.ground_truth, problem.task_ref)


RewardFn = Callable[[RewardInput, "str | None"], float]
"""``fn(item, answer) -> float``: one reward component of one response."""

REWARD_FUNCTIONS: Registry[RewardFn] = Registry("reward component")
"""Reward components by name; add one with ``@REWARD_FUNCTIONS.register("name")`` (a module-level function)."""
