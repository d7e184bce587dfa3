"""The install works end to end: the tour a new user takes, on the tiny policy (`make test` runs it).

``mugrpo run`` on a one-stage tiny config, exactly as a user types it: no Prefect server configured, so the CLI
starts Prefect's temporary local server and runs the real run and stage flows, which launch the real generate, train
and eval jobs as processes. Then ``mugrpo status``, ``mugrpo sql`` and ``mugrpo verify`` read the run back, and
the HTML report is there. About a minute on a 2-core CPU.
"""

from __future__ import annotations

import json
import os

import pytest
from _tiny import RUN, run_cli, tiny_config, write_config

pytestmark = pytest.mark.smoke


def test_a_tiny_run_through_prefect_then_status_sql_and_verify(tmp_path, tiny_model_dir):
    config = tiny_config(
        tmp_path / "runs", tiny_model_dir, run={"num_stages": 1}, train={"updates_per_stage": 2}, tracking={"sinks": []}
    )
    path = write_config(tmp_path / "tiny.yaml", config)
    # A new user's environment: no Prefect server (this process's test server, if any, left out), a fresh
    # PREFECT_HOME so the temporary server's database is this test's own.
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONUNBUFFERED="1")

    out = run_cli(["run", str(path)], env, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    said = out.stdout + out.stderr  # the precision line, once: by the preflight that resolved it, not by the flow
    assert said.count("precision: model.dtype=float32") == 1, said[-4000:]
    run = tmp_path / "runs" / RUN
    assert (run / "stages/stage=0.json").is_file() and (run / "policies/stage=1/_COMPLETE").is_file()

    status = run_cli(["status", str(run)], env, timeout=300)
    assert status.returncode == 0 and "complete" in status.stdout, status.stdout + status.stderr

    query = "SELECT count(*) AS n, count(DISTINCT prompt_id) AS prompts FROM rollouts"
    sql = run_cli(["sql", str(run), query, "--format", "json"], env, timeout=300)
    assert sql.returncode == 0, sql.stderr
    assert json.loads(sql.stdout) == [{"n": 4 * 2, "prompts": 4}]  # 4 prompts x 2 responses
    steps = run_cli(["sql", str(run), "SELECT count(*) AS n FROM train_steps", "-f", "json"], env, timeout=300)
    assert json.loads(steps.stdout) == [{"n": 2}]

    verify = run_cli(["verify", str(run)], env, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "<svg" in (run / "report.html").read_text()
