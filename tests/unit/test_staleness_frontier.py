"""bench/staleness.py's pure parts: the grid's budget, the collapse rule, the claims' statistics, the run configs."""

from __future__ import annotations

import math

import pytest

from bench.staleness import (
    BASELINE_ARM,
    QUICK,
    REGIMES,
    Grid,
    RunResult,
    _spearman,
    arm_report,
    audit_arm_configs,
    claims,
    collapse_update,
    entropy_bins,
    extra_forward_passes,
    grad_norm_spikes,
    run_config,
    run_id,
    summarize,
)
from mugrpo.schedules.stages import total_updates


def test_collapse_is_the_first_update_from_which_accuracy_stays_below_best_minus_margin():
    curve = [(0, 0.35), (64, 0.45), (128, 0.30), (192, 0.40), (256, 0.20)]
    assert collapse_update(curve, 0.08) == 256  # 128 dips below 0.37 but 192 recovers to 0.40
    assert collapse_update([(0, 0.35), (64, 0.45), (128, 0.30), (192, 0.25)], 0.08) == 128
    assert collapse_update([(0, 0.35), (64, 0.40), (128, 0.38)], 0.08) is None  # within the margin
    assert collapse_update([(0, 0.5), (64, 0.1)], 0.08) == 64
    assert collapse_update([], 0.08) is None


def test_spearman():
    assert _spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert _spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert _spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)  # ties: average ranks
    assert _spearman([1, 2], [2, 1]) is None and _spearman([1, 1, 1], [1, 2, 3]) is None


def test_grid_rejects_mus_that_cannot_share_the_evaluation_points():
    Grid().check()
    QUICK.check()
    with pytest.raises(ValueError, match="divide"):
        Grid(mus=(4, 24, 64)).check()
    with pytest.raises(ValueError, match="unknown regime"):
        Grid(regimes=("ppo", "nope")).check()


def test_every_mu_has_the_same_budget_and_evaluation_points(tmp_path):
    g = Grid()
    shapes = set()
    for mu in g.mus:
        cfg = run_config(g, "mu-grpo", mu, 1e-4, 0, tmp_path)
        assert total_updates(cfg) == g.updates and cfg.train.updates_per_stage == mu
        prompts = cfg.run.num_stages * cfg.generation.prompts_per_stage
        evaluated = [k * mu for k in range(cfg.run.num_stages) if k % cfg.eval.every_n_stages == 0]
        shapes.add((prompts, cfg.train.rollouts_per_update, tuple(evaluated), cfg.orchestration.execution))
        assert [b.dataset.name for b in cfg.eval.benchmarks] == ["lab-heldout", "lab-heldout-t1"]
        assert [(b.k, b.num_prompts) for b in cfg.eval.benchmarks] == [(1, 200), (8, 100)]
    assert shapes == {(1024, 32, (0, 64, 128, 192), "warm")}  # + the final policy at 256


def test_regimes_differ_only_in_the_loss_and_the_temperatures(tmp_path):
    cfgs = {r: run_config(QUICK, r, 2, 1e-4, 0, tmp_path) for r in REGIMES}
    assert cfgs["ppo"].loss.name == "grpo" and (cfgs["ppo"].loss.eps_low, cfgs["ppo"].loss.eps_high) == (0.2, 0.2)
    assert cfgs["relaxed"].loss.veto_enabled is False and cfgs["relaxed"].loss.ratio_max == 5.0
    assert cfgs["mu-grpo"].loss.veto_enabled is not False and cfgs["mu-grpo"].loss.veto_scope == "suffix"
    assert cfgs["tis"].loss.tis_cap == 2.0 and cfgs["tis"].train.learner_temperature is None
    cooled = cfgs["cooled"]
    assert cooled.generation.sampling.temperature == 0.8 and cooled.train.learner_temperature == 1.0
    assert cooled.loss == cfgs["tis"].loss
    base = {k: v for k, v in cfgs["ppo"].to_json_dict().items() if k not in ("run", "loss")}
    assert {k: v for k, v in cfgs["relaxed"].to_json_dict().items() if k not in ("run", "loss")} == base


def _run(regime, mu, lr, seed, final, col):
    return RunResult(regime, mu, lr, seed, run_id(regime, mu, lr, seed), [], final, col, 1.0, 1.0, None, None, 8, 1.0)


