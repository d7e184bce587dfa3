"""The HTML report: self-contained (no scripts, no network), rendered by headless Chromium with its plots."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_sql import write_run

from mugrpo.inspection.report import collect, write_report
from mugrpo.storage.store import Store

PLOTS = 8  # reward x2, accuracy x2, E[ratio | A<0], veto fraction, response lengths, the health panel


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("headless Chromium is not installed (apt-get install chromium); CI installs it")
    return path


HEADLESS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def test_report_content(tmp_path: Path):
    write_run(Store(str(tmp_path)), "r1")
    data = collect(str(tmp_path / "r1"))
    assert data.run_id == "r1" and data.stages and data.steps and data.evals
    out = Path(write_report(str(tmp_path / "r1")))
    assert out == tmp_path / "r1" / "report.html"
    page = out.read_text()
    assert page.count("<svg") == PLOTS
    assert "<script" not in page
    assert re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', page) is None  # nothing to fetch: no network needed
    for heading in (
        "Per-stage summary",
        "E[ratio | A&lt;0] vs updates",
        "Veto fraction vs updates",
        "Response length by stage",
        "Parquet files",
    ):
        assert heading in page
    assert "rollouts/stage=0/" in page and ".parquet" in page
    # The eval contract: accuracy with its clustered 95% CI, and the paired gain over the base policy (stage 0), as
    # mugrpo.evaluation.metrics computes them from the committed rows.
    import pyarrow.dataset as ds

    from mugrpo.evaluation.metrics import clustered_mean_ci, paired_difference_ci

    rows = ds.dataset(tmp_path / "r1" / "evals", format="parquet", partitioning="hive").to_table().to_pylist()
    scores: dict[int, dict[str, list[bool]]] = {}
    for r in rows:
        scores.setdefault(int(r["stage"]), {}).setdefault(r["prompt_id"], []).append(r["correct"])
    mean = {k: {p: sum(c) / len(c) for p, c in v.items()} for k, v in scores.items()}
    by_stage = {e["stage"]: e for e in data.evals}
    assert by_stage[0]["gain"] is None and len(by_stage) == len(mean) >= 2
    for k, e in by_stage.items():
        ci = clustered_mean_ci(list(mean[k].values()))
        assert e["avg_at_k"] == pytest.approx(ci.mean) and e["ci95_low"] == pytest.approx(max(ci.low, 0.0))
        if k > 0:
            gain = paired_difference_ci(mean[k], mean[0])
            assert (e["gain"], e["gain_low"], e["gain_high"]) == pytest.approx((gain.mean, gain.low, gain.high))
            assert f"{gain.mean:+.3f} [{gain.low:.3f}, {gain.high:.3f}]" in page
    assert "gsm8k gain over stage 0 [paired 95% CI]" in page
    # The verifier audit: the view's rows, shown in their own section.
    assert data.verifier_audit and {r["source"] for r in data.verifier_audit} <= {"rollouts", "evals"}
    assert "Verifier audit: wrong by the reward, right by a looser reading" in page


@pytest.mark.parametrize("component", ["reasoning_gym_exact", "math_correctness"])
def test_the_per_stage_correctness_reads_the_tasks_exact_component(tmp_path: Path, component: str):
    """A run rewarded by reasoning-gym's exact score (the main job's reward) or math-verify: the report's correctness
    and correct columns are the share of exactly right rollouts per stage, not None and 0."""
    import pyarrow.parquet as pq

    write_run(Store(str(tmp_path)), "r1", correctness=component)
    data = collect(str(tmp_path / "r1"))
    rollouts = [
        r for f in sorted((tmp_path / "r1" / "rollouts").rglob("*.parquet")) for r in pq.read_table(f).to_pylist()
    ]
    for row in data.rollouts_by_stage:
        scores = [
            dict(r["reward_components"])[component] for r in rollouts if r["policy_version"] == row["policy_version"]
        ]
        assert 0 < sum(scores) < len(scores)
        assert row["accuracy"] == pytest.approx(sum(s == 1.0 for s in scores) / len(scores))
        assert row["correctness"] == pytest.approx(sum(scores) / len(scores))
    assert all(e["correctness"] is not None for e in data.examples)


def test_report_renders_in_headless_chromium(tmp_path: Path):
    exe = chromium()
    write_run(Store(str(tmp_path)), "r1")
    out = Path(write_report(str(tmp_path / "r1"), out=str(tmp_path / "report.html")))
    profile = tmp_path / "profile"
    dom = subprocess.run(
        [exe, *HEADLESS, f"--user-data-dir={profile}", "--dump-dom", out.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") == PLOTS  # every plot is in the rendered DOM
    assert "Per-stage summary" in dom.stdout
    shot = tmp_path / "shot.png"
    res = subprocess.run(
        [exe, *HEADLESS, f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1200,2400", out.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a page of plots, not a blank screen
