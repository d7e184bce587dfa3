"""Tracker sinks write only under the tracking folder, never into the current directory.

MLflow's default artifact root is ``./mlruns`` relative to the working directory, so a sink that left it to MLflow
filled the checkout of whoever ran the tests. Each sink here is opened with the current directory set to an empty
folder, logs a train event and a stage event with a rollout table (MLflow stores that table as an artifact), and
closes; the folder must still be empty and the files must be under the tracking folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import import_or_fail

from mugrpo.tracking import TRACKING_SINKS
from mugrpo.tracking.base import STAGE_CURSOR_KEY, TRAIN_CURSOR_KEY, Event, SinkContext


def _context(tracking: Path) -> SinkContext:
    return SinkContext(
        run_id="paths",
        run_uri=f"file://{tracking}/root/paths",
        local_dir=str(tracking),
        project="mugrpo-test",
        hparams={"loss": {"name": "mu_grpo"}},
        options={"wandb_mode": "offline"},
    )


def _events() -> list[Event]:
    table = (["prompt_id", "reward"], [["p0", 1.0], ["p1", 0.0]])
    return [
        Event("train", 1, {"train/loss": 0.5, TRAIN_CURSOR_KEY: 1.0}),
        Event("stage", 1, {"stage/t_total": 3.0, STAGE_CURSOR_KEY: 0.0}, table=table, stage=0),
    ]


@pytest.mark.parametrize("sink", ["tensorboard", "wandb", "mlflow"])
def test_a_sink_writes_nothing_into_the_current_directory(sink, tmp_path, monkeypatch):
    spec = TRACKING_SINKS[sink]
    import_or_fail(spec.module)  # the dev extra installs all three
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    tracking = tmp_path / "tracking"

    opened = spec.factory(_context(tracking))
    try:
        opened.log(_events())
    finally:
        opened.close()

    assert sorted(p.name for p in cwd.iterdir()) == []
    assert any(p.is_file() for p in tracking.rglob("*"))
    if sink == "mlflow":
        (artifact,) = tracking.glob("mlflow-artifacts/*/artifacts/rollouts/stage_0.json")
        assert '"p0"' in artifact.read_text()
