"""Small things a user meets: `mugrpo sql NAME` with a bare relative run folder, `mugrpo verify` on a
completed run saying what its final row holds, and stage manifests that name the code version that wrote them.
Real command line (typer's runner), real run folders."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from typer.testing import CliRunner

from mugrpo.cli import app
from mugrpo.commits.manifest import new_manifest, read_manifest, write_job_manifest, write_manifest
from mugrpo.common.version import code_version
from mugrpo.config import load_config
from mugrpo.orchestration.runs import init_run, open_store
from mugrpo.storage.layout import RunLayout
from schemas import JobManifest

runner = CliRunner()


@pytest.fixture
def finished_run(tmp_path, tiny_model_dir):
    """A 1-stage run whose stage, final policy and final evaluation are committed (no rollouts needed here)."""
    cfg = load_config(
        "configs/gsm8k-smollm2-quick.yaml",
        [f"run.root={tmp_path}", "run.id=done", f"model.source={tiny_model_dir}", "run.num_stages=1"],
    )
    init_run(cfg)
    store, layout = open_store(cfg), RunLayout("done")
    store.upload_dir(tiny_model_dir, layout.policy_dir(1))
    now = datetime.now(UTC)
    write_job_manifest(store, JobManifest(run_id="done", stage=1, job="eval", created_at=now, files=[]))
    write_manifest(store, new_manifest("done", 0, []))
    return tmp_path, cfg


def test_sql_takes_a_bare_relative_run_folder(finished_run, monkeypatch):
    root, _ = finished_run
    monkeypatch.chdir(root)
    for target in ("done", "./done", "done/"):
        result = runner.invoke(app, ["sql", target, "SELECT run_id, stages_committed FROM runs"])
        assert result.exit_code == 0, result.output
        assert "done" in result.output and "1" in result.output


def test_verify_says_what_the_final_row_holds(finished_run):
    root, _ = finished_run
    result = runner.invoke(app, ["verify", str(root / "done")])
    assert result.exit_code == 0, result.output
    final = next(line for line in result.output.splitlines() if "final" in line)
    assert "final policy, final eval" in final and " no " not in final


def test_manifests_carry_the_code_version(finished_run):
    _, cfg = finished_run
    store = open_store(cfg)
    assert read_manifest(store, "done", 0).code_version == code_version()
    raw = store.read_json(RunLayout("done").job_manifest(1, "eval"))
    assert raw["code_version"] == code_version()
