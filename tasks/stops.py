"""Stops that stop: Ctrl-C or SIGTERM (to the CLI's process group or to its pid) ends ``mugrpo run`` within
``orchestration.stop_grace_s``, with nothing left behind.

The CLI process owns one :class:`StopController` for a run:

- **First signal** (SIGINT or SIGTERM): the launcher starts no new job
  (:attr:`tasks.launchers.processes.ProcessTable.stopping`: no retry, no next job), every job process group of this
  process (running or pre-started) gets SIGTERM, and the flow gets ``KeyboardInterrupt`` in the main thread, where
  it unwinds from wherever it is (every commit is a temporary file renamed into place, so an interrupted write
  leaves only a temporary file, which resume ignores).
  The CLI then calls :meth:`StopController.finish`: job groups that are still there are SIGKILLed, the fork
  servers stopped, the cleanups run (the run lease released, fenced by its token: a lease someone else took over
  is left alone; the temporary Prefect server's session stopped), the resume command printed, and the process
  exits with 128 + the signal's number (130 for SIGINT, 143 for SIGTERM).
- **A watchdog** does the same from its own thread once ``grace_s - reserve_s`` passed, whatever the main thread
  is doing (Prefect's client retrying, its exit-time event drain, a job that ignores SIGTERM), and a hard
  ``os._exit`` at ``grace_s`` bounds even a cleanup that hangs (storage unreachable).
- **A second signal** finishes at once (jobs SIGKILLed, lease released, server stopped, same exit code).

Signals are counted two ways, so neither a replaced handler nor a replaced wakeup fd hides one: the Python handler
installed here, and the interpreter's signal wakeup fd read by a thread (Prefect's flow engine swaps in its own
SIGTERM handler while a flow runs; the C-level handler still writes the signal's number to the wakeup fd).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from tasks import forkserver
from tasks.launchers.processes import PROCESSES, signal_group

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code(signum: int) -> int:
    """The conventional exit status of a process stopped by ``signum``: 128 + its number (130 SIGINT, 143 SIGTERM)."""
    return 128 + int(signum)


def signal_jobs(sig: int) -> int:
    """Send ``sig`` to every job process group of this process (running or pre-started); returns how many."""
    return sum(signal_group(pgid, sig) for pgid in PROCESSES.groups())


def kill_jobs(wait_s: float) -> None:
    """SIGTERM every job group, wait up to ``wait_s`` for them to go, SIGKILL what is left; stop the pre-started
    jobs and the fork servers."""
    signal_jobs(signal.SIGTERM)
    deadline = time.monotonic() + max(wait_s, 0.0)
    while time.monotonic() < deadline and any(_group_alive(g) for g in PROCESSES.groups()):
        time.sleep(0.1)
    signal_jobs(signal.SIGKILL)
    with contextlib.suppress(Exception):
        PROCESSES.discard_prestarted(None)
    with contextlib.suppress(Exception):
        forkserver.close_servers()


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie waiting for its parent to reap it does not)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:  # no /proc: the group exists, count it as running
        return True
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class StopController:
    """The stop handling of one CLI process (module docstring). Install it in the main thread.

    Args:
        grace_s: seconds from the first signal to the exit, at most.
        say: prints a line for the user (stderr).
        resume_hint: returns the line printed at the stop (the exact command that continues the run).
        reserve_s: seconds of the grace kept for the cleanups after the jobs' SIGTERM wait.
    """

    def __init__(
        self,
        grace_s: float,
        say: Callable[[str], None],
        resume_hint: Callable[[], str] | None = None,
        *,
        reserve_s: float = 5.0,
    ) -> None:
        self.grace_s = grace_s
        self.reserve_s = min(reserve_s, grace_s / 2)
        self.say = say
        self.resume_hint = resume_hint
        self.signum: int | None = None
        self.first_at: float | None = None
        self._cleanups: list[tuple[str, Callable[[], None]]] = []
        self._counts = {"handler": 0, "wakeup": 0}
        self._lock = threading.RLock()  # a signal handler may run while the main thread holds it
        self._finishing = threading.Lock()
        self._previous: dict[int, object] = {}
        self._wakeup_write: int | None = None
        self._previous_wakeup = -1

    # ---------------------------------------------------------------------------------------------------- setup
    def install(self) -> StopController:
        """Handle SIGINT and SIGTERM from now on (main thread only)."""
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            self._previous_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:
            os.close(r)
            os.close(w)
            return self
        self._wakeup_write = w
        threading.Thread(target=self._watch_wakeup, args=(r,), name="stop-signals", daemon=True).start()
        return self

    def uninstall(self) -> None:
        """Give the signals back (the run ended without a stop): the previous handlers and wakeup fd."""
        for sig, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, previous)
        self._previous.clear()
        if self._wakeup_write is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(self._previous_wakeup)
            os.close(self._wakeup_write)  # the reader thread sees EOF and closes its end
            self._wakeup_write = None

    def add_cleanup(self, name: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` at a stop, after the jobs are gone (in the order added)."""
        self._cleanups.append((name, fn))

    @property
    def stopping(self) -> bool:
        return self.signum is not None

    @property
    def code(self) -> int:
        return exit_code(self.signum if self.signum is not None else signal.SIGINT)

    # -------------------------------------------------------------------------------------------------- signals
    def _handler(self, signum: int, frame: object) -> None:
        self._count("handler", signum)
        if self._counts["handler"] == 1:  # the flow unwinds from where it is (once: not inside its own cleanup)
            raise KeyboardInterrupt(signal.Signals(signum).name)

    def _watch_wakeup(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:
                os.close(fd)
                return
            for signum in data:
                if signum in STOP_SIGNALS:
                    self._count("wakeup", signum)

    def _count(self, source: str, signum: int) -> bool:
        """Count one delivery of ``signum`` seen by ``source``; True for the first stop signal. Acts on it."""
        with self._lock:
            before = max(self._counts.values())
            self._counts[source] += 1
            after = max(self._counts.values())
            if after == before:  # the other source saw this one already
                return False
            first = self.signum is None
            if first:
                self.signum, self.first_at = signum, time.monotonic()
        if first:
            self._begin()
        else:
            threading.Thread(target=self.finish, args=(0.0, "a second signal"), daemon=True).start()
        return first

    def _begin(self) -> None:
        PROCESSES.stopping.set()
        name = signal.Signals(self.signum).name
        self._print(
            f"{name}: stopping at a safe point (at most {self.grace_s:.0f} s, orchestration.stop_grace_s); "
            "committed work is kept. Press Ctrl-C again to stop at once."
        )
        signal_jobs(signal.SIGTERM)
        threading.Thread(target=self._watchdog, name="stop-watchdog", daemon=True).start()

    def _watchdog(self) -> None:
        assert self.first_at is not None
        soft = self.first_at + self.grace_s - self.reserve_s
        time.sleep(max(soft - time.monotonic(), 0.0))
        threading.Thread(target=self.finish, args=(0.0, "the grace passed"), daemon=True).start()
        hard = self.first_at + self.grace_s
        time.sleep(max(hard - time.monotonic(), 0.0))
        self._print(f"stop: cleanups did not end within {self.grace_s:.0f} s; exiting now")
        os._exit(self.code)

    # --------------------------------------------------------------------------------------------------- finish
    def finish(self, job_wait_s: float | None = None, why: str = "") -> None:
        """Kill the jobs (SIGTERM, then SIGKILL after ``job_wait_s``: by default what is left of the grace less the
        reserve), run the cleanups, print the resume command and exit with :attr:`code`. Never returns; a second
        call (another thread) waits for the first one's exit."""
        if self.signum is None:  # called without a signal (the main thread's KeyboardInterrupt came first)
            with self._lock:
                if self.signum is None:
                    self.signum, self.first_at = signal.SIGINT, time.monotonic()
                    PROCESSES.stopping.set()
        if not self._finishing.acquire(blocking=True, timeout=self.grace_s + 5):
            os._exit(self.code)
        assert self.first_at is not None
        if job_wait_s is None:
            job_wait_s = self.first_at + self.grace_s - self.reserve_s - time.monotonic()
        kill_jobs(job_wait_s)
        for _name, fn in self._cleanups:
            with contextlib.suppress(BaseException):
                fn()
        if self.resume_hint is not None:
            with contextlib.suppress(Exception):
                self._print(self.resume_hint())
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(self.code)

    def _print(self, line: str) -> None:
        with contextlib.suppress(Exception):
            self.say(line)
