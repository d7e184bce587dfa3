"""Built-in reward components: ``math_correctness`` and ``format``.

``math_correctness`` calls math-verify (https://github.com/huggingface/Math-Verify) with its own signal-based
timeouts DISABLED (``parsing_timeout=None``, ``timeout_seconds=None``): they use ``signal.alarm``, which only
works on a main thread. The per-item time limit is enforced from outside instead, by the scorer's worker pool
(:mod:`mugrpo.rewards.pool`), which kills a worker that overruns it.
"""

from __future__ import annotations

from functools import lru_cache

from math_verify import parse, verify

from mugrpo.answers import extract_boxed
from mugrpo.rewards.registry import REWARD_FUNCTIONS, RewardInput

__all__ = ["format_reward", "math_correctness"]


def _as_boxed(answer: str) -> str:
    # Both sides go through the same LaTeX path of math-verify: a box is its highest-priority target.
    return f"\\boxed{{{answer}}}"


@lru_cache(maxsize=1024)
def _parse_gold(ground_truth: str) -> list:
    """Parsed gold (sympy objects or strings); cached because the G responses of a group share it."""
    return parse(_as_boxed(ground_truth), parsing_timeout=None)


@REWARD_FUNCTIONS.register("math_correctness")
def math_correctness(item: RewardInput, answer: str | None) -> float:
    """1.0 if the predicted answer is mathematically equivalent to the gold answer, else 0.0.

    Equivalence is math-verify's ``verify(gold, pred)`` (gold FIRST: the relation is asymmetric, e.g.
    for assignments ``x = 2`` and intervals), so ``\\frac{1}{2}``, ``0.5`` and ``\\dfrac12`` match.
    A response with no extracted answer, or one math-verify cannot parse, scores 0.0.
    """
    if not answer:
        return 0.0
    gold = _parse_gold(item.ground_truth)
    pred = parse(_as_boxed(answer), parsing_timeout=None)
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0


@REWARD_FUNCTIONS.register("format")
def format_reward(item: RewardInput, answer: str | None) -> float:
    """1.0 if the response states its final answer in a complete, non-empty ``\\boxed{...}``, else 0.0."""
    return 1.0 if extract_boxed(item.response_text) else 0.0
