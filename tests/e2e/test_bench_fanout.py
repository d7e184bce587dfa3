"""bench/fanout.py --quick runs end to end (real worker processes, the tiny model) and reports what it promises:
tokens/s and start overhead per arm, the speedup against its bound, and equal rollouts for N = 1 and N = 2.
No timing is asserted."""

from __future__ import annotations

import json

from _bench import run_bench


def test_fanout_bench_quick(tmp_path):
    out = tmp_path / "fanout.json"
    proc = run_bench(["bench/fanout.py", "--quick", "--json", str(out)], timeout=900)
    result = json.loads(out.read_text())
    (round0,) = result["rounds"]
    assert round0["order"] == [1, 2]
    one, two = round0["arms"]["1"], round0["arms"]["2"]
    assert one["tokens"] == two["tokens"] > 0
    assert len(one["start_overhead_s"]) == 1 and len(two["start_overhead_s"]) == 2
    assert all(s > 0 for s in one["start_overhead_s"] + two["start_overhead_s"])
    assert one["rollouts_equal_to_n1"] and two["rollouts_equal_to_n1"]
    summary = result["summary"]
    assert summary["1"]["median_speedup"] == 1.0 and summary["2"]["bound"] == min(2, result["settings"]["cores"])
    assert "| 2 |" in proc.stdout and "start overhead / worker" in proc.stdout
