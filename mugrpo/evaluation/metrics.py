"""Evaluation metrics: avg@k and the unbiased pass@k estimator."""

from __future__ import annotations

from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: 1 - C(n-c, k) / C(n, k).

    Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (arXiv 2107.03374), eq. 1.

    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def avg_at_k(correct_per_problem: list[list[bool]]) -> float:
    """avg@k: mean accuracy over all k samples of all problems (each problem weighs the same)."""
    if not correct_per_problem:
        return 0.0
    return sum(sum(c) / len(c) for c in correct_per_problem) / len(correct_per_problem)


def mean_pass_at_k(correct_per_problem: list[list[bool]], k: int) -> float:
    """Mean over problems of the unbiased pass@k (each problem has n >= k samples)."""
    if not correct_per_problem:
        return 0.0
    return sum(pass_at_k(len(c), sum(c), k) for c in correct_per_problem) / len(correct_per_problem)
