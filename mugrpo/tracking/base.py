"""The tracker-sink contract: what every sink (TensorBoard, W&B, MLflow) receives, and how it says what it holds.

A sink is opened once per run by the run flow's :class:`mugrpo.tracking.session.TrackingSession`, which replays
committed metrics into it (:mod:`mugrpo.tracking.events`). Exactly-once logging across kills and resumes rests on one
rule: **the tracker itself is the cursor**. On open, a sink reads back from its own storage what it already holds
(:class:`Cursor`); the session then logs only events after it. A crash between logging and any bookkeeping of ours
therefore cannot duplicate or drop a step.

One x-axis everywhere: the global optimizer update (``train_steps.update``), as verl and TRL use the trainer step.
Stage-level metrics are logged at the update count at the end of the stage, with ``stage/index`` as a value.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Protocol

from mugrpo.common.registry import Registry

#: The key whose last value marks the last update a sink holds, and the one that marks the last stage.
TRAIN_CURSOR_KEY = "train/update"
STAGE_CURSOR_KEY = "stage/index"


@dataclass(frozen=True)
class Cursor:
    """What a tracker run already holds: its last train update (0 = none) and last stage event (-1 = none)."""

    train_update: int = 0
    stage: int = -1


@dataclass
class Event:
    """One thing to log: an update's train metrics, or a stage's summary (timings, eval, rollout sample).

    Attributes:
        kind: ``"train"`` or ``"stage"``.
        step: global optimizer update (the x-axis).
        values: metric name -> float, names prefixed with their namespace (``train/``, ``stage/``, ``eval/``).
            The cursor key (:data:`TRAIN_CURSOR_KEY` or :data:`STAGE_CURSOR_KEY`) is present and inserted last.
        table: for stage events, a sample of the stage's rollouts as (columns, rows), or None.
    """

    kind: str
    step: int
    values: dict[str, float]
    table: tuple[list[str], list[list[Any]]] | None = None
    stage: int = field(default=-1)


class TrackerSink(Protocol):
    """A tracker run. Implementations live in this package, one module each, registered in :data:`TRACKING_SINKS`."""

    name: str

    def cursor(self) -> Cursor:
        """What this tracker run already holds (read back from the tracker's own storage)."""

    def log(self, events: list[Event]) -> None:
        """Log ``events`` in order, then make them durable (flush / one batch)."""

    def close(self) -> None:
        """Flush and release the tracker run (idempotent)."""


@dataclass(frozen=True)
class SinkContext:
    """What a sink factory gets: who the run is and where tracker files go.

    Attributes:
        run_id: our run id (W&B run name, MLflow run name).
        run_uri: the run's full URL, unique across roots (hashed into W&B's run id, an MLflow tag).
        local_dir: a local folder for tracker files (TensorBoard events, W&B offline runs, MLflow's default db).
        project: W&B project / MLflow experiment name.
        hparams: the resolved config without credentials (flattened by the sinks that need it).
        options: the ``tracking`` config section as a dict (sink-specific knobs).
    """

    run_id: str
    run_uri: str
    local_dir: str
    project: str
    hparams: dict[str, Any]
    options: dict[str, Any]


@dataclass(frozen=True)
class SinkSpec:
    """A registered sink: its factory, the module it needs and how to install it."""

    factory: Any  # Callable[[SinkContext], TrackerSink]
    module: str
    install: str

    def check_installed(self, name: str) -> None:
        """Raises ValueError with the install command when the sink's package is missing (called at config load)."""
        if importlib.util.find_spec(self.module) is None:
            raise ValueError(f"tracking sink {name!r} needs the {self.module!r} package: {self.install}")


TRACKING_SINKS: Registry[SinkSpec] = Registry("tracking sink")


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and None become strings), for trackers with flat params."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out
