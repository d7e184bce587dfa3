"""Experiment tracking: committed run data replayed into TensorBoard, Weights & Biases or MLflow.

``tracking.sinks`` names sinks from :data:`TRACKING_SINKS`; the run flow opens a
:class:`mugrpo.tracking.session.TrackingSession`. Each sink module imports its tracker package only when a sink is
opened, so importing this package (as config validation does) stays cheap.
"""

from mugrpo.tracking import mlflow_sink, tensorboard, wandb_sink  # noqa: F401  (register the sinks)
from mugrpo.tracking.base import TRACKING_SINKS, Cursor, Event, TrackerSink

__all__ = ["TRACKING_SINKS", "Cursor", "Event", "TrackerSink"]
