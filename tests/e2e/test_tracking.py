"""Experiment tracking, offline: a real tiny run (real CLI, Prefect flows, jobs) mirrored into TensorBoard, W&B
(offline mode) and MLflow (SQLite store), each read back through the tracker's own reader; then a tracker process
SIGKILLed after logging half a run and a resumed one, with one continuous curve and no step twice.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _tiny import RUN, run_cli, run_env, tiny_config, write_config

from mugrpo.config import ConfigError, config_from_dict, load_config

SINKS = ["tensorboard", "wandb", "mlflow"]

pytestmark = pytest.mark.slow  # one real tiny run through the CLI (about a minute on a quiet machine)


def _tracking_config(root: Path, model_dir: Path, tracking_dir: Path) -> dict:
    tracking = {"sinks": SINKS, "dir": str(tracking_dir), "wandb_mode": "offline", "rollout_samples": 3}
    return tiny_config(root, model_dir, eval={"every_stage": True}, tracking=tracking)


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, tiny_model_dir, prefect_api):  # noqa: F811
    """A 2-stage tiny run with all three sinks on, through `mugrpo run`; returns (config path, run dir, tracking)."""
    tmp = tmp_path_factory.mktemp("tracked")
    cfg_path = write_config(tmp / "run.yaml", _tracking_config(tmp / "root", tiny_model_dir, tmp / "tracking"))
    out = run_cli(["run", str(cfg_path)], run_env(prefect_api, WANDB_SILENT="true"), timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (tmp / "run.log").write_text(out.stdout + out.stderr)
    return cfg_path, tmp / "root" / RUN, tmp / "tracking"


def _store_updates(run: Path) -> list[int]:
    return sorted(
        u
        for f in (run / "train_steps").rglob("part-*.parquet")
        for u in pq.read_table(f, columns=["update"])["update"].to_pylist()
    )


def _tensorboard(tracking: Path) -> dict:
    from mugrpo.tracking.tensorboard import read_scalars

    return read_scalars(tracking / "tensorboard")


def _wandb_rows(tracking: Path, cfg_path: Path) -> list[dict]:
    from mugrpo.orchestration.runs import open_store
    from mugrpo.tracking.wandb_sink import read_offline_history, wandb_run_id

    cfg = load_config(cfg_path, [])
    return read_offline_history(tracking, wandb_run_id(cfg.run.id, open_store(cfg).uri(cfg.run.id)))


def _mlflow_history(tracking: Path, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tracking / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("mugrpo").experiment_id])
    return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]


def test_every_sink_holds_every_committed_update_stage_and_eval(tracked_run):
    cfg_path, run, tracking = tracked_run
    updates = _store_updates(run)
    assert updates == list(range(1, 7))
    losses = {
        u: loss
        for f in (run / "train_steps").rglob("part-*.parquet")
        for u, loss in zip(*pq.read_table(f, columns=["update", "loss"]).to_pydict().values(), strict=True)
    }

    tb = _tensorboard(tracking)
    assert [s for s, _ in tb["train/loss"]] == updates
    assert all(abs(v - losses[s]) < 1e-6 for s, v in tb["train/loss"])
    assert [v for _, v in tb["stage/index"]] == [0, 1, 2]  # two stages, then the final evaluation
    assert [s for s, _ in tb["stage/t_total"]] == [3, 6]  # stage summaries sit at the stage's last update
    assert any(tag.startswith("eval/gsm8k/avg@") for tag in tb)

    rows = _wandb_rows(tracking, cfg_path)
    train_rows = [r for r in rows if "train/loss" in r]
    assert [int(r["train/update"]) for r in train_rows] == updates
    assert [r["train/loss"] for r in train_rows] == pytest.approx([losses[u] for u in updates])
    assert [int(r["stage/index"]) for r in rows if "stage/index" in r] == [0, 1, 2]
    assert any(r.get("rollouts/stage_0/nrows") == 3 for r in rows)  # the rollout sample table (3 rows)

    assert [s for s, _ in _mlflow_history(tracking, "train/loss")] == updates
    assert [v for _, v in _mlflow_history(tracking, "stage/index")] == [0, 1, 2]
    assert _mlflow_history(tracking, "eval/gsm8k/avg_at_1")


def test_job_logs_carry_plain_progress_lines_not_bar_frames(tracked_run):
    cfg_path, _, _ = tracked_run
    log = (cfg_path.parent / "run.log").read_text()
    assert "train stage 0: 3/3 updates (100%)" in log
    assert re.search(r"generate stage 1: \d+ tokens \([\d.]+ tok/s\), 4/4 prompts, ETA", log), log[-3000:]
    assert "Loading weights" not in log and "\r" not in log


def test_hyperparameters_are_logged_without_credentials(tracked_run, tmp_path):
    from mlflow.tracking import MlflowClient

    _, _, tracking = tracked_run
    client = MlflowClient(tracking_uri=f"sqlite:///{tracking / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("mugrpo").experiment_id])
    params = run.data.params
    assert params["loss.name"] == "mu_grpo" and params["train.updates_per_stage"] == "3"
    assert not any("secret" in k.lower() or "tracking" in k for k in params)


_SYNC = textwrap.dedent(
    """
    import sys, time
    from mugrpo.config import load_config
    from mugrpo.orchestration.runs import open_store
    from mugrpo.tracking.session import TrackingSession
    cfg = load_config(sys.argv[1], [])
    session = TrackingSession(cfg, open_store(cfg))
    print("logged", session.sync(), flush=True)
    if sys.argv[2] == "hang":
        time.sleep(600)  # SIGKILLed here: no close(), no flush beyond what each sink made durable itself
    session.__exit__(None, None, None)
    """
)


def _partial_copy(run: Path, dest: Path) -> None:
    """The run as it stood in the middle of stage 1: stage 0 committed, stage 1 at its first checkpoint."""
    shutil.copytree(run, dest)
    for rel in ("stages/stage=1.json", "jobs/stage=1/train.manifest.json", "jobs/stage=1/eval.manifest.json"):
        (dest / rel).unlink(missing_ok=True)
    for part in (dest / "train_steps/stage=1").glob("part-*.parquet"):
        if part.name != "part-00001.parquet":
            part.unlink()
    kept = sorted((dest / "checkpoints/stage=1").glob("step=*"))  # older ones were pruned (train.keep_checkpoints)
    kept[-1].rename(kept[-1].with_name("step=000001"))  # stands in for the first checkpoint
    for ckpt in kept[:-1]:
        shutil.rmtree(ckpt)
    shutil.rmtree(dest / "jobs/stage=2", ignore_errors=True)


def test_a_killed_tracker_resumes_with_no_step_twice(tracked_run, tmp_path):
    cfg_path, run, _ = tracked_run
    raw = yaml.safe_load(cfg_path.read_text())
    raw["run"]["root"] = str(tmp_path / "root")
    raw["tracking"]["dir"] = str(tmp_path / "tracking")
    cfg = tmp_path / "resume.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    script = tmp_path / "sync.py"
    script.write_text(_SYNC)
    env = {**os.environ, "WANDB_SILENT": "true"}

    _partial_copy(run, tmp_path / "root" / RUN)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(cfg), "hang"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    first = proc.stdout.readline()
    assert first == f"logged {len(SINKS) * 5}\n"  # per sink: updates 1-4 and stage 0's summary
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)

    shutil.rmtree(tmp_path / "root" / RUN)
    shutil.copytree(run, tmp_path / "root" / RUN)  # the run went on and finished
    out = subprocess.run(
        [sys.executable, str(script), str(cfg), "close"], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # Per sink: updates 5-6, stage 1's summary and the final evaluation; plus whatever W&B's service had not yet
    # written to its offline log when the kill came (the cursor reads back what reached the log).
    assert int(out.stdout.split()[1]) >= len(SINKS) * 4, out.stdout

    tracking = tmp_path / "tracking"
    updates = list(range(1, 7))
    tb_steps = [s for s, _ in _tensorboard(tracking)["train/loss"]]
    assert tb_steps == updates
    wb = [int(r["train/update"]) for r in _wandb_rows(tracking, cfg) if "train/loss" in r]
    assert wb == updates and Counter(wb).most_common(1)[0][1] == 1
    assert [s for s, _ in _mlflow_history(tracking, "train/loss")] == updates
    assert [v for _, v in _mlflow_history(tracking, "stage/index")] == [0, 1, 2]


@pytest.mark.parametrize("slow", [False], ids=["fast"])
def test_unknown_or_missing_sink_fails_at_config_load(monkeypatch, slow):
    with pytest.raises(ConfigError, match="tracking sink"):
        config_from_dict({"tracking": {"sinks": ["tensorbord"]}})
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'mugrpo\[tracking-wandb\]'"):
        config_from_dict({"tracking": {"sinks": ["wandb"]}})
