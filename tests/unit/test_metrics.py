"""avg@k and the unbiased pass@k estimator (Chen et al. 2021, eq. 1) on hand-computed cases."""

from math import comb

import pytest

from mugrpo.evaluation.metrics import avg_at_k, mean_pass_at_k, pass_at_k


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - comb(3, 2) / comb(4, 2))  # 0.5
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - comb(3, 3) / comb(5, 3))  # 0.9
    assert pass_at_k(3, 1, 3) == 1.0  # n - c < k


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError, match="n=2, c=3"):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_avg_and_mean_pass():
    groups = [[True, False], [False, False], [True, True]]
    assert avg_at_k(groups) == pytest.approx((0.5 + 0 + 1) / 3)
    assert mean_pass_at_k(groups, 2) == pytest.approx((1 + 0 + 1) / 3)
    assert mean_pass_at_k(groups, 1) == pytest.approx(avg_at_k(groups))
    assert avg_at_k([]) == 0.0


def test_maj_at_k_votes_on_extracted_answers_with_ties_to_the_first_and_no_answer_abstaining():
    from mugrpo.evaluation.metrics import maj_at_k

    answers = [
        ["4", "5", "4", None],  # majority "4" (right)
        ["7", " 7", "3", "3"],  # tie 2-2 ("7" after strip): the first seen wins, "7" is wrong
        [None, "", None, "12"],  # one vote: "12", right
        [None, None, None, None],  # nobody answered: wrong
    ]
    correct = [
        [True, False, True, False],
        [False, False, True, True],
        [False, False, False, True],
        [False, False, False, False],
    ]
    assert maj_at_k(answers, correct) == 2 / 4
    with pytest.raises(ValueError):
        maj_at_k([["1"]], [[True, False]])


def test_clustered_ci_against_a_float64_reference_and_the_paired_difference():
    import numpy as np

    from mugrpo.evaluation.metrics import Z95, clustered_mean_ci, paired_difference_ci

    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, size=40) / 4  # avg@4 of 40 problems
    ci = clustered_mean_ci(list(scores))
    se = scores.std(ddof=1) / np.sqrt(len(scores))  # the clustered SE with one cluster per problem
    assert ci.mean == pytest.approx(scores.mean(), abs=1e-12) and ci.se == pytest.approx(se, rel=1e-12)
    assert (ci.low, ci.high) == pytest.approx((scores.mean() - Z95 * se, scores.mean() + Z95 * se), rel=1e-12)
    # Paired: a policy better by exactly 0.25 on every problem has a zero-width interval; the unpaired one does not.
    a = {f"p{i}": float(s) for i, s in enumerate(scores)}
    b = {p: s - 0.25 for p, s in a.items()}
    diff = paired_difference_ci(a, b)
    assert diff.mean == pytest.approx(0.25) and diff.high - diff.low == pytest.approx(0.0, abs=1e-12)
    assert diff.n == 40
    with pytest.raises(ValueError, match="share no problem"):
        paired_difference_ci({"x": 1.0}, {"y": 1.0})
