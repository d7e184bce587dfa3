"""The replay buffer (arXiv 2606.04560): hand-computed cases and a chi-square test of the draw law."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mugrpo.algorithms.replay import ReplayBuffer, ReplayConfig, draw_probabilities, num_replayed, priority


def _buffer(**kw) -> ReplayBuffer:
    return ReplayBuffer(ReplayConfig(enabled=True, **kw))


def test_priority_probabilities_by_hand():
    # alpha = 0.5, eps = 1e-6: (|A| + 1e-6)^0.5
    adv = [1.0, -0.25, 0.0, 0.04]
    p = np.array([priority(a, 0.5, 1e-6) for a in adv])
    assert p == pytest.approx([1.0000005, 0.500001, 0.001, 0.2000025], rel=1e-6)
    probs = draw_probabilities(p)
    total = 1.0000005 + 0.500001 + 0.001 + 0.2000025
    assert probs == pytest.approx([1.0000005 / total, 0.500001 / total, 0.001 / total, 0.2000025 / total], rel=1e-9)
    # alpha = 0: uniform; alpha = 1: proportional to |A| (+ eps)
    assert draw_probabilities(np.array([priority(a, 0.0) for a in adv])) == pytest.approx([0.25] * 4)
    assert priority(-2.0, 1.0, 1e-6) == pytest.approx(2.000001)
    with pytest.raises(ValueError, match="positive"):
        draw_probabilities(np.array([1.0, 0.0]))


def test_age_eviction_at_exactly_tau_max():
    buf = _buffer(tau_max=10)
    buf.insert([((0, "a", 0), 5, 1.0), ((0, "b", 0), 6, 1.0)])
    # age at global update g = g - 1 - birth: "a" is 10 at update 16 (kept), 11 at update 17 (evicted)
    assert buf.evict_stale(16).by_age == 0 and len(buf) == 2
    ev = buf.evict_stale(17)
    assert ev.by_age == 1 and [e.prompt_id for e in buf.entries] == ["b"]
    assert buf.evict_stale(18).by_age == 1 and len(buf) == 0


def test_capacity_is_a_fifo_backstop():
    buf = _buffer(capacity=3)
    assert buf.insert([((0, p, 0), 0, 1.0) for p in "ab"]).by_capacity == 0
    ev = buf.insert([((1, p, 0), 4, 1.0) for p in "cde"])
    assert ev.by_capacity == 2
    assert [(e.stage, e.prompt_id) for e in buf.entries] == [(1, "c"), (1, "d"), (1, "e")]
    # a key already present keeps its first entry (birth, advantage) and its place in the FIFO order
    buf.insert([((1, "c", 0), 9, 5.0)])
    assert buf.entries[0].birth_update == 4 and buf.entries[0].advantage == 1.0


def test_warmup_draws_nothing_then_draws():
    buf = _buffer(warmup_updates=20, tau_max=100)
    buf.insert([((0, f"p{i}", 0), 0, 1.0) for i in range(5)])
    assert buf.draw(3, update=20, seed=0) == []
    assert len(buf.draw(3, update=21, seed=0)) == 3


def test_k_rounding_by_hand():
    assert num_replayed(0.5, 8) == 4
    assert num_replayed(0.5, 3) == 2  # 1.5 -> 2
    assert num_replayed(0.5, 5) == 3  # 2.5 -> 3 (half up, not Python's half to even)
    assert num_replayed(0.25, 1) == 0
    assert num_replayed(0.0, 8) == 0
    assert num_replayed(1.0, 8) == 8
    with pytest.raises(ValueError):
        num_replayed(-0.1, 8)


def test_draws_exclude_fresh_are_distinct_and_seeded():
    buf = _buffer(warmup_updates=0, tau_max=100)
    buf.insert([((0, f"p{i}", 0), 0, float(i)) for i in range(6)])
    fresh = [(0, "p5", 0), (0, "p4", 0)]
    draws = buf.draw(10, update=3, seed=7, exclude=fresh)
    keys = [e.key for e in draws]
    assert len(keys) == 4 and len(set(keys)) == 4 and not set(keys) & set(fresh)
    assert [e.key for e in buf.draw(3, update=3, seed=7)] == [e.key for e in buf.draw(3, update=3, seed=7)]
    # the state round-trips (and so do the draws)
    other = _buffer(warmup_updates=0, tau_max=100)
    other.load_state_dict(buf.state_dict())
    assert other.entries == buf.entries
    assert [e.key for e in other.draw(3, update=9, seed=7)] == [e.key for e in buf.draw(3, update=9, seed=7)]


# Chi-square critical values at significance 0.001 (standard tables): a correct sampler fails 1 run in 1000.
CHI2_CRIT_0001 = {4: 18.467, 19: 43.820}


def _chi2(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def test_draw_frequencies_match_priorities_chi_square():
    """20000 seeded draws (updates 1..20000, seed 123) of 1 and of 2 entries among 5 with advantages 0.05..2.

    k = 1: the drawn entry follows P(i) = p_i / sum p (df = 4). k = 2: the ordered pair (i, j) follows successive
    sampling, P(i) * p_j / (sum p - p_i) (df = 19). Threshold: chi-square critical value at p = 0.001.
    """
    adv = [0.05, 0.1, 0.5, 1.0, 2.0]  # every expected cell count >= 100
    buf = _buffer(warmup_updates=0, tau_max=10**9, alpha=0.5)
    buf.insert([((0, f"p{i}", 0), 0, a) for i, a in enumerate(adv)])
    index = {e.key: i for i, e in enumerate(buf.entries)}
    p = np.array([e.priority for e in buf.entries])
    probs = draw_probabilities(p)
    n = 20000

    single = np.zeros(5)
    pairs = np.zeros((5, 5))
    for u in range(1, n + 1):
        single[index[buf.draw(1, update=u, seed=123)[0].key]] += 1
        a, b = (index[e.key] for e in buf.draw(2, update=u, seed=123 + n))
        pairs[a, b] += 1
    assert _chi2(single, n * probs) < CHI2_CRIT_0001[4]

    cells = list(itertools.permutations(range(5), 2))
    expected = np.array([n * probs[i] * p[j] / (p.sum() - p[i]) for i, j in cells])
    observed = np.array([pairs[i, j] for i, j in cells])
    assert _chi2(observed, expected) < CHI2_CRIT_0001[19]
    # and the test has power: uniform expectations are rejected
    assert _chi2(single, np.full(5, n / 5)) > CHI2_CRIT_0001[4]


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"train": {"recompute_behavior_logprobs": True}}, "train.recompute_behavior_logprobs"),
        ({"loss": {"tis_cap": 2.0}}, "loss.tis_cap"),
        ({"train": {"group_minibatches": True}}, "train.group_minibatches"),
    ],
)
def test_replay_refuses_settings_that_would_change_stored_behavior_logprobs(override, field):
    from mugrpo.config import ConfigError, config_from_dict

    with pytest.raises((ConfigError, ValueError), match=field.replace(".", r"\.")):
        config_from_dict({"replay": {"enabled": True}, **override})
    config_from_dict(override)  # fine without replay


def test_buffer_state_rejects_duplicates_and_missing_columns():
    import pyarrow as pa

    buf = _buffer()
    buf.insert([((0, "a", 0), 0, 1.0)])
    table = buf.to_table()
    with pytest.raises(ValueError, match="appears twice"):
        _buffer().load_table(pa.concat_tables([table, table]), "x.parquet")
    with pytest.raises(ValueError, match=r"x.parquet: missing columns \['priority'\]"):
        _buffer().load_table(table.drop_columns(["priority"]), "x.parquet")
