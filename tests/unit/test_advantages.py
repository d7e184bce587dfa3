"""Group advantage estimators against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from mugrpo.scoring.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    compute_advantages,
    group_stats,
)

# Group "a": rewards [1, 0, 0, 1] -> mean 0.5, sample std sqrt(1/3) = 0.57735, population std 0.5.
# Group "b": rewards [1, 1, 1, 1] -> zero variance.
# Group "c": rewards [0, 0, 1, 0] -> mean 0.25, sample std 0.5, population std sqrt(3)/4 = 0.43301.
GROUPS = {"a": [1.0, 0.0, 0.0, 1.0], "b": [1.0, 1.0, 1.0, 1.0], "c": [0.0, 0.0, 1.0, 0.0]}
EPS = 1e-6
SAMPLE_STD = {"a": math.sqrt(1 / 3), "c": 0.5}
POP_STD = {"a": 0.5, "c": math.sqrt(3) / 4}


def _flat() -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([g for g, rs in GROUPS.items() for _ in rs])
    rewards = np.array([r for rs in GROUPS.values() for r in rs])
    return rewards, ids


def _expected(estimator: str, std: dict[str, float]) -> np.ndarray:
    out = []
    for g, rs in GROUPS.items():
        mean = sum(rs) / len(rs)
        for r in rs:
            if g == "b":
                out.append(0.0)
            elif estimator == "grpo":
                out.append((r - mean) / (std[g] + EPS))
            else:
                out.append(r - mean)
    return np.array(out)


def test_registry_holds_both_estimators_and_rejects_unknown_names() -> None:
    assert {"grpo", "dr_grpo"} <= set(ADVANTAGE_ESTIMATORS)
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'; registered: agpo, dr_grpo, grpo"):
        ADVANTAGE_ESTIMATORS["ppo"]
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        ADVANTAGE_ESTIMATORS.register("grpo")(ADVANTAGE_ESTIMATORS["dr_grpo"])
    with pytest.raises(ValidationError, match="unknown advantage estimator 'ppo'"):
        AdvantageConfig(estimator="ppo")


@pytest.mark.parametrize(("ddof", "std", "first"), [(1, SAMPLE_STD, 0.866025), (0, POP_STD, 1.0)])
def test_grpo_hand_computed(ddof: int, std: dict[str, float], first: float) -> None:
    rewards, ids = _flat()
    adv, zero_var = compute_advantages(rewards, ids, AdvantageConfig(std_ddof=ddof), expected_group_size=4)
    assert adv.dtype == np.float32 and zero_var.dtype == np.bool_
    np.testing.assert_allclose(adv, _expected("grpo", std), rtol=1e-6)
    # Group a's first response: 0.5 / 0.57735 = 0.866025 (sample std) or 0.5 / 0.5 = 1.0 (population std).
    assert adv[0] == pytest.approx(first, rel=1e-5)
    np.testing.assert_array_equal(zero_var, [False] * 4 + [True] * 4 + [False] * 4)


def test_dr_grpo_hand_computed() -> None:
    rewards, ids = _flat()
    adv, zero_var = compute_advantages(rewards, ids, AdvantageConfig(estimator="dr_grpo"))
    np.testing.assert_allclose(adv, [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, -0.25, -0.25, 0.75, -0.25], atol=1e-7)
    assert zero_var.sum() == 4


def test_zero_variance_is_exactly_zero_even_when_the_float_mean_is_not() -> None:
    # mean([0.1, 0.1, 0.1]) = 0.10000000000000002 in float64: r - mean is -1.4e-17, which / eps would leak.
    adv, zero_var = compute_advantages([0.1, 0.1, 0.1], [7, 7, 7], AdvantageConfig())
    np.testing.assert_array_equal(adv, [0.0, 0.0, 0.0])
    assert zero_var.all()


def test_a_group_of_one_is_zero_variance() -> None:
    adv, zero_var = compute_advantages([3.0, 1.0, 0.0], ["x", "y", "y"], AdvantageConfig())
    assert adv[0] == 0.0 and zero_var.tolist() == [True, False, False]


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo"])
def test_shuffled_and_interleaved_groups_match_the_sorted_result(estimator: str) -> None:
    rewards, ids = _flat()
    config = AdvantageConfig(estimator=estimator)
    sorted_adv, sorted_zv = compute_advantages(rewards, ids, config)
    perm = np.random.default_rng(0).permutation(len(rewards))
    adv, zero_var = compute_advantages(rewards[perm], ids[perm], config)
    np.testing.assert_array_equal(adv, sorted_adv[perm])
    np.testing.assert_array_equal(zero_var, sorted_zv[perm])


def test_torch_inputs_give_the_same_numpy_outputs() -> None:
    rewards, _ = _flat()
    int_ids = np.repeat([10, 20, 30], 4)
    adv_np, zv_np = compute_advantages(rewards, int_ids, AdvantageConfig())
    adv_t, zv_t = compute_advantages(
        torch.tensor(rewards, dtype=torch.float32), torch.tensor(int_ids), AdvantageConfig()
    )
    np.testing.assert_allclose(adv_t, adv_np, rtol=1e-6)
    np.testing.assert_array_equal(zv_t, zv_np)


def test_incomplete_group_is_rejected_with_its_id() -> None:
    rewards, ids = _flat()
    with pytest.raises(ValueError, match=r"expected group size 4: 'c' has 3"):
        compute_advantages(rewards[:-1], ids[:-1], AdvantageConfig(), expected_group_size=4)


@pytest.mark.parametrize(
    ("rewards", "ids", "message"),
    [
        ([1.0, 2.0], [0], "rewards has 2 entries but group_ids has 1"),
        ([[1.0]], [[0]], "must be 1-D"),
        ([], [], "N = 0"),
        ([1.0, float("nan")], [0, 0], "entry 1 is nan"),
    ],
)
def test_malformed_inputs_are_rejected(rewards: list, ids: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compute_advantages(rewards, ids, AdvantageConfig())


def test_group_stats_broadcasts_group_values() -> None:
    stats = group_stats([2.0, 4.0, 5.0], ["g", "h", "g"], ddof=0)
    np.testing.assert_allclose(stats.mean, [3.5, 4.0, 3.5])
    np.testing.assert_allclose(stats.std, [1.5, 0.0, 1.5])
    assert stats.size.tolist() == [2, 1, 2]
    assert stats.zero_variance.tolist() == [False, True, False]
