"""Job output that reads well in a terminal and in a log: the jobs' console and their progress bars.

In a terminal, a rich progress bar. Anywhere else (a job's output piped into Prefect's logs, a Kubernetes pod log, a
file) a bar would be redrawn as hundreds of frames, so :class:`PlainProgress` prints a few plain lines instead: at
the start, each time another ``every_pct`` percent is done, and at the end. :func:`quiet_library_bars` does the
same for the libraries' own tqdm bars ("Loading weights", "Writing model shards"): off when not in a terminal.
"""

from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

#: The console every job prints its log lines to (stderr; lines are not cut at 80 columns when piped).
console = Console(stderr=True, soft_wrap=True)


def quiet_library_bars(stream=None) -> bool:
    """Turn off tqdm bars of transformers, huggingface_hub and tqdm itself unless ``stream`` (default stderr) is a
    terminal. Returns True if they were turned off. Call it at a job's start, before loading models."""
    stream = stream or sys.stderr
    if stream.isatty():
        return False
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # tqdm >= 4.66 reads TQDM_* defaults from the environment
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return True


class PlainProgress:
    """The part of :class:`rich.progress.Progress` the jobs use, as plain log lines (one task per instance).

    Args:
        title: what is counted, e.g. ``"train stage 0"``.
        unit: the counted things, e.g. ``"updates"``.
        fields: a format string over ``task.fields`` (rich's syntax), e.g. ``"loss {task.fields[loss]:+.4f}"``.
        console: where lines go.
        every_pct: print a line each time this many more percent are done (and at start and end).
    """

    def __init__(self, title: str, unit: str, fields: str, console: Console, every_pct: float = 10.0):
        self.title, self.unit, self.fields, self.console, self.every_pct = title, unit, fields, console, every_pct
        self.total, self.completed, self.values = 0.0, 0.0, {}
        self._t0 = time.monotonic()
        self._last_pct = -1.0

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None and self._last_pct < 100:
            self._line()

    def add_task(self, description: str, total: float, completed: float = 0, **fields: Any) -> int:
        self.total, self.completed, self.values = float(total), float(completed), dict(fields)
        self._line()
        return 0

    def update(self, task: int, *, completed: float | None = None, advance: float | None = None, **fields) -> None:
        if completed is not None:
            self.completed = float(completed)
        if advance is not None:
            self.completed += float(advance)
        self.values.update(fields)
        pct = self._pct()
        if pct >= 100 or pct >= self._last_pct + self.every_pct:
            self._line()

    def _pct(self) -> float:
        return 100.0 * self.completed / self.total if self.total else 100.0

    def _line(self) -> None:
        self._last_pct = self._pct()
        extra = self.fields.format(task=SimpleNamespace(fields=self.values)) if self.fields else ""
        elapsed = time.monotonic() - self._t0
        self.console.print(
            f"{self.title}: {self.completed:g}/{self.total:g} {self.unit} ({self._last_pct:.0f}%)  {extra}  "
            f"{elapsed:.0f}s",
            markup=False,
            highlight=False,
        )


def job_progress(
    title: str, unit: str, fields: str, console: Console, *, disable: bool = False
) -> Progress | PlainProgress:
    """A rich bar when ``console`` is a terminal, else :class:`PlainProgress` (same ``add_task``/``update`` calls).

    ``disable`` (e.g. on non-main data-parallel ranks) shows nothing either way.
    """
    if console.is_terminal or disable:
        return Progress(
            TextColumn(f"[bold]{title}[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(f"{unit}  {fields}"),
            TimeElapsedColumn(),
            console=console,
            disable=disable,
        )
    return PlainProgress(title, unit, fields, console)
