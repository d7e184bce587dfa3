"""bench/engine_throughput.py --quick runs both engines (the one at the bench's 'before' revision, from git, and
this tree's) on the main job's prompts and reports each cell; the two engines sample the same responses from the
same seeds (equal token counts per cell). No timing is asserted."""

from __future__ import annotations

import json
import os

import pytest
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


@pytest.mark.vllm
def test_engine_throughput_bench_quick_beside_vllm(tmp_path):
    """--vllm-python: vLLM's CPU engine samples the auto cell's rows of the same prompts in the same run, beside the
    transformers engine's auto cell (the vLLM tier: MUGRPO_VLLM_PYTHON)."""
    out = tmp_path / "engine.json"
    vllm_python = os.environ["MUGRPO_VLLM_PYTHON"]
    proc = run_bench(
        ["bench/engine_throughput.py", "--quick", "--vllm-python", vllm_python, "--json", str(out)], timeout=900
    )
    side = json.loads(out.read_text())["vllm"]
    assert side["rows"] == 256 and side["threads"] == 1
    assert side["vllm_tokens_per_s"] > 0 and side["transformers_tokens_per_s"] > 0
    assert all(c["rollouts"] == 256 and c["tokens"] > 0 for c in side["vllm_calls"])
    assert "transformers / vLLM" in proc.stdout
