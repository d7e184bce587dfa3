"""bench/shared_prefix_train.py in its quick mode (the tiny random policy, the main job's prompts): both arms run the
same micro-batches, the shared prefix is the main job's system prompt and worked examples, the log-probs are bitwise
equal and the gradients agree to fp32 summation order. No timing is asserted."""

from __future__ import annotations

import json

from _bench import run_bench


def test_shared_prefix_train_bench_quick(tmp_path):
    out = tmp_path / "shared.json"
    proc = run_bench(
        [
            "bench/shared_prefix_train.py",
            "--model",
            "tiny",
            "--rounds",
            "1",
            "--micro-batches",
            "2",
            "--threads",
            "1",
            "--workdir",
            str(tmp_path),
            "--json",
            str(out),
        ],
        timeout=600,
    )
    result = json.loads(out.read_text())
    assert len(result["shared_prefix_tokens"]) == 2 and min(result["shared_prefix_tokens"]) >= 16
    assert result["positions"]["shared"] < result["positions"]["plain"]
    assert result["logprobs_bitwise_equal"] is True
    assert 0 <= result["max_grad_rel_diff"] < 1e-4
    assert all(s > 0 for s in result["seconds_per_micro_batch"].values())
    assert "plain / shared" in proc.stdout
