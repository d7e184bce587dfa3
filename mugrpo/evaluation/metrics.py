"""Evaluation metrics: avg@k, the unbiased pass@k, maj@k, and 95% confidence intervals clustered by problem
(single policy, and paired between two policies or runs)."""

from __future__ import annotations

import math
from dataclasses import dataclass
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


#: z of a two-sided 95% normal interval.
Z95 = 1.959963984540054


def maj_at_k(answers_per_problem: list[list[str | None]], correct_per_problem: list[list[bool]]) -> float:
    """maj@k: the share of problems whose majority answer over their k samples is correct (self-consistency,
    Wang et al. 2022, arXiv 2203.11171; the "maj@k" of Lewkowycz et al. 2022, arXiv 2206.14858).

    Answers are the verifier's extracted final answers, compared as stripped strings; samples with no answer (None
    or empty) do not vote. A tie goes to the answer seen first (lowest sample index), so the metric is deterministic.
    The voted answer is correct when the samples that gave it were scored correct (they agree: the verifier is a
    function of the answer). A problem with no answer at all counts as wrong.

    Raises:
        ValueError: the two lists, or a problem's answers and correctness, differ in length.
    """
    if len(answers_per_problem) != len(correct_per_problem):
        raise ValueError("maj@k needs one answer list and one correctness list per problem")
    if not answers_per_problem:
        return 0.0
    hits = 0
    for answers, correct in zip(answers_per_problem, correct_per_problem, strict=True):
        if len(answers) != len(correct):
            raise ValueError(f"maj@k: {len(answers)} answers but {len(correct)} correctness flags for one problem")
        votes: dict[str, list[int]] = {}
        for i, a in enumerate(answers):
            key = (a or "").strip()
            if key:
                votes.setdefault(key, []).append(i)
        if not votes:
            continue
        winner = max(votes.values(), key=lambda idx: (len(idx), -idx[0]))
        hits += bool(correct[winner[0]])
    return hits / len(answers_per_problem)


@dataclass(frozen=True)
class Interval:
    """A mean with its 95% confidence interval and standard error; ``n`` clusters (problems) behind it."""

    mean: float
    low: float
    high: float
    se: float
    n: int


def clustered_mean_ci(scores: list[float]) -> Interval:
    """Mean of per-problem scores with a 95% CI clustered by problem.

    Each problem is a cluster of its k samples: ``scores[i]`` is problem i's mean correctness (avg@k of the problem).
    SE = sqrt(sum_i (s_i - mean)^2 / (n (n - 1))), the cluster-robust standard error of the sample mean (Miller 2024,
    "Adding Error Bars to Evals", arXiv 2411.00640, eq. 4 with one cluster per problem and the n/(n-1) small-sample
    correction); the interval is mean +- 1.96 SE. With one problem the SE is undefined: the interval is [0, 1].
    """
    n = len(scores)
    if n == 0:
        return Interval(0.0, 0.0, 0.0, 0.0, 0)
    mean = sum(scores) / n
    if n == 1:
        return Interval(mean, 0.0, 1.0, float("nan"), 1)
    se = math.sqrt(sum((s - mean) ** 2 for s in scores) / (n * (n - 1)))
    return Interval(mean, mean - Z95 * se, mean + Z95 * se, se, n)


def paired_difference_ci(a: dict[str, float], b: dict[str, float]) -> Interval:
    """Mean difference ``a - b`` of per-problem scores over the problems both evaluated, with a paired 95% CI
    clustered by problem (Miller 2024, arXiv 2411.00640, section 4.2: paired differences remove the between-problem
    variance two policies share). Use it between two policies of one run, or between runs (per-problem scores first
    averaged over each run's seeds).

    Raises:
        ValueError: the two share no problem.
    """
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError("paired difference: the two evaluations share no problem")
    return clustered_mean_ci([a[p] - b[p] for p in common])
