"""bench/engine_throughput.py --quick runs both engines (the one at the bench's 'before' revision, from git, and
this tree's) on the main job's prompts and reports each cell; the two engines sample the same responses from the
same seeds (equal token counts per cell). No timing is asserted."""

from __future__ import annotations

import json

from _bench import run_bench


def test_engine_throughput_bench_quick(tmp_path):
    out = tmp_path / "engine.json"
    proc = run_bench(["bench/engine_throughput.py", "--quick", "--json", str(out)], timeout=600)
    cells = json.loads(out.read_text())["cells"]
    assert [(c["threads"], c["batch"]) for c in cells] == [(1, 8), (1, "auto")]
    fixed, auto = cells
    assert fixed["before"]["tokens"] == fixed["after"]["tokens"] > 0  # same seeds, same samples
    assert "before" not in auto and auto["after"]["tokens"] > 0
    for arm in (fixed["before"], fixed["after"], auto["after"]):
        assert arm["tokens_per_s"] > 0 and 0 < arm["peak_fraction"]
    assert "after/before" in proc.stdout
