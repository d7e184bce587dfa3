"""Weights & Biases sink: one W&B run per mugrpo run, resumed across kills.

- Run id: the run id plus a hash of the run's URL (``wandb.init(id=..., resume="allow")``), so a resumed run continues
  the same W&B run and two runs with the same id under different roots never share one.
- Axis: every metric is plotted against ``train/update`` (``define_metric(step_metric=...)``), W&B's own step just
  counts log calls; stage summaries carry ``stage/index``.
- Cursor: online, the resumed run's summary holds the last values of the cursor keys. Offline
  (``tracking.wandb_mode: offline`` or ``WANDB_MODE=offline``) nothing is on a server, so the earlier offline runs of
  the same id under the tracking folder are read back (:func:`read_offline_history`); ``wandb sync`` of those folders
  later shows one continuous run.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import struct
from pathlib import Path

from mugrpo.tracking.base import (
    STAGE_CURSOR_KEY,
    TRACKING_SINKS,
    TRAIN_CURSOR_KEY,
    Cursor,
    Event,
    SinkContext,
    SinkSpec,
)

_BLOCK = 32 * 1024  # W&B's transaction log uses LevelDB's log format: 32 KiB blocks of checksummed records
_HEADER = 7  # ":W&B" + magic 0xBEE1 + version byte


def wandb_run_id(run_id: str, run_uri: str) -> str:
    """A W&B run id (<= 64 chars of [A-Za-z0-9_-]) derived from our run id and the run's URL."""
    digest = hashlib.sha256(run_uri.encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '-', run_id)[:55]}-{digest}"


def _records(path: str):
    """The raw records of a W&B ``.wandb`` transaction log (LevelDB log format after a 7-byte header)."""
    data = Path(path).read_bytes()
    pos, pending = _HEADER, b""
    while pos + 7 <= len(data):
        block_left = _BLOCK - (pos % _BLOCK)
        if block_left < 7:  # trailer padding of a block
            pos += block_left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        if kind == 1:  # FULL
            yield chunk
        elif kind == 2:  # FIRST
            pending = chunk
        elif kind == 3:  # MIDDLE
            pending += chunk
        elif kind == 4:  # LAST
            yield pending + chunk
            pending = b""


def read_offline_history(wandb_dir: str | Path, run_id: str) -> list[dict]:
    """Every history row logged by the offline runs of W&B run ``run_id`` under ``wandb_dir`` (oldest run first)."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for path in sorted(glob.glob(os.path.join(str(wandb_dir), "wandb", f"offline-run-*-{run_id}", "*.wandb"))):
        for raw in _records(path):
            rec = pb.Record()
            try:
                rec.ParseFromString(raw)
            except Exception:  # noqa: BLE001 - a torn last record of a killed writer
                continue
            if rec.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return rows


class WandbSink:
    name = "wandb"

    def __init__(self, ctx: SinkContext):
        import wandb

        mode = ctx.options.get("wandb_mode") or os.environ.get("WANDB_MODE") or "online"
        self.dir = Path(ctx.local_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run_id = wandb_run_id(ctx.run_id, ctx.run_uri)
        offline_cursor = self._offline_cursor() if mode == "offline" else None
        self.run = wandb.init(
            project=ctx.project,
            entity=ctx.options.get("wandb_entity"),
            id=self.run_id,
            name=ctx.run_id,
            resume="allow",
            dir=str(self.dir),
            mode=mode,
            config=ctx.hparams,
            tags=["mugrpo"],
            settings=wandb.Settings(console="off", silent=True),
        )
        self.run.define_metric(TRAIN_CURSOR_KEY)
        for prefix in ("train/*", "stage/*", "eval/*"):
            self.run.define_metric(prefix, step_metric=TRAIN_CURSOR_KEY)
        if offline_cursor is not None:
            self._cursor = offline_cursor
        else:
            summary = self.run.summary
            self._cursor = Cursor(int(summary.get(TRAIN_CURSOR_KEY, 0)), int(summary.get(STAGE_CURSOR_KEY, -1)))

    def _offline_cursor(self) -> Cursor:
        rows = read_offline_history(self.dir, self.run_id)
        train = max((r[TRAIN_CURSOR_KEY] for r in rows if TRAIN_CURSOR_KEY in r and "train/loss" in r), default=0)
        stage = max((r[STAGE_CURSOR_KEY] for r in rows if STAGE_CURSOR_KEY in r), default=-1)
        return Cursor(int(train), int(stage))

    def cursor(self) -> Cursor:
        return self._cursor

    def log(self, events: list[Event]) -> None:
        import wandb

        for ev in events:
            row = dict(ev.values)
            row.setdefault(TRAIN_CURSOR_KEY, float(ev.step))  # the x-axis of stage summaries
            if ev.table is not None:
                columns, rows = ev.table
                row[f"rollouts/stage_{ev.stage}"] = wandb.Table(columns=columns, data=rows)
            self.run.log(row)
            if ev.kind == "train":
                self._cursor = Cursor(ev.step, self._cursor.stage)
            else:
                self._cursor = Cursor(self._cursor.train_update, ev.stage)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


TRACKING_SINKS.register("wandb")(SinkSpec(WandbSink, module="wandb", install="pip install 'mugrpo[tracking-wandb]'"))