def test_claims_read_the_cells():
    g = Grid(mus=(4, 64), lrs=(1e-4,), seeds=(0,), regimes=("ppo", "mu-grpo", "tis", "cooled"))
    results = [
        _run("ppo", 4, 1e-4, 0, 0.45, None),
        _run("ppo", 64, 1e-4, 0, 0.20, 128),
        _run("mu-grpo", 4, 1e-4, 0, 0.45, None),
        _run("mu-grpo", 64, 1e-4, 0, 0.44, None),
        _run("tis", 4, 1e-4, 0, 0.45, None),
        _run("tis", 64, 1e-4, 0, 0.10, 64),
        _run("cooled", 4, 1e-4, 0, 0.45, None),
        _run("cooled", 64, 1e-4, 0, 0.40, None),
    ]
    cells, c = summarize(results, g)
    assert len(cells) == 8
    assert c["naive_degrades_mu_grpo_holds"]["reproduced"] is True
    assert c["naive_degrades_mu_grpo_holds"]["per_lr"][0]["ppo_change"] == pytest.approx(-0.25)
    assert c["cooling_moves_the_cliff"] == {**c["cooling_moves_the_cliff"], "cliff_tis": 64e-4, "reproduced": True}
    assert math.isinf(c["cooling_moves_the_cliff"]["cliff_cooled"])
    assert c["collapse_tracks_s_eta"]["spearman"] < -0.5 and c["collapse_tracks_s_eta"]["reproduced"] is True
    # one lr: the lr-only diagnostic is undefined (constant input), mu within it carries the whole correlation
    assert c["collapse_tracks_s_eta"]["spearman_lr_only"] is None
    assert c["collapse_tracks_s_eta"]["spearman_mu_within_lr"]["0.0001"] == pytest.approx(
        c["collapse_tracks_s_eta"]["spearman"]
    )
    # a grid with one mu, or without the regimes a claim compares, cannot test it
    one_mu = Grid(mus=(64,), lrs=(1e-4,), seeds=(0,), regimes=("ppo", "mu-grpo"))
    kept = [r for r in results if r.mu == 64 and r.regime in one_mu.regimes]
    assert claims(summarize(kept, one_mu)[0], kept, one_mu)["naive_degrades_mu_grpo_holds"]["reproduced"] is None
    assert (
        claims(cells[:2], results[:2], Grid(mus=(4, 64), regimes=("ppo",)))["cooling_moves_the_cliff"]["reproduced"]
        is None
    )


def test_a_failed_audit_refuses_the_table(tmp_path, monkeypatch):
    """The refusal rule alone: the runs and the audit's verdict are stand-ins here (the audit's checks are tested on
    real runs made to exhibit each bug in tests/e2e/test_audit.py; the bench's real runs in the e2e quick test)."""
    import json

    import bench.staleness as st
    from mugrpo.audit import FAIL, PASS, AuditOptions, AuditReport, CheckResult

    g = Grid(mus=(2, 4), lrs=(1e-4,), seeds=(0,), regimes=("ppo",), updates=4, rollouts_per_update=8, group_size=4)

    def report(root, runs):
        r = AuditReport(runs, AuditOptions())
        bad = "stale-ppo-mu4-lr0.0001-s0"
        r.results = [CheckResult("idle-clip", x, FAIL if x == bad else PASS, "ratio 1 everywhere") for x in runs]
        return r

    monkeypatch.setattr(st, "launch", lambda cfg, work, core, in_process=False: 1.0)
    monkeypatch.setattr(st, "read_run", lambda cfg, rg, mu, lr, grid, wall: _run(rg, mu, lr, cfg.run.seed, 0.4, None))
    monkeypatch.setattr(st, "audit_seeds", report)
    with pytest.raises(SystemExit, match=r"refused[\s\S]*stale-ppo-mu4-lr0.0001-s0: idle-clip: ratio 1 everywhere"):
        st.run_grid(g, tmp_path / "out", tmp_path / "runs", jobs=1, keep_runs=True, in_process=True)
    payload = json.loads((tmp_path / "out" / "staleness.json").read_text())
    assert payload["audit_ok"] is False and "heatmaps" not in payload
    assert not list((tmp_path / "out").glob("heatmap-*.png"))


