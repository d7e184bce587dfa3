"""The stale-data corrections in real training jobs on the tiny policy (CPU, in-process, real Parquet), read back
through ``mugrpo sql``'s ``stage_corrections`` view and the run report: a3po gets its alpha from the trainer's
versions through its hooks (0, 0, 1/2, 2/3 over a stage's first four updates), m2po masks, and the view's per-stage
mask fraction and ESS are those of the committed per-update metrics.

The rollouts are synthetic but real (:mod:`bench.support.synthetic`): behavior log-probs from a teacher-forced
forward of the same policy, shifted by up to 0.5 nats per token so the ratios move off 1 from update 1.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from _tiny import train_spec

from bench.support.synthetic import commit_rollouts, synthetic_rollout_rows
from mugrpo.inspection.report import collect, render
from mugrpo.sql import connect
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.loop import run_training
from mugrpo.trainer.records import read_steps


def _train(root: Path, tiny_model_dir: Path, run_id: str, loss: str) -> list[dict]:
    store, layout = Store(str(root)), RunLayout(run_id)
    store.upload_dir(tiny_model_dir, layout.policy_dir(0), meta={"stage": 0})
    rows = synthetic_rollout_rows(
        tiny_model_dir, run_id=run_id, num_prompts=4, group_size=4, seed=3, response_tokens=(2, 16)
    )
    rng = random.Random(1)
    for row in rows:
        row["behavior_logprobs"] = [x - 0.5 * rng.random() for x in row["behavior_logprobs"]]
    commit_rollouts(store, run_id, 0, rows, shard_size=2)
    store.write_json(layout.run_json, {"created_at": "2026-01-01T00:00:00+00:00", "config": {"loss": {"name": loss}}})
    spec = train_spec(
        root,
        run_id,
        train={"updates_per_stage": 4, "rollouts_per_update": 8, "checkpoint_every": 4, "lr": 1e-3},
        loss={"name": loss},
    )
    run_training(spec)
    table, _ = read_steps(store, layout, 0)
    return table.to_pylist()


def _ess(step: dict) -> float:
    m = step["loss_metrics"]
    m = dict(m) if not isinstance(m, dict) else m
    return m["correction_w_mean"] ** 2 / m["correction_w_sq_mean"]


def _metric(step: dict, key: str) -> float:
    return dict(step["loss_metrics"])[key]


@pytest.mark.slow  # two tiny training jobs (~30 s on a loaded 2-core machine)
def test_corrections_in_real_training_and_in_the_sql_view_and_report(tiny_model_dir, tmp_path):
    root = tmp_path / "store"
    a3po = _train(root, tiny_model_dir, "stale-a3po", "a3po")
    assert [s["stage_update"] for s in a3po] == [1, 2, 3, 4]
    # v_theta - v_behav = 0, 1, 2, 3 over the stage's updates: alpha = 0, 0, 1/2, 2/3 (proximal_lag 1)
    assert [_metric(s, "a3po_alpha_mean") for s in a3po] == pytest.approx([0.0, 0.0, 0.5, 2 / 3])
    m2po = _train(root, tiny_model_dir, "stale-m2po", "m2po")
    masked = [_metric(s, "correction_masked_frac") for s in m2po]
    assert all(0.0 < f < 1.0 for f in masked)  # up to 0.5 nats of shift: mean (log rho)^2 ~0.08 > 0.04 at update 1
    assert all(_metric(s, "m2po_m2_kept") < 0.04 <= _metric(s, "m2po_m2") for s in m2po)

    for run_id, steps in (("stale-a3po", a3po), ("stale-m2po", m2po)):
        with connect(str(root / run_id)) as cat:
            (row,) = cat.arrow("SELECT * FROM stage_corrections").to_pylist()
        assert row["stage"] == 0 and row["updates"] == 4 and row["loss"] == run_id.split("-")[1]
        assert row["masked_frac"] == pytest.approx(sum(_metric(s, "correction_masked_frac") for s in steps) / 4)
        assert row["correction_ess"] == pytest.approx(sum(_ess(s) for s in steps) / 4)
        assert row["correction_ess_min"] == pytest.approx(min(_ess(s) for s in steps))
        assert 0.0 < row["correction_ess"] < 1.0
        assert row["clip_frac"] == pytest.approx(sum(s["clip_frac_low"] + s["clip_frac_high"] for s in steps) / 4)
        assert row["sampler_ess"] == pytest.approx(sum(s["ess"] for s in steps) / 4)

    data = collect(str(root / "stale-m2po"))
    assert [c["stage"] for c in data.corrections] == [0]
    page = render(data)
    assert "Stale-data correction by stage" in page and "<code>m2po</code>" in page
    assert f"{data.corrections[0]['correction_ess']:.4g}" in page
