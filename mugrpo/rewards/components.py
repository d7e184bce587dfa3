"""Built-in reward components: ``math_correctness`` and ``format``.

``math_correctness`` calls math-verify (https://github.com/huggingface/Math-Verify) with its own signal-based
timeouts DISABLED (``parsing_timeout=None``, ``timeout_seconds=None``): they use ``signal.alarm``, which only
works on a main thread. The per-item time limit is enforced from outside instead, by the scorer's worker pool
(:mod:`mugrpo.rewards.pool`), which kills a worker that overruns it.

math-verify and sympy (0.25 s of CPU to import) load where a response is scored, never where a config is read:
``math_correctness`` imports :mod:`mugrpo.rewards.equivalence` when it first runs, and names it in its ``preload``,
so the scorer's workers import it once, at start, off every item's clock (:func:`mugrpo.rewards.scorer._init_worker`).
"""

from __future__ import annotations

from mugrpo.data.answers import extract_boxed
from mugrpo.rewards.registry import REWARD_FUNCTIONS, RewardInput

__all__ = ["format_reward", "math_correctness"]


@REWARD_FUNCTIONS.register("math_correctness")
def math_correctness(item: RewardInput, answer: str | None) -> float:
    """1.0 if the predicted answer is mathematically equivalent to the gold answer, else 0.0.

    Equivalence is :func:`mugrpo.rewards.equivalence.answers_equivalent`: math-verify's ``verify(gold, pred)``
    (gold FIRST: asymmetric) after our normalizations and guards, so ``\\frac{1}{2}``, ``0.5`` and ``\\dfrac12``
    match, several final boxes are graded as a set equal to the gold set, and ``1 000``, ``1,000.99€`` and
    ``\\mathrm{e}`` read as intended. A response with no extracted answer, or one that cannot be parsed, scores 0.0.
    """
    if not answer:
        return 0.0
    from mugrpo.rewards.equivalence import answers_equivalent

    return 1.0 if answers_equivalent(item.ground_truth, answer) else 0.0


math_correctness.preload = ("mugrpo.rewards.equivalence",)  # what each scorer worker imports at start


@REWARD_FUNCTIONS.register("format")
def format_reward(item: RewardInput, answer: str | None) -> float:
    """1.0 if the response states its final answer in a complete, non-empty ``\\boxed{...}``, else 0.0."""
    return 1.0 if extract_boxed(item.response_text) else 0.0
