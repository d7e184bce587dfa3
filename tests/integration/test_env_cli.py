"""``mugrpo env``: the machine report, through the real command line, with the real matmul probe."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from mugrpo.cli import app
from mugrpo.common.hardware import bf16_verdict

runner = CliRunner()


def test_env_reports_the_bf16_verdict_with_figures_and_the_auto_pick(monkeypatch):
    # A CPU without bf16 units cannot exist here when this one has them: the documented override makes one.
    monkeypatch.setenv("MUGRPO_CPU_BF16_UNITS", "0")
    monkeypatch.delenv("MUGRPO_AUTO_PRECISION", raising=False)
    bf16_verdict.cache_clear()
    try:
        result = runner.invoke(app, ["env", "--json"])
        assert result.exit_code == 0, result.output
        report = json.loads(result.output)
        assert report["bf16"]["native"] is False and report["bf16"]["units"] == []
        assert report["bf16"]["fp32_gflops"] > 0 and report["bf16"]["bf16_gflops"] > 0
        assert report["auto_precision"]["choice"] == "fp32"
        assert report["auto_precision"]["model.dtype"] == "float32"
        assert report["packages"]["torch"] and report["cpu"]["cores"] >= 1 and report["cpu"]["capability"]
        text = runner.invoke(app, ["env"])
        assert text.exit_code == 0, text.output
        assert "bf16 units       no" in text.output and "auto precision   fp32" in text.output
        assert "GFLOP/s" in text.output and "prefect api" in text.output
    finally:
        bf16_verdict.cache_clear()


def test_a_cpu_held_to_avx2_kernels_is_found_without_bf16_units_by_the_probe_alone():
    """No override: torch's kernels, oneDNN and MKL held to AVX2 code (the way docs/precision.md emulates a CPU
    without bf16 units), the real probe finds bf16 slower than fp32 and ``auto`` picks fp32, on any x86-64 CPU
    (whatever units it reports: the verdict must come from the measured ratio, not the CPU flags)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the AVX2 dispatch variables exist on x86-64 only")
    env = {k: v for k, v in os.environ.items() if k not in ("MUGRPO_AUTO_PRECISION", "MUGRPO_CPU_BF16_UNITS")}
    env |= {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    out = subprocess.run(
        [sys.executable, "-m", "mugrpo.cli", "env", "--json"], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["cpu"]["capability"] == "AVX2"
    assert report["bf16"]["native"] is False
    assert report["bf16"]["bf16_gflops"] < report["bf16"]["fp32_gflops"], report["bf16"]
    assert report["auto_precision"]["choice"] == "fp32" and report["auto_precision"]["model.dtype"] == "float32"
