"""bench/allocator.py in its quick mode (the tiny random policy, one interpreter per arm): the allocator policy is
applied in the on arm only, and both arms sample the same tokens and compute the same gradients. No timing is
asserted."""

from __future__ import annotations

import json

from _bench import run_bench


def test_allocator_bench_quick(tmp_path):
    out = tmp_path / "allocator.json"
    proc = run_bench(
        ["bench/allocator.py", "--model", "tiny", "--dtype", "float32", "--prompts", "8", "--micro-batches", "1",
         "--repeats", "1", "--threads", "1", "--workdir", str(tmp_path), "--json", str(out)],
        timeout=600,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["applied"] is True
    assert result["same_bits"] == {"sampling": True, "training": True}
    for arm in ("off", "on"):
        (run,) = result["runs"][arm]
        assert run["sampling"]["wall_s"] > 0 and run["training"]["wall_s"] > 0
    assert "off / on" in proc.stdout
