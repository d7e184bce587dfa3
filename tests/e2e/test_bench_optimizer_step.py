"""bench/optimizer_step.py in its quick mode (the tiny random policy): every implementation of AdamW's step runs the
same seeded gradients, foreach's weights are bitwise the for-loop's and fused's within float round-off. No timing is
asserted."""

from __future__ import annotations

import json

from _bench import run_bench


def test_optimizer_step_bench_quick(tmp_path):
    out = tmp_path / "optimizer.json"
    proc = run_bench(
        ["bench/optimizer_step.py", "--model", "tiny", "--steps", "2", "--rounds", "2", "--threads", "1",
         "--workdir", str(tmp_path), "--json", str(out)],
        timeout=600,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert set(result["seconds_per_step"]) == {"for-loop", "foreach", "fused"}
    assert all(s > 0 for s in result["seconds_per_step"].values())
    assert result["foreach_bitwise_equal_to_for_loop"] is True
    assert 0 < result["fused_max_abs_diff"] < 1e-5  # a different order of float operations, not a different step
    assert "the for-loop step" in proc.stdout
