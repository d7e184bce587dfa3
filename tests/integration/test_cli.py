"""The `mugrpo` command line and run bookkeeping: config, data check, status, a refused config change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from mugrpo.cli import app
from mugrpo.config import ConfigError, load_config
from mugrpo.orchestration.runs import ConfigMismatchError, init_run

runner = CliRunner()
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def test_config_show_applies_overrides():
    result = runner.invoke(app, ["config", "show", "configs/gsm8k-smollm2-quick.yaml", "train.lr=3e-6"])
    assert result.exit_code == 0, result.output
    assert "lr: 3.0e-06" in result.output and "id: gsm8k-smollm2-quick" in result.output


def test_config_error_exits_2_naming_the_key():
    result = runner.invoke(app, ["config", "show", "configs/gsm8k-smollm2-quick.yaml", "loss.veto_scope=all"])
    assert result.exit_code == 2
    assert "loss.veto_scope = 'all'" in result.output


def test_config_reference_lists_every_section():
    result = runner.invoke(app, ["config", "reference"])
    assert result.exit_code == 0
    for section in ("`run`", "`loss`", "`train`", "`generation.sampling`", "`reward`", "`orchestration`"):
        assert f"### {section}" in result.output


def test_data_check_counts_rows(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n{oops\n")
    ok = runner.invoke(app, ["data", "check", "configs/gsm8k-smollm2-quick.yaml"])
    assert ok.exit_code == 0, ok.output
    assert "7473 rows" in ok.output.replace("\n", " ")
    fail = runner.invoke(app, ["data", "check", "configs/gsm8k-smollm2-quick.yaml", f"data.train.path={bad}"])
    assert fail.exit_code == 1 and "bad.jsonl:2" in fail.output.replace("\n", "")


def test_status_of_a_missing_run_is_a_clear_error(tmp_path):
    result = runner.invoke(app, ["status", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no run 'nope'" in result.output


def test_new_run_status_and_a_refused_config_change(tmp_path, tiny_model_dir):
    overrides = [f"run.root={tmp_path}", "run.id=r1", f"model.source={tiny_model_dir}", "run.num_stages=2"]
    cfg = load_config("configs/gsm8k-smollm2-quick.yaml", overrides)
    init_run(cfg)
    assert (tmp_path / "r1" / "policies/stage=0/_COMPLETE").exists()
    stored = json.loads((tmp_path / "r1" / "run.json").read_text())
    assert stored["config"]["run"]["id"] == "r1" and stored["code_version"]
    result = runner.invoke(app, ["status", str(tmp_path / "r1")])
    assert result.exit_code == 0, result.output
    assert "pending" in result.output and "left: stages [0, 1]" in result.output
    init_run(cfg)  # same config: accepted (resume)
    changed = load_config("configs/gsm8k-smollm2-quick.yaml", [*overrides, "train.lr=5e-5"])
    with pytest.raises(ConfigMismatchError) as e:
        init_run(changed)
    assert "semantic (" in str(e.value) and "train.lr: 1e-05 -> 5e-05" in str(e.value)
    # Orchestration settings may change on resume.
    init_run(load_config("configs/gsm8k-smollm2-quick.yaml", [*overrides, "orchestration.retries=3"]))
    # A run.json written before a key existed resumes with that key's default; one holding a key this version no
    # longer has is refused, naming the key and the file.
    run_json = tmp_path / "r1" / "run.json"
    older = json.loads(run_json.read_text())
    del older["config"]["run"]["stage_schedule"]
    run_json.write_text(json.dumps(older))
    init_run(cfg)
    older["config"]["train"]["removed_knob"] = 1
    run_json.write_text(json.dumps(older))
    with pytest.raises(ConfigError, match=r"r1/run.json.*unknown key 'train.removed_knob'"):
        init_run(cfg)


def test_status_shows_what_a_preempted_train_job_saved(tmp_path, tiny_model_dir):
    """The record the train job writes on a preemption notice (mugrpo.trainer.preemption) is where status reads it."""
    from mugrpo.storage.store import Store
    from mugrpo.trainer.preemption import Preempted, write_preemption_record

    cfg = load_config(
        "configs/gsm8k-smollm2-quick.yaml", [f"run.root={tmp_path}", "run.id=p1", f"model.source={tiny_model_dir}"]
    )
    init_run(cfg)
    stop = Preempted(stage=0, done=3, saved=2, total=6, dropped=False, checkpoint=None)
    write_preemption_record(Store(str(tmp_path)), cfg.layout, stop)
    result = runner.invoke(app, ["status", str(tmp_path / "p1")])
    assert result.exit_code == 0, result.output
    assert "preempted" in result.output and f"preempted: {stop}" in " ".join(result.output.split())


def test_report_and_status_on_wrong_paths(tmp_path, tiny_model_dir):
    result = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "does not exist" in result.output
    cfg = load_config(
        "configs/gsm8k-smollm2-quick.yaml", [f"run.root={tmp_path}", "run.id=r2", f"model.source={tiny_model_dir}"]
    )
    init_run(cfg)
    result = runner.invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 2 and "is a folder of runs; pass one of" in result.output and "/r2" in result.output


def test_a_bad_training_row_is_refused_before_anything_is_written(tmp_path, tiny_model_dir, prefect_api):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n{oops\n")
    overrides = [
        f"run.root={tmp_path}/runs",
        "run.id=broken",
        f"model.source={tiny_model_dir}",
        f"data.train.path={bad}",
        "data.train.on_bad_row=error",
    ]
    result = runner.invoke(app, ["run", "configs/gsm8k-smollm2-quick.yaml", *overrides])
    assert result.exit_code == 2, result.output
    assert "bad.jsonl:2: invalid JSON" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "runs" / "broken").exists()  # nothing written: no run folder, no history entry


def test_a_failed_job_stops_the_run_with_its_error_and_the_resume_command(tmp_path, tiny_model_dir, prefect_api):
    # A generation interpreter that fails when it starts (a broken image, a missing driver): the first job fails.
    broken = tmp_path / "broken-python"
    broken.write_text("#!/bin/sh\necho 'generation interpreter: no usable driver found' >&2\nexit 1\n")
    broken.chmod(0o755)
    overrides = [
        f"run.root={tmp_path}",
        "run.id=broken",
        f"model.source={tiny_model_dir}",
        f"generation.python={broken}",
        "orchestration.retries=0",
    ]
    result = runner.invoke(app, ["run", "configs/gsm8k-smollm2-quick.yaml", *overrides])
    out = result.output.replace("\n", " ")
    assert result.exit_code == 1, result.output
    assert "run broken stopped" in out and "no usable driver found" in out, result.output
    assert f"mugrpo resume {tmp_path}/broken" in out
    assert (tmp_path / "broken" / "policies/stage=0/_COMPLETE").exists()  # committed work is kept
