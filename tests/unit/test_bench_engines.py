"""bench/engines.py's pure reductions: stage sizes of the speedup arms, tokens/s, batch gain and the vLLM /
transformers ratio of batch gains (the bench's runs themselves are not tested here: they need the vLLM env)."""

from __future__ import annotations

import math

import pytest

from bench._arms import Budget
from bench.engines import batch_gain, stage_rollouts, summarize, tokens_per_s


def test_stage_rollouts_are_the_speedup_arms_stages():
    # U=32, K=4, 4 rollouts/update: Mu-GRPO stage 8 updates = 32 rollouts; GRPO (mu=4) 4 updates = 16 rollouts
    assert stage_rollouts(Budget()) == {"grpo": 16, "mu": 32}
    assert stage_rollouts(Budget(updates=64, rollouts_per_update=8, group_size=8)) == {"grpo": 32, "mu": 128}
    with pytest.raises(ValueError, match="multiple of K"):
        stage_rollouts(Budget(updates=6))


def test_tokens_per_s_and_batch_gain():
    calls = [
        {"rollouts": 16, "tokens": 1000, "seconds": 10.0},
        {"rollouts": 32, "tokens": 2000, "seconds": 10.0},
        {"rollouts": 16, "tokens": 900, "seconds": 0.0},  # a zero-second call has no rate: dropped
    ]
    assert tokens_per_s(calls, 16) == [100.0]
    assert tokens_per_s(calls, 32) == [200.0]
    assert tokens_per_s(calls, 64) == []
    assert batch_gain(200.0, 100.0) == 2.0
    assert math.isnan(batch_gain(200.0, 0.0))
    assert math.isnan(batch_gain(float("nan"), 100.0))


def _probe(tps_small: float, tps_large: float) -> dict:
    return {
        "start_s": 10.0,
        "import_s": 2.0,
        "sync_s": [0.5, 0.7],
        "calls": [
            {"rollouts": 16, "tokens": 640, "seconds": 640 / tps_small},
            {"rollouts": 32, "tokens": 1280, "seconds": 1280 / tps_large},
        ],
    }


def test_summarize_medians_and_ratio_of_batch_gains():
    sizes = {"grpo": 16, "mu": 32}
    bare = {
        "vllm/float32": [_probe(100.0, 150.0), _probe(100.0, 130.0), _probe(100.0, 140.0)],  # median gain 1.4
        "transformers/float32": [_probe(100.0, 120.0)],  # gain 1.2
    }
    jobs = {
        "vllm/float32": [
            {"size": 16, "tokens": 1000, "gen_s": 10.0, "wall_s": 40.0, "engine_ready": 20.0, "first_work": 25.0},
            {"size": 32, "tokens": 3000, "gen_s": 10.0, "wall_s": 40.0, "engine_ready": 22.0, "first_work": 27.0},
        ],
        "transformers/float32": [
            {"size": 16, "tokens": 1000, "gen_s": 10.0, "wall_s": 20.0, "first_work": 5.0},
            {"size": 32, "tokens": 1500, "gen_s": 10.0, "wall_s": 20.0, "first_work": 5.0},
        ],
    }
    out = summarize(bare, jobs, sizes)
    v, t = out["arms"]["vllm/float32"], out["arms"]["transformers/float32"]
    assert v["bare_tps_mu"] == pytest.approx(140.0)
    assert v["bare_batch_gain"] == pytest.approx(1.4)
    assert v["sync_s"] == pytest.approx(0.6)
    assert t["bare_batch_gain"] == pytest.approx(1.2)
    assert v["job_batch_gain"] == pytest.approx(3.0)
    assert t["job_batch_gain"] == pytest.approx(1.5)
    assert v["job_engine_ready_s"] == pytest.approx(21.0)
    assert math.isnan(t["job_engine_ready_s"])
    assert out["ratios"]["float32"]["bare"] == pytest.approx(1.4 / 1.2)
    assert out["ratios"]["float32"]["job"] == pytest.approx(2.0)


def test_summarize_without_the_vllm_arm_gives_nan_ratios():
    out = summarize({"transformers/bfloat16": [_probe(100.0, 120.0)]}, {}, {"grpo": 16, "mu": 32})
    assert math.isnan(out["ratios"]["bfloat16"]["bare"])
    assert math.isnan(out["ratios"]["bfloat16"]["job"])