def test_stop_after_then_resume_runs_each_run_once_and_reruns_a_changed_config(tmp_path, monkeypatch):
    """--stop-after then --resume: the second invocation runs only what the first did not, audits each cell once,
    and a run whose resolved config changed is run again. The runs are stand-ins (launch/read_run/audit replaced);
    the bench's real runs are in the e2e quick test."""
    import json
    import time

    import bench.staleness as st
    from mugrpo.audit import PASS, AuditOptions, AuditReport, CheckResult

    g = Grid(mus=(2, 4), lrs=(1e-4,), seeds=(0, 1), regimes=("ppo",), updates=4, rollouts_per_update=8, group_size=4)
    launched: list[str] = []
    audited: list[list[str]] = []

    def launch(cfg, work, core, in_process=False):
        launched.append(cfg.run.id)
        (tmp_path / "runs" / cfg.run.id).mkdir(parents=True, exist_ok=True)
        time.sleep(0.3)  # past --stop-after 0.1 s: the first run starts, no other does
        return 1.0

    def report(root, runs):
        audited.append(runs)
        r = AuditReport(runs, AuditOptions())
        r.results = [CheckResult("idle-clip", x, PASS, "ok") for x in runs]
        return r

    monkeypatch.setattr(st, "launch", launch)
    monkeypatch.setattr(st, "read_run", lambda cfg, rg, mu, lr, grid, wall: _run(rg, mu, lr, cfg.run.seed, 0.4, None))
    monkeypatch.setattr(st, "audit_seeds", report)
    out, root = tmp_path / "out", tmp_path / "runs"
    first = st.run_grid(g, out, root, jobs=1, keep_runs=False, in_process=True, stop_after_s=0.1)
    assert first["complete"] is False and (first["runs_done"], first["runs_planned"]) == (1, 4)
    assert launched == ["stale-ppo-mu2-lr0.0001-s0"] and audited == []  # the cell's second seed is not done
    (root / "stale-ppo-mu2-lr0.0001-s1").mkdir(parents=True)  # a half-written run of an interrupted invocation

    second = st.run_grid(g, out, root, jobs=1, keep_runs=False, in_process=True, resume=True)
    assert second["complete"] is True and second["runs_done"] == 4
    assert launched[1:] == [f"stale-ppo-mu{m}-lr0.0001-s{s}" for m in (2, 4) for s in (0, 1)][1:]
    assert sorted(map(sorted, audited)) == [[f"stale-ppo-mu{m}-lr0.0001-s{s}" for s in (0, 1)] for m in (2, 4)]
    assert not any(root.iterdir())  # audited runs' folders deleted
    lines = [json.loads(x) for x in (out / st.PROGRESS).read_text().splitlines()]
    assert sum("run" in x for x in lines) == 4 and sum("cell" in x for x in lines) == 2

    launched.clear()
    changed = Grid(**{**g.__dict__, "max_new_tokens": g.max_new_tokens + 1})  # every config changes: all rerun
    audited.clear()
    st.run_grid(changed, out, root, jobs=1, keep_runs=True, in_process=True, resume=True)
    assert len(launched) == 4 and len(audited) == 2  # the reruns' cells are audited again
    (out / st.PROGRESS).write_text("{not json\n")
    with pytest.raises(ValueError, match=r"progress.jsonl, line 1: not JSON"):
        st.run_grid(g, out, root, jobs=1, keep_runs=True, in_process=True, resume=True)


def test_a_collapse_set_by_the_learning_rate_alone_fails_the_within_lr_diagnostic():
    """Collapse at every mu of the high lr, none at the low one: mu*lr correlates with the collapse (the rule's
    verdict), while mu within each lr does not (its diagnostics say the learning rate, not S, set it)."""
    g = Grid(mus=(4, 16, 64), lrs=(1e-4, 5e-4), seeds=(0,), regimes=("ppo",))
    results = [_run("ppo", mu, 1e-4, 0, 0.45, None) for mu in g.mus]
    results += [_run("ppo", mu, 5e-4, 0, 0.10, col) for mu, col in zip(g.mus, (64, 128, 64), strict=True)]
    c = claims(summarize(results, g)[0], results, g)["collapse_tracks_s_eta"]
    assert c["collapsed_runs"] == 3 and c["spearman"] == pytest.approx(-10 / math.sqrt(17.5 * 15))  # -0.62
    assert c["spearman_lr_only"] == pytest.approx(-13.5 / math.sqrt(13.5 * 15))  # -0.95: lr alone orders them better
    assert c["spearman_mu_within_lr"]["0.0001"] is None  # no collapse at the low lr: a constant input
    assert c["spearman_mu_within_lr"]["0.0005"] == pytest.approx(0.0)  # 64, 128, 64: no trend with mu


def test_every_arm_is_a_regime_and_the_corrections_are_arms(tmp_path):
    assert {"seq-is", "snis", "geo-mask", "icepop", "m2po", "a3po"} <= set(REGIMES)
    cfgs = {r: run_config(QUICK, r, 2, 1e-4, 0, tmp_path) for r in REGIMES}
    names = {r: c.loss.name for r, c in cfgs.items()}
    assert names["seq-is"] == "seq_is" and names["snis"] == "seq_snis" and names["geo-mask"] == "geo_mask"
    assert names["icepop"] == "icepop" and names["m2po"] == "m2po" and names["a3po"] == "a3po"
    assert cfgs["m2po"].loss.m2po.tau == 0.04 and cfgs["icepop"].loss.icepop.high == 2.0
    assert {r: extra_forward_passes(c) for r, c in cfgs.items() if extra_forward_passes(c)} == {
        "tis": 1.0,
        "cooled": 1.0,
    }


