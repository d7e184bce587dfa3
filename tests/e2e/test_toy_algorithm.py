"""A sixth algorithm added without editing a shared file (tests/plugins/toy_dapo.py, loaded as a plugin through
``MUGRPO_PLUGINS``): its own rollout columns, its own per-rollout loss input and loss, DAPO-style dynamic sampling
(over-sampled stage, zero-variance groups filtered once scored), exact on resume. Real jobs on the tiny policy, in a
fresh interpreter (the plugin must be loaded before the config models are built, as in every job process)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from _tiny import REPO_ROOT, job_env

PLUGINS = REPO_ROOT / "tests" / "plugins"


@pytest.mark.slow
def test_a_plugin_algorithm_with_its_own_input_and_dynamic_sampling(tmp_path, tiny_model_dir):
    out = tmp_path / "report.json"
    env = job_env(
        MUGRPO_PLUGINS="toy_dapo",
        PYTHONPATH=":".join([str(REPO_ROOT), str(REPO_ROOT / "tests"), str(PLUGINS)]),
    )
    done = subprocess.run(
        [sys.executable, str(PLUGINS / "toy_dapo_run.py"), str(tmp_path / "runs"), str(tiny_model_dir), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())

    assert report["stage_prompts"] == 6  # 4 asked, x 1.5 (Algorithm.stage_prompts)
    assert "needs the per-rollout input(s) ['toy_scale']" in report["refused"]  # the loss without its provider
    assert report["extension_columns"] == "toy_filtered,toy_weight"  # declared columns the schema lacks

    groups = report["groups"]
    assert len(groups) == 6
    kept = [g for g in groups if not g["filtered"]]
    assert len(kept) == 2 and not any(g["zero_variance"] for g in kept)
    assert all(g["filtered"] for g in groups if g["zero_variance"])  # the filter: no variance, no training
    first_two = [g for g in groups if not g["zero_variance"]][:2]  # kept in plan order, the rest filtered
    assert kept == first_two
    assert all(g["weight"] > 1.0 for g in kept)  # 1 + the group's reward std
    counts = report["counts"]
    assert counts["rows"] == 2 * 4 and counts["excluded_rows"] == 4 * 4 and counts["prompts"] == 2
    assert report["resumed_equal"]  # the re-run rebuilt the kept count from the committed shards

    assert report["train_counts"]["rows"] == 8 and report["train_counts"]["excluded_rows"] == 16
    # One exclusion rule: the report's training figures and the tracker's rollout samples leave the filtered rows
    # out, as training did: 8 rows trained on, 4 filtered groups, none of which is shown.
    shown = report["shown"]
    assert "toy_filtered" in shown["excluding"] and shown["report_rollouts"] == 8
    assert shown["filtered_prompts"] == 4 and shown["sample_rows"] == 8 and shown["sample_filtered"] == 0
    weights = sorted(g["weight"] for g in kept)
    for step in report["steps"]:
        assert step["num_sequences"] == 4
        scale = step["loss_metrics"]["toy_scale_mean"]  # the loss read the algorithm's input
        assert weights[0] - 1e-9 <= scale <= weights[-1] + 1e-9 and math.isfinite(scale)
