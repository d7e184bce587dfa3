"""AGPO's pure parts (arXiv 2605.20722): probe statistics, controllers, eps formula, advantage; all hand-computed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mugrpo.algorithms.agpo import (
    AGPOConfig,
    ClipRangeController,
    TemperatureController,
    adaptive_eps,
    dispersion,
    probe_stats,
    skewness,
    vote_entropy,
)
from mugrpo.algorithms.agpo.controllers import kl_step
from mugrpo.algorithms.agpo.stats import robust_dispersion
from mugrpo.scoring.advantages import AdvantageConfig, compute_advantages


def test_dispersion_scales_by_hand():
    # [0, 0, 1, 1]: mean 0.5, sample var = 4 * 0.25 / 3; median 0.5, |dev| all 0.5; q25 = 0, q75 = 1 (linear).
    r = [0.0, 0.0, 1.0, 1.0]
    assert dispersion(r, "std") == pytest.approx(math.sqrt(1 / 3))
    assert dispersion(r, "mad") == pytest.approx(1.4826 * 0.5)
    assert dispersion(r, "iqr") == pytest.approx(1 / 1.349)
    # [0, 0, 0, 1]: q75 sits at position 2.25 -> 0.25; MAD is 0 (median 0, 3 of 4 deviations are 0).
    r = [0.0, 0.0, 0.0, 1.0]
    assert dispersion(r, "std") == pytest.approx(0.5)
    assert dispersion(r, "iqr") == pytest.approx(0.25 / 1.349)
    assert dispersion(r, "mad") == 0.0
    assert robust_dispersion(r, "mad") == pytest.approx(0.5)  # falls back to the std: rewards differ
    assert robust_dispersion([2.0, 2.0, 2.0], "mad") == 0.0
    assert dispersion([3.0], "std") == 0.0
    with pytest.raises(ValueError, match="unknown dispersion mode 'var'"):
        dispersion(r, "var")
    with pytest.raises(ValueError, match="entry 1 is nan"):
        dispersion([0.0, float("nan")], "std")


def test_vote_entropy_by_hand():
    texts = ["so \\boxed{5}", "#### 5", "the answer is 5", "\\boxed{6}"]  # keys 5, 5, 5, 6
    assert vote_entropy(texts) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert vote_entropy(["\\boxed{7}"] * 3) == 0.0
    assert vote_entropy(["1", "2", "3", "4"]) == pytest.approx(math.log(4))
    assert vote_entropy(["The  Cat", "the cat"]) == 0.0  # whitespace-collapsed, lower-cased text keys
    with pytest.raises(ValueError):
        vote_entropy([])


def test_skew_by_hand_small_n_and_constant():
    # [0,0,0,1]: mean 0.25, sample std 0.5, z = [-.5,-.5,-.5,1.5], mean z^3 = 0.75, factor sqrt(12)/2.
    assert skewness([0.0, 0.0, 0.0, 1.0]) == pytest.approx(0.75 * math.sqrt(12) / 2)
    assert skewness([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.75 * math.sqrt(12) / 2)
    assert skewness([1.0, 1.0, 1.0, 0.0]) == pytest.approx(-0.75 * math.sqrt(12) / 2)
    assert skewness([0.0, 1.0]) == 0.0  # n < 3
    assert skewness([5.0]) == 0.0
    assert skewness([0.3] * 8) == 0.0  # constant: std < 1e-6
    # one outlier among 400: unclamped k3 ~ 19.9 -> clamped to 10
    assert skewness([0.0] * 399 + [1.0]) == 10.0
    assert skewness([1.0] * 399 + [0.0]) == -10.0


def test_probe_stats_and_uncertainty():
    stats = probe_stats([0.0, 0.0, 1.0, 1.0], ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}", "\\boxed{3}"])
    assert stats.sigma == pytest.approx(math.sqrt(1 / 3))
    assert stats.entropy == pytest.approx(-(2 * 0.25 * math.log(0.25) + 0.5 * math.log(0.5)))
    assert stats.skew == 0.0 and stats.mean_reward == 0.5
    assert stats.uncertainty(1.0, 1.0, 0.0) == pytest.approx(stats.sigma + stats.entropy)
    with pytest.raises(ValueError, match="2 rewards but 1 texts"):
        probe_stats([0.0, 1.0], ["a"])


def test_temperature_controller_scripted_sequence():
    ctl = TemperatureController(tau_base=1.0, tau_min=0.5, tau_max=1.5, lam=0.15, rate=0.1)
    assert ctl.step(1.0) == (1.0, 0.0) and ctl.ema == 1.0  # first call: c = 0, EMA = U
    tau, c = ctl.step(2.0)  # c = (2 - 1)/1 = 1; EMA = 0.2 + 0.9 = 1.1
    assert c == pytest.approx(1.0) and tau == pytest.approx(1.15) and ctl.ema == pytest.approx(1.1)
    tau, c = ctl.step(1.0)  # c = -0.1/1.1; EMA = 0.1 + 0.99 = 1.09
    assert c == pytest.approx(-1 / 11) and tau == pytest.approx(1 - 0.15 / 11) and ctl.ema == pytest.approx(1.09)
    assert ctl.step(100.0)[0] == 1.5  # upper clip
    low = TemperatureController(lam=0.6, ema=1.0)
    tau, c = low.step(0.0)  # c = -1 -> 1 - 0.6 = 0.4 -> lower clip
    assert c == pytest.approx(-1.0) and tau == 0.5
    # an EMA still ~0 counts as unset (released code): U = 0 first keeps c = 0 on the next call
    zero = TemperatureController()
    assert zero.step(0.0) == (1.0, 0.0)
    assert zero.step(2.0) == (1.0, 0.0) and zero.ema == 2.0
    restored = TemperatureController()
    restored.load_state_dict(ctl.state_dict())
    assert restored.step(3.0) == ctl.step(3.0)
    with pytest.raises(ValueError, match="uncertainty U must be finite"):
        ctl.step(float("inf"))


def test_eps_formula_and_its_clip_bounds():
    common = dict(eps_base=0.2, eps_min=0.05, eps_max=0.4, a_var=1.0, gamma=0.5, delta=0.1, zeta=0.0)
    assert adaptive_eps(entropy_ratio=1.0, vote_entropy=0.0, sigma=0.0, kl_bar=0.0, skew=0.0, **common) == 0.2
    # middle: 0.2 * 1.2 * (1 + 0.1 ln 2) / (1 + 0.5 + 0.05)
    mid = adaptive_eps(entropy_ratio=1.2, vote_entropy=math.log(2), sigma=0.5, kl_bar=0.1, skew=3.0, **common)
    assert mid == pytest.approx(0.2 * 1.2 * (1 + 0.1 * math.log(2)) / 1.55)
    # lower bound: 0.2 / 11 < 0.05
    assert adaptive_eps(entropy_ratio=1.0, vote_entropy=0.0, sigma=10.0, kl_bar=0.0, skew=0.0, **common) == 0.05
    # upper bound: entropy ratio 3 -> 1.5; 0.2 * 1.5 * 2 = 0.6 > 0.4
    assert adaptive_eps(entropy_ratio=3.0, vote_entropy=10.0, sigma=0.0, kl_bar=0.0, skew=0.0, **common) == 0.4
    # the entropy ratio's own clip at 0.5: 0.2 * 0.5 = 0.1 (inside [0.05, 0.4])
    assert adaptive_eps(entropy_ratio=0.1, vote_entropy=0.0, sigma=0.0, kl_bar=0.0, skew=0.0, **common) == 0.1
    zeta = {**common, "zeta": 1.0}
    assert adaptive_eps(entropy_ratio=1.0, vote_entropy=0.0, sigma=0.0, kl_bar=0.0, skew=-1.0, **zeta) == 0.1


def test_clip_range_controller_state():
    ctl = AGPOConfig().clip_controller()
    assert ctl.h_ref is None and ctl.kl_bar == 0.0
    assert ctl.entropy_ratio(2.0) == pytest.approx(2.0 / (2.0 + 1e-8))  # first H sets H_ref
    ctl.update_entropy(2.0)
    assert ctl.h_ref == pytest.approx(2.0)
    ctl.update_entropy(3.0)  # 0.01 * 3 + 0.99 * 2
    assert ctl.h_ref == pytest.approx(2.01)
    ctl.update_kl(0.5)
    ctl.update_kl(0.0)
    assert ctl.kl_bar == pytest.approx(0.9 * 0.05)
    assert ctl.eps(1.0, 0.0, 0.0, 0.0) == pytest.approx(0.2 / (1 + 0.5 * 0.045))
    other = ClipRangeController()
    other.load_state_dict(ctl.state_dict())
    assert other.state_dict() == ctl.state_dict()
    assert kl_step([0.2, -0.4, 0.1]) == pytest.approx(0.1)  # max(0, .) per response, then the mean


def test_agpo_config_bounds():
    with pytest.raises(ValueError, match="tau_min <= tau_base <= tau_max"):
        AGPOConfig(tau_base=2.0)
    with pytest.raises(ValueError, match="eps_min <= eps_base <= eps_max"):
        AGPOConfig(eps_base=0.5)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("std", [-0.5, -0.5, -0.5, 1.5]),  # std 0.5
        ("mad", [-0.5, -0.5, -0.5, 1.5]),  # MAD 0 -> std fallback
        ("iqr", [-0.25 * 1.349 / 0.25, -1.349, -1.349, 0.75 * 1.349 / 0.25]),  # IQR 0.25 / 1.349
    ],
)
def test_agpo_advantage_by_hand(mode, expected):
    rewards = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    adv, zero = compute_advantages(rewards, groups, AdvantageConfig(estimator="agpo", dispersion=mode))
    np.testing.assert_allclose(adv[:4], expected, rtol=1e-6)
    # zero dispersion: advantage exactly 0, flagged zero-variance
    assert adv[4:].tolist() == [0.0] * 4 and zero.tolist() == [False] * 4 + [True] * 4
