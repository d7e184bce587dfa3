"""TensorBoard sink: event files under ``{tracking dir}/tensorboard`` (``tensorboard --logdir`` that folder).

Cursor: the event files are read back (tensorboard's ``EventAccumulator``) for the last values of the cursor keys.
A writer reopened after a kill starts with ``purge_step`` = last held update + 1, so TensorBoard itself discards any
scalar a killed writer flushed past the cursor: one continuous curve, no step twice.
"""

from __future__ import annotations

import json
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


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in ``log_dir`` as ``{tag: [(step, value), ...]}``, purges applied (as TensorBoard shows)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0}, purge_orphaned_data=True)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, ctx: SinkContext):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(ctx.local_dir) / "tensorboard"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._cursor = self._read_cursor()
        fresh = self._cursor == Cursor()
        self.writer = SummaryWriter(str(self.log_dir), purge_step=None if fresh else self._cursor.train_update + 1)
        if fresh:
            self.writer.add_text("config", "```json\n" + json.dumps(ctx.hparams, indent=2) + "\n```", 0)
            self.writer.flush()

    def _read_cursor(self) -> Cursor:
        scalars = read_scalars(self.log_dir) if any(self.log_dir.iterdir()) else {}
        train = max((v for _, v in scalars.get(TRAIN_CURSOR_KEY, [])), default=0)
        stage = max((v for _, v in scalars.get(STAGE_CURSOR_KEY, [])), default=-1)
        return Cursor(int(train), int(stage))

    def cursor(self) -> Cursor:
        return self._cursor

    def log(self, events: list[Event]) -> None:
        for ev in events:
            for key, value in ev.values.items():
                self.writer.add_scalar(key, value, ev.step)
            if ev.table is not None:
                columns, rows = ev.table
                header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
                body = "\n".join("| " + " | ".join(_cell(v) for v in row) + " |" for row in rows)
                self.writer.add_text(f"rollouts/stage_{ev.stage}", header + body, ev.step)
        self.writer.flush()
        if events:
            last_train = max((e.step for e in events if e.kind == "train"), default=self._cursor.train_update)
            last_stage = max((e.stage for e in events if e.kind == "stage"), default=self._cursor.stage)
            self._cursor = Cursor(last_train, last_stage)

    def close(self) -> None:
        self.writer.close()


def _cell(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


TRACKING_SINKS.register("tensorboard")(
    SinkSpec(TensorBoardSink, module="tensorboard", install="pip install 'mugrpo[tracking-tensorboard]'")
)
