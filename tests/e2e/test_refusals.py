"""Every refusal is one block, printed once, with exit code 2 (what was asked is wrong) or 3 (the run's state refuses
it), before Prefect starts, and writes nothing: no history entry in run.json, no empty run folder
(docs/reliability.md, "Refusals"). The real `mugrpo` command line on a real tiny run; changed configs and changed
inputs are refused the same way (tests/unit/test_resume_inputs.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _tiny import REPO_ROOT, RUN, gsm8k_train, run_cli, run_env, tiny_config, write_config

from mugrpo.storage.layout import RunLayout

pytestmark = pytest.mark.slow


def assert_one_block(out: subprocess.CompletedProcess, code: int, needle: str) -> str:
    text = out.stdout + out.stderr
    assert out.returncode == code, text[-3000:]
    assert text.count(needle) == 1, text[-3000:]
    assert "Traceback" not in text and text.count("Error:") == 1, text[-3000:]
    return text


@pytest.fixture(scope="module")
def committed(tiny_model_dir, tmp_path_factory, prefect_api) -> dict:  # noqa: F811
    """A one-stage tiny run, committed through `mugrpo run`."""
    tmp = tmp_path_factory.mktemp("refusals")
    config = write_config(tmp / "run.yaml", tiny_config(tmp / "runs", tiny_model_dir, run={"num_stages": 1}))
    out = run_cli(["run", str(config)], run_env(prefect_api), tmp / "cli.log")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return {"tmp": tmp, "config": config, "run": tmp / "runs" / RUN, "env": run_env(prefect_api)}


def test_a_corrupted_shard_refuses_the_resume_once_and_records_nothing(committed):
    run = committed["run"]
    shard = run / "rollouts/stage=0/shard=00000.parquet"
    original, history = shard.read_bytes(), (run / "run.json").read_bytes()
    shard.write_bytes(original[:-100])
    try:
        out = run_cli(["resume", str(run)], committed["env"])
        text = assert_one_block(out, 3, "has corrupted committed files")
        assert "shard=00000.parquet" in text
        assert (run / "run.json").read_bytes() == history  # no "resume" entry
    finally:
        shard.write_bytes(original)


def test_a_missing_training_file_names_its_key_and_leaves_no_run_folder(tiny_model_dir, tmp_path, prefect_api):  # noqa: F811
    missing = tmp_path / "gone.jsonl"
    cfg = tiny_config(tmp_path / "runs", tiny_model_dir, data={"train": {**gsm8k_train(), "path": str(missing)}})
    out = run_cli(["run", str(write_config(tmp_path / "run.yaml", cfg))], run_env(prefect_api))
    text = assert_one_block(out, 2, "an input is missing")
    assert "data.train.path" in text and str(missing) in text
    assert not (tmp_path / "runs" / RUN).exists()


def test_a_stage_larger_than_the_training_set_is_refused_before_anything_is_written(
    tiny_model_dir,
    tmp_path,
    prefect_api,  # noqa: F811
):
    cfg = tiny_config(tmp_path / "runs", tiny_model_dir, data={"train": gsm8k_train(limit=3)})  # 4 prompts a stage
    out = run_cli(["run", str(write_config(tmp_path / "run.yaml", cfg))], run_env(prefect_api))
    text = assert_one_block(out, 2, "asks for 4 prompts but the training set")
    assert "holds 3" in text and "generation.prompts_per_stage" in text
    assert not (tmp_path / "runs" / RUN).exists()


def test_of_two_runs_started_together_the_loser_is_one_block(tiny_model_dir, tmp_path, prefect_api):  # noqa: F811
    config = write_config(tmp_path / "run.yaml", tiny_config(tmp_path / "runs", tiny_model_dir, run={"num_stages": 1}))
    env = {**run_env(prefect_api), "MUGRPO_RUN_SLOT": "off"}
    cmd = [sys.executable, "-m", "mugrpo.cli", "run", str(config)]
    procs = [
        subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [subprocess.CompletedProcess(cmd, p.wait(timeout=900), *p.communicate()) for p in procs]
    codes = sorted(o.returncode for o in outs)
    assert codes == [0, 3], [o.stdout[-2000:] + o.stderr[-2000:] for o in outs]
    loser = next(o for o in outs if o.returncode == 3)
    assert_one_block(loser, 3, "is being written by")
    run = tmp_path / "runs" / RUN
    history = json.loads((run / "run.json").read_text())["history"]
    assert [e["event"] for e in history] == ["start"]  # the loser recorded nothing
    assert (run / RunLayout(RUN).rel(RunLayout(RUN).stage_manifest(0))).exists()
