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
    # huggingface_hub reads the variable at its import, and transformers its bars' switch from huggingface_hub at
    # its own: only a library already imported needs telling (importing transformers here would cost a process
    # that never loads a model, such as the CLI's, ~0.3 s of CPU)
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers.utils.logging" in sys.modules:
        sys.modules["transformers.utils.logging"].disable_progress_bar()
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


#: A non-streaming engine reports a shard's tokens when the shard ends: its silence may last a shard's sampling time.
NON_STREAMING_STALL_FACTOR = 5


class TokenProgress:
    """Live progress of a sampling job counted in generated tokens, for a terminal and a log alike.

    A daemon thread prints one line as soon as it starts and then every ``interval_s`` seconds, whatever the job is
    doing: while the policy loads (``phase``), then while it samples, with tokens, tokens/s, prompts done and an ETA.
    Tokens arrive from the engine as they are sampled (:meth:`add_tokens`, called per decoding step by engines that
    can, e.g. :class:`mugrpo.engines.transformers_engine.TransformersEngine`), or per finished shard from the others.
    When no token arrives for ``stall_s`` seconds while sampling, one warning names the job, the shard and the likely
    cause (``cause()``), repeated once per further ``stall_s`` of silence. An engine that reports tokens only per
    finished shard (``streaming`` False: vLLM in its own process) is given :data:`NON_STREAMING_STALL_FACTOR` times as
    long.

    ETA: the remaining prompts times the tokens per finished prompt, over the current rate; before any shard
    finished, the remaining token budget (``prompts x n x max_new_tokens``, an upper bound) over the rate.
    """

    def __init__(
        self,
        title: str,
        console: Console,
        *,
        interval_s: float = 10.0,
        stall_s: float = 60.0,
        cause=None,
        clock=time.monotonic,
    ) -> None:
        import threading

        self.title, self.console, self.interval_s, self.stall_s = title, console, interval_s, stall_s
        self.cause = cause or (lambda: "unknown")
        self.clock = clock
        self.phase = "starting"
        self.tokens = 0
        self.prompts_done = self.prompts_total = 0
        self.token_budget = 0
        self.shard: int | None = None
        self.streaming = True
        self._tokens_done_shards = 0
        self._t0 = clock()
        self._t_sampling: float | None = None
        self._last_token: float | None = None
        self._warned_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the job's side ------------------------------------------------------------------------------------------
    def start(self, phase: str = "starting") -> TokenProgress:
        """Print the first line now and start the ticker thread (idempotent)."""
        import threading

        self.phase = phase
        if self._thread is None:
            self._print(self.line())
            self._thread = threading.Thread(target=self._run, name="token-progress", daemon=True)
            self._thread.start()
        return self

    def set_phase(self, phase: str) -> None:
        self.phase = phase

    def begin_sampling(self, prompts_total: int, token_budget: int, prompts_done: int = 0) -> None:
        """Sampling starts: ``prompts_total`` prompts (``prompts_done`` of them already committed), at most
        ``token_budget`` new tokens for the rest."""
        with self._lock:
            self.phase = "sampling"
            self.prompts_total, self.prompts_done, self.token_budget = prompts_total, prompts_done, token_budget
            self._t_sampling = self._last_token = self.clock()

    def begin_shard(self, shard: int) -> None:
        self.shard = shard

    def add_tokens(self, n: int) -> None:
        """``n`` tokens were just sampled (thread-safe)."""
        with self._lock:
            self.tokens += n
            self._last_token = self.clock()
            self._warned_at = None

    def shard_done(self, prompts: int, tokens: int | None = None) -> None:
        """A shard of ``prompts`` prompts finished; ``tokens``: its token count when the engine did not stream them."""
        with self._lock:
            if tokens is not None:
                self.tokens += tokens
                self._last_token = self.clock()
                self._warned_at = None
            self.prompts_done += prompts
            self._tokens_done_shards = self.tokens

    def close(self) -> None:
        """Stop the ticker and print the final line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
            self._print(self.line())

    def __enter__(self) -> TokenProgress:
        return self.start(self.phase)

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- what is printed -----------------------------------------------------------------------------------------
    def line(self) -> str:
        """The progress line for now."""
        now = self.clock()
        elapsed = now - self._t0
        if self._t_sampling is None:
            return f"{self.title}: {self.phase}  {elapsed:.0f}s"
        with self._lock:
            tokens, done, total = self.tokens, self.prompts_done, self.prompts_total
        sampling_s = max(now - self._t_sampling, 1e-9)
        rate = tokens / sampling_s
        return (
            f"{self.title}: {tokens} tokens ({rate:.1f} tok/s), {done}/{total} prompts, "
            f"ETA {self._eta(rate)}  {elapsed:.0f}s"
        )

    def _eta(self, rate: float) -> str:
        if rate <= 0:
            return "?"
        if self.prompts_done > 0:
            per_prompt = self._tokens_done_shards / self.prompts_done
            remaining = max(per_prompt * self.prompts_total - self.tokens, 0.0)
            return f"{remaining / rate:.0f}s"
        return f"<{max(self.token_budget - self.tokens, 0) / rate:.0f}s"

    def stall_warning(self) -> str | None:
        """The warning to print now, if sampling has produced no token for ``stall_s`` seconds (once per stall_s)."""
        if self._last_token is None or self.phase != "sampling":
            return None
        now = self.clock()
        silent = now - self._last_token
        limit = self.stall_s if self.streaming else self.stall_s * NON_STREAMING_STALL_FACTOR
        if silent < limit or (self._warned_at is not None and now - self._warned_at < limit):
            return None
        self._warned_at = now
        shard = f"shard {self.shard}" if self.shard is not None else "its first shard"
        return f"WARNING: {self.title}: no token for {silent:.0f}s in {shard}; likely cause: {self.cause()}"

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._print(self.line())
            warning = self.stall_warning()
            if warning:
                self._print(warning)

    def _print(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)


def stall_cause(dtype: str | None = None) -> str:
    """The likely cause of a sampling stall on this machine: bf16 emulated on a CPU without bf16 units, an
    oversubscribed CPU, or (neither) a stuck engine."""
    if dtype in ("bfloat16", "bf16"):
        from mugrpo.common.hardware import bf16_verdict

        verdict = bf16_verdict()
        if not verdict.native:
            return f"bf16 is emulated on this machine ({verdict.reason}); a run with precision auto would use fp32"
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load > 1.5 * cores:
        return f"the CPU is oversubscribed (load average {load:.1f} on {cores} cores)"
    return f"the engine may be stuck (load average {load:.1f} on {cores} cores); `py-spy dump --pid {os.getpid()}`"
