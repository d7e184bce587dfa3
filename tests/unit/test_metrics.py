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
