"""bench/staleness.py --quick end to end (slow): the regimes at a tiny budget on the real lab policy, each run audited.

To fit the CI's time, the test runs 5 of the 11 regimes (:data:`TESTED`, 10 runs): ``ppo`` (PPO clip),
``mu-grpo`` (relaxed clip + veto), ``cooled`` (truncated IS, sampler at T 0.8, learner at T 1.0: the code paths of
``tis`` and of the learner temperature), and two stale-data corrections: ``m2po`` (a token mask, the generic
correction metrics) and ``a3po`` (an algorithm's hook giving the loss its input). ``relaxed`` is ``mu-grpo`` with the
veto off, ``tis`` is ``cooled`` at one temperature, and ``seq-is``, ``snis``, ``geo-mask`` and ``icepop`` are losses
on the same path as ``m2po``; `python bench/staleness.py --quick` runs all 11.

It asserts the output's structure and the audit, never speed or accuracy: every regime x mu ran the budget's updates
with held-out accuracy at the same update counts, each run's idle-clip check passed (its importance ratio moved after
a stage's first update), every claim has a verdict slot, and one heatmap per regime was drawn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from bench.staleness import QUICK, REGIMES

REPO = Path(__file__).resolve().parents[2]
TESTED = ("ppo", "mu-grpo", "cooled", "m2po", "a3po")
assert set(TESTED) <= set(REGIMES)


def test_quick_runs_every_regime_audited(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "staleness.py"), "--quick", "--regimes", *TESTED, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    payload = json.loads((out / "staleness.json").read_text())
    assert payload["audit_ok"] is True and payload["audit_failures"] == []
    runs = payload["runs"]
    assert sorted((r["regime"], r["mu"]) for r in runs) == sorted((g, m) for g in TESTED for m in QUICK.mus)
    for r in runs:
        assert r["updates"] == QUICK.updates, r["run"]
        assert [u for u, _ in r["curve"]] == [0, QUICK.updates], r["run"]  # same update counts for every mu
        assert 0.0 <= r["final"] <= 1.0 and r["ratio_neg_adv_mean"] is not None
    audited = {row["run"]: row for a in payload["audit"] for row in a["results"] if row["check"] == "idle-clip"}
    assert set(audited) == {r["run"] for r in runs}
    assert all(row["status"] == "pass" for row in audited.values()), audited
    assert len(payload["cells"]) == len(TESTED) * len(QUICK.mus)
    assert set(payload["claims"]) == {
        "naive_degrades_mu_grpo_holds",
        "collapse_tracks_s_eta",
        "cooling_moves_the_cliff",
    }
    assert all(c["reproduced"] in (True, False, None) for c in payload["claims"].values())
    assert sorted(Path(p).name for p in payload["heatmaps"]) == sorted(f"heatmap-{g}.png" for g in TESTED)
    assert all(Path(p).stat().st_size > 0 for p in payload["heatmaps"])
    assert Path(payload["heatmap_panel"]).name == "heatmaps.png" and Path(payload["heatmap_panel"]).stat().st_size > 0
    assert not (out / "runs" / runs[0]["run"]).exists()  # run folders freed once audited
    assert "reproduced" in proc.stdout and "| regime | mu | lr |" in proc.stdout
    # the per-arm report: every arm x lr, paired against mu-grpo, the configs differing only in arm keys
    assert payload["arm_config_audit"] == []
    arms = {a["arm"]: a for a in payload["arms"]}
    assert set(arms) == set(TESTED)
    for name, arm in arms.items():
        assert [row["mu"] for row in arm["by_mu"]] == list(QUICK.mus), name
        for row in arm["by_mu"]:
            assert 0.0 <= row["greedy"] <= 1.0 and 0.0 <= row["avg8"] <= 1.0, name
            paired = row["greedy_vs_mu-grpo"]
            assert (paired is None) == (name == "mu-grpo"), name
            assert paired is None or paired["low"] <= paired["diff"] <= paired["high"]
            assert row["extra_forward_passes"] == (1.0 if name == "cooled" else 0.0), name
            assert (row["correction_ess"] is not None) == (name in ("m2po", "a3po")), name
            assert row["correction_ess"] is None or 0.0 < row["correction_ess"] <= 1.0
    assert Path(payload["frontier"]).stat().st_size > 0 and Path(payload["html"]).name == "staleness.html"
    assert "<img" in Path(payload["html"]).read_text() and "largest stable mu" in proc.stdout