def test_the_arm_config_audit_passes_the_grid_and_catches_a_difference_outside_the_arms_keys(tmp_path):
    plan = [(r, mu, 1e-4, s) for r in REGIMES for mu in QUICK.mus for s in (0, 1)]
    cfgs = {p: run_config(QUICK, *p, tmp_path) for p in plan}
    assert audit_arm_configs(cfgs) == []
    bad = ("m2po", 2, 1e-4, 1)
    cfgs[bad] = run_config(Grid(**{**QUICK.__dict__, "max_new_tokens": 41}), *bad, tmp_path)
    problems = audit_arm_configs(cfgs)
    assert problems and all(p.startswith("stale-m2po-mu2-lr0.0001-s1 vs mu-grpo: ") for p in problems)
    assert any("generation.sampling.max_new_tokens = 41 vs 40" in p for p in problems)


def test_grad_norm_spikes_and_entropy_bins():
    norms = [1.0, 1.2, 0.9, 1.1, 1.0, 6.0, 1.0, 30.0]
    assert grad_norm_spikes(norms) == 2  # 6.0 > 5 x 1.0 (median of the first five), 30.0 > 5 x 1.0 (of the first seven)
    assert grad_norm_spikes(norms, before=8) == 1  # the spike at update 8 is the collapse itself: not before it
    assert grad_norm_spikes([1.0, 100.0, 1.0]) == 0  # the first SPIKE_WARMUP updates set the baseline only
    steps = [{"entropy": e, "f": f} for e, f in [(3.0, 0.3), (1.0, 0.1), (2.0, 0.2), (5.0, 0.5), (4.0, 0.4), (6, 0.6)]]
    assert entropy_bins(steps, "f") == pytest.approx([0.15, 0.35, 0.55])  # by entropy: (1, 2), (3, 4), (5, 6)
    assert entropy_bins([{"entropy": None, "f": 1.0}], "f") == [None, None, None]


def _arm_run(regime, mu, seed, greedy, collapse=None):
    r = _run(regime, mu, 1e-4, seed, sum(greedy.values()) / len(greedy), collapse)
    r.extra = {"greedy_by_problem": greedy, "avg8_by_problem": {}, "correction_ess": 0.5, "masked_frac": 0.1,
               "grad_norm_spikes": 1, "extra_forward_passes": 0.0,
               "entropy_binned": [0.1, 0.2, 0.3], "entropy_binned_key": "masked_frac"}  # fmt: skip
    return r


def test_arm_report_pairs_each_arm_with_mu_grpo_by_problem_and_finds_the_largest_stable_mu():
    from mugrpo.evaluation.metrics import paired_difference_ci

    g = Grid(mus=(4, 16), lrs=(1e-4,), seeds=(0, 1), regimes=("mu-grpo", "m2po"))
    mu = {"a": 1.0, "b": 0.0, "c": 1.0}
    results = [_arm_run("mu-grpo", m, s, mu) for m in (4, 16) for s in (0, 1)]
    results += [
        _arm_run("m2po", 4, 0, {"a": 1.0, "b": 1.0, "c": 1.0}),
        _arm_run("m2po", 4, 1, {"a": 0.0, "b": 1.0, "c": 1.0}),
    ]
    results += [_arm_run("m2po", 16, s, {"a": 0.0, "b": 0.0, "c": 0.0}, collapse=16) for s in (0, 1)]
    arms = {a["arm"]: a for a in arm_report(results, g)}
    assert arms["mu-grpo"]["largest_stable_mu"] == 16 and arms["m2po"]["largest_stable_mu"] == 4
    row = arms["m2po"]["by_mu"][0]
    seed_mean = {"a": 0.5, "b": 1.0, "c": 1.0}
    want = paired_difference_ci(seed_mean, mu)
    assert row["greedy"] == pytest.approx(2.5 / 3)
    assert row[f"greedy_vs_{BASELINE_ARM}"] == pytest.approx({"diff": want.mean, "low": want.low, "high": want.high})
    assert row["avg8"] is None and row[f"avg8_vs_{BASELINE_ARM}"] is None  # no sampled eval in these runs
    assert arms["mu-grpo"]["by_mu"][0][f"greedy_vs_{BASELINE_ARM}"] is None  # the baseline is not paired with itself
    assert row["grad_norm_spikes"] == 2 and row["entropy_binned"] == pytest.approx([0.1, 0.2, 0.3])
    assert row["t_total_s"] == 1.0 and row["extra_forward_passes"] == 0.0  # T_total: the runs' measured wall
