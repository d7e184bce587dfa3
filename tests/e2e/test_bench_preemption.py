"""bench/preemption.py --quick runs end to end (the real train job on the tiny policy, preempted at moments drawn from
the seed, each arm re-running the job after every signal) and reports what it promises: with the SIGTERM and its
grace no completed update is lost (the job exits 75, or 0 when the stage had ended); with the SIGKILL of the before
arm every update since the last checkpoint is. No timing is asserted."""

from __future__ import annotations

import json

import pytest
from _bench import run_bench


@pytest.mark.slow
def test_preemption_bench_quick(tmp_path):
    out = tmp_path / "preemption.json"
    proc = run_bench(
        ["bench/preemption.py", "--quick", "--moments", "2", "--work", str(tmp_path / "w"), "--json", str(out)],
        timeout=900,
    )
    result = json.loads(out.read_text())
    moments = {arm: [m for m in result["moments"] if m["arm"] == arm] for arm in ("sigterm", "before")}
    assert len(moments["sigterm"]) == len(moments["before"]) == 2
    for m in moments["sigterm"]:
        assert m["exit_code"] in (0, 75) and m["lost"] <= m["fraction"] and m["saved"] >= m["update"] - 1
        assert m["exit_code"] == 0 or m["said"].startswith("preempted: train stage 0: stopped by SIGTERM")
    for m in moments["before"]:
        assert m["exit_code"] == -9 and m["saved"] == 0  # one checkpoint per stage: nothing saved before it
        assert m["lost"] == pytest.approx(m["update"] - 1 + m["fraction"], abs=1e-3)
    assert result["summary"]["sigterm"]["max_lost"] <= 1.0
    assert "target <= 1 update per preemption: met" in proc.stdout
