"""``mugrpo env``: the machine report, through the real command line, with the real matmul probe."""

from __future__ import annotations

import json

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
