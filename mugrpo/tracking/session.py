"""The run flow's side of tracking: open the configured sinks, replay committed data into them, live.

Why the flow logs and not the jobs: jobs stay free of tracker packages and credentials (they may run in a vLLM
environment or a Kubernetes pod), a stage with data-parallel training or fan-out generation has many processes but
a tracker run wants one writer, and logging only what the store has committed makes resume exact: a killed job's
uncommitted updates are never shown, so nothing shown is ever taken back or repeated. Live progress comes from a
poller thread that syncs every ``tracking.poll_s`` seconds while the flow waits on its jobs: a 1,000-update stage
appears in the tracker checkpoint by checkpoint (``train.checkpoint_every``), not at its end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mugrpo.storage.store import Store
from mugrpo.tracking.base import TRACKING_SINKS, SinkContext, TrackerSink
from mugrpo.tracking.events import pending_events

log = logging.getLogger(__name__)


def tracking_dir(cfg, store: Store) -> str:
    """Local folder for tracker files: ``tracking.dir``, else ``{run folder}/tracking`` for a local run root, else
    ``tracking/{run_id}`` under the working directory (TensorBoard and W&B write local files)."""
    if cfg.tracking.dir:
        return str(Path(cfg.tracking.dir).expanduser())
    local = store.local_path(cfg.run.id)
    return str(local / "tracking") if local is not None else str(Path("tracking") / cfg.run.id)


def open_sinks(cfg, store: Store) -> list[TrackerSink]:
    """Open every sink of ``cfg.tracking.sinks`` for this run (creating or resuming its tracker run)."""
    hparams = cfg.to_json_dict()
    hparams.pop("tracking", None)
    ctx = SinkContext(
        run_id=cfg.run.id,
        run_uri=store.uri(cfg.run.id),
        local_dir=tracking_dir(cfg, store),
        project=cfg.tracking.project,
        hparams=hparams,
        options=cfg.tracking.model_dump(),
    )
    return [TRACKING_SINKS[name].factory(ctx) for name in cfg.tracking.sinks]


class TrackingSession:
    """Sinks plus a poller thread. Use as a context manager around the run flow's work::

        with TrackingSession(cfg, store):
            ...  # stages; every poll_s seconds and at exit, newly committed data is logged

    A failing tracker never fails the run: its error is logged and the sink is dropped for this session.
    ``excluding``: the run's excluding rollout columns (:func:`mugrpo.algorithms.excluding_columns`), whose rows the
    rollout samples leave out.
    """

    def __init__(self, cfg, store: Store, excluding: Sequence[str] = ()):
        self.cfg, self.store, self.excluding = cfg, store, tuple(excluding)
        self.sinks: list[TrackerSink] = open_sinks(cfg, store) if cfg.tracking.sinks else []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sync(self) -> int:
        """Log every committed event each sink does not hold yet; returns how many events were logged in all."""
        logged = 0
        with self._lock:
            for sink in list(self.sinks):
                try:
                    events = list(
                        pending_events(
                            self.store,
                            self.cfg.run.id,
                            self.cfg.run.num_stages,
                            sink.cursor(),
                            self.cfg.tracking.rollout_samples,
                            self.excluding,
                        )
                    )
                    if events:
                        sink.log(events)
                    logged += len(events)
                except Exception as e:  # noqa: BLE001 - tracking is best effort; the store keeps everything
                    log.warning("tracking sink %s failed and is dropped for this session: %s", sink.name, e)
                    self.sinks.remove(sink)
        return logged

    def _poll(self) -> None:
        while not self._stop.wait(self.cfg.tracking.poll_s):
            self.sync()

    def __enter__(self) -> TrackingSession:
        if self.sinks:
            self.sync()
            self._thread = threading.Thread(target=self._poll, name="mugrpo-tracking", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.sinks:
            self.sync()
        for sink in self.sinks:
            sink.close()
