"""bench/quality.py: its statistics and refusals (fast), and its --quick mode end to end (slow: every arm on the lab
policy, its jobs in one process, audited)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _bench import run_bench

from bench.quality import ARMS, BASELINE, PAIRED_WITH, check_pairing, refuse_failed_audit, t_interval, time_to_reach
from mugrpo.audit import FAIL, PASS, AuditOptions, AuditReport, CheckResult

REPO = Path(__file__).resolve().parents[2]
CHECKS = {"idle-clip", "data-order", "configs", "batches", "normalizer"}


def test_t_interval_over_seeds():
    ci = t_interval([0.5, 0.6, 0.7])
    half = 4.303 * 0.1 / 3**0.5  # t(0.975, 2) x sd / sqrt(n)
    assert ci["mean"] == pytest.approx(0.6)
    assert (ci["low"], ci["high"]) == (pytest.approx(0.6 - half), pytest.approx(0.6 + half))
    assert t_interval([0.5])["low"] is None  # one seed: no interval


def test_time_to_reach_takes_the_first_policy_at_the_target():
    curve = [{"seconds": 0.0, "greedy": 0.2}, {"seconds": 10.0, "greedy": 0.5}, {"seconds": 20.0, "greedy": 0.6}]
    assert time_to_reach(curve, 0.5) == 10.0
    assert time_to_reach(curve, 0.7) is None


def test_pairing_refuses_arms_of_one_seed_on_different_prompt_orders():
    runs = {BASELINE: {0: {"run": "g", "_order": ["a", "b", "c"]}}, "mu": {0: {"run": "m", "_order": ["a", "b"]}}}
    check_pairing(runs)  # a prefix: same order, shorter
    runs["mu"][0]["_order"] = ["a", "c"]
    with pytest.raises(SystemExit, match="run m trained on another prompt order"):
        check_pairing(runs)


def test_a_failed_audit_row_refuses_the_comparison_naming_run_and_check(tmp_path, capsys):
    report = AuditReport(["r1"], AuditOptions())
    report.results += [CheckResult("batches", "r1", FAIL, "batch abc served 33 times in a row")]
    report.results += [CheckResult("idle-clip", "r1", PASS, "ok")]
    with pytest.raises(SystemExit, match="run r1: check batches: batch abc served 33"):
        refuse_failed_audit({"replay": report}, {"audit": "rows"}, tmp_path / "q.json")
    assert json.loads((tmp_path / "q.json").read_text()) == {"audit": "rows"}
    assert "audit replay: idle-clip r1: pass" in capsys.readouterr().out


@pytest.mark.slow
def test_quality_quick_runs_audits_and_pairs_every_arm(tmp_path):
    pytest.importorskip("reasoning_gym")
    env = {"PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path), "MUGRPO_RUN_SLOT": "off"}
    out = tmp_path / "out"
    cmd = ["bench/quality.py", "--quick", "--root", str(tmp_path / "runs"), "--out", str(out)]
    proc = run_bench(cmd, timeout=1800, env=env)
    res = json.loads((out / "quality.json").read_text())
    assert set(res["summary"]) == set(ARMS) == set(res["audit"])
    for arm, audit in res["audit"].items():
        assert audit["ok"], arm
        assert {r["check"] for r in audit["results"]} == CHECKS
    for arm, by_seed in res["runs"].items():
        (r,) = by_seed.values()
        assert [p["seconds"] for p in r["curve"]] == sorted(p["seconds"] for p in r["curve"]), arm
        assert r["curve"][0]["stage"] == 0 and r["curve"][-1]["greedy"] == r["greedy_final"]
        assert 0.0 <= r["greedy_final"] <= 1.0 and 0.0 <= r["avg8_final"] <= 1.0
        assert r["t_total"] >= r["t_roll"] + r["t_train"] > 0
    paired = res["summary"][BASELINE]["paired_vs_grpo_warm"]
    assert paired["greedy_final"]["per_seed"] == [0.0]  # the baseline against itself
    # the changes to Mu-GRPO cold, each paired with it; starting jobs differently changes no result
    for arm, ref in PAIRED_WITH.items():
        assert set(res["summary"][arm][f"paired_vs_{ref}"]) == {"greedy_final", "avg8_final", "t_total", "t_switch"}
    assert res["summary"]["mu-grpo-cold-spawn"]["paired_vs_mu-grpo-cold"]["greedy_final"]["per_seed"] == [0.0]
    assert {s["greedy_final"]["n"] for s in res["summary"].values()} == {1}  # quick: one seed
    assert (out / "quality.png").stat().st_size > 1000
    assert "| arm | greedy final (95% CI)" in proc.stdout
