"""MLflow sink: one MLflow run per mugrpo run, found again by tag on resume.

- Tracking URI: ``tracking.mlflow_tracking_uri``, else ``MLFLOW_TRACKING_URI``, else a SQLite file in the tracking
  folder (MLflow 3 keeps its file store in maintenance mode and recommends a database). With that default, artifacts
  go to ``mlflow-artifacts/`` beside it: MLflow's own default artifact root is ``./mlruns`` in the current directory.
- Run: experiment ``tracking.project``; the run carries the tag ``mugrpo.run_uri`` (unique across roots) and the run
  id as its name; a resumed mugrpo run finds it by that tag and logs into it.
- Cursor: the metric history of the cursor keys, read back through ``MlflowClient``. Each sync is one
  ``log_batch`` per 1,000 metrics, so a kill leaves whole batches.
- Rollout samples: a JSON artifact per stage in MLflow's table layout (``{"columns": ..., "data": ...}``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from mugrpo.tracking.base import (
    STAGE_CURSOR_KEY,
    TRACKING_SINKS,
    TRAIN_CURSOR_KEY,
    Cursor,
    Event,
    SinkContext,
    SinkSpec,
    flatten,
)

RUN_TAG = "mugrpo.run_uri"
_BATCH = 1000  # MLflow's log_batch limit on metrics per call


def tracking_uri(ctx: SinkContext) -> str:
    """Where the MLflow run lives (see the module docstring)."""
    uri = ctx.options.get("mlflow_tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    Path(ctx.local_dir).mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{Path(ctx.local_dir).resolve() / 'mlflow.db'}"


def artifact_location(ctx: SinkContext) -> str | None:
    """Artifact root of a new experiment: ``{tracking dir}/mlflow-artifacts`` when the tracking URI is our default
    SQLite file, else None (the tracking server's or the user's URI decides)."""
    if ctx.options.get("mlflow_tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI"):
        return None
    return (Path(ctx.local_dir).resolve() / "mlflow-artifacts").as_uri()


class MlflowSink:
    name = "mlflow"

    def __init__(self, ctx: SinkContext):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri(ctx))
        exp = self.client.get_experiment_by_name(ctx.project)
        if exp is not None:
            exp_id = exp.experiment_id
        else:
            exp_id = self.client.create_experiment(ctx.project, artifact_location=artifact_location(ctx))
        found = self.client.search_runs([exp_id], filter_string=f"tags.`{RUN_TAG}` = '{ctx.run_uri}'", max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            run = self.client.create_run(exp_id, run_name=ctx.run_id, tags={RUN_TAG: ctx.run_uri})
            self.run_id = run.info.run_id
            self._log_params(ctx.hparams)
        self._cursor = Cursor(
            int(self._last_value(TRAIN_CURSOR_KEY, 0)),
            int(self._last_value(STAGE_CURSOR_KEY, -1)),
        )
        self._closed = False

    def _log_params(self, hparams: dict) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:6000]) for k, v in sorted(flatten(hparams).items())]
        for i in range(0, len(params), 100):  # log_batch takes at most 100 params per call
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def _last_value(self, key: str, default: float) -> float:
        history = self.client.get_metric_history(self.run_id, key)
        return max((m.value for m in history), default=default)

    def cursor(self) -> Cursor:
        return self._cursor

    def log(self, events: list[Event]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch: list[Metric] = []
        for ev in events:  # whole events per batch: a kill between batches never leaves half an event
            metrics = [Metric(_key(k), v, now, ev.step) for k, v in ev.values.items()]
            if batch and len(batch) + len(metrics) > _BATCH:
                self.client.log_batch(self.run_id, metrics=batch)
                batch = []
            batch.extend(metrics)
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)
        for ev in events:
            if ev.table is not None:
                columns, rows = ev.table
                self.client.log_dict(self.run_id, {"columns": columns, "data": rows}, f"rollouts/stage_{ev.stage}.json")
            if ev.kind == "train":
                self._cursor = Cursor(ev.step, self._cursor.stage)
            else:
                self._cursor = Cursor(self._cursor.train_update, ev.stage)

    def close(self) -> None:
        if not self._closed:
            self.client.set_terminated(self.run_id)
            self._closed = True


def _key(name: str) -> str:
    return name.replace("@", "_at_")  # MLflow metric names allow letters, digits, _ - . / and spaces


TRACKING_SINKS.register("mlflow")(
    SinkSpec(MlflowSink, module="mlflow", install="pip install 'mugrpo[tracking-mlflow]'")
)
