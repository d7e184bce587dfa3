"""Stops that stop: Ctrl-C or SIGTERM (to the CLI's process group or to its pid) ends ``mugrpo run`` within
``orchestration.stop_grace_s``, with nothing left behind, and reads as a stop, not a crash.

The CLI process owns one :class:`StopController` for a run. The grace is split in two
(:mod:`mugrpo.common.preemption`): the jobs' share, :func:`~mugrpo.common.preemption.job_grace_s` (the seconds
from a job's SIGTERM to its SIGKILL, the same number the launchers tell the jobs in
:data:`~mugrpo.common.preemption.GRACE_ENV`, so a train job saves a checkpoint and exits 75 in it), and the CLI's
own cleanups, :func:`~mugrpo.common.preemption.cleanup_reserve_s`.

- **First signal** (SIGINT or SIGTERM): the launcher starts no new job
  (:attr:`tasks.launchers.processes.ProcessTable.stopping`: no retry, no next job), every job process group of this
  process (running or pre-started) gets SIGTERM, and the flow gets ``KeyboardInterrupt`` in the main thread
  (Prefect's ``TerminationSignal`` for a SIGTERM while a flow runs), where it unwinds from wherever it is (every
  commit is a temporary file renamed into place, so an interrupted write leaves only a temporary file, which resume
  ignores). The CLI then calls :meth:`StopController.finish`: it waits for the jobs until their share of the grace
  is over (counted from their SIGTERM, whichever thread calls it) and SIGKILLs the groups still there, stops the
  fork servers, runs the cleanups (the run lease released, fenced by its token: a lease someone else took over is
  left alone; the flow runs marked ``Cancelled`` in the Prefect API, :func:`cancel_flow_runs`; the temporary Prefect
  server's session stopped), prints the resume command and exits with 128 + the signal's number (130 for SIGINT,
  143 for SIGTERM).
- **A watchdog** does the same from its own thread once the jobs' share is over, whatever the main thread is doing
  (Prefect's client retrying, its exit-time event drain, a job that ignores SIGTERM), and a hard ``os._exit`` at
  ``grace_s`` bounds even a cleanup that hangs (storage unreachable).
- **A second signal** finishes at once (jobs SIGKILLed, lease released, server stopped, same exit code).

Signals are counted two ways, so neither a replaced handler nor a replaced wakeup fd hides one: the Python handler
installed here, and the interpreter's signal wakeup fd read by a thread (Prefect's flow engine swaps in its own
SIGTERM handler while a flow runs; the C-level handler still writes the signal's number to the wakeup fd).

Prefect re-sends a SIGTERM it took: its ``capture_sigterm`` (``prefect/utilities/engine``, Prefect 3.x), on the
way out of the outermost flow with its ``TerminationSignal``, puts the previous handler (ours) back and sends the
signal to this process again. That copy is no new signal: the handler recognises it (it arrives in Prefect's code
while the main thread handles a ``prefect.exceptions.TerminationSignal``, once per such exception) and does not
count it, and the wakeup thread waits
:data:`REDELIVERY_WAIT_S` before it acts on a signal only it saw as a second one, so the re-sent copy never cuts
the jobs' share short. Should a later Prefect re-send from elsewhere, the copy would again read as a second signal
(jobs SIGKILLed at once) and ``tests/unit/test_stop_prefect.py`` fails.

Prefect itself records a signal that unwinds a flow as a crash (``Crash detected! Execution was aborted by ...``,
state ``Crashed``, for the flow run, its subflow runs and the task run in flight). The stop overrides both: the CLI
keeps those lines off its console (:func:`mugrpo.cli.lifecycle.quiet_stop_crashes`) and :func:`cancel_flow_runs`
forces the flow runs of this process (noted by ``flows/run.py``, :func:`note_flow_run`), their subflow runs and
their unfinished task runs to ``Cancelled`` through Prefect's client, with the stop's message (which signal, the
resume command).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from mugrpo.common.preemption import cleanup_reserve_s
from tasks import forkserver
from tasks.launchers.processes import PROCESSES, signal_group

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: Seconds the wakeup thread waits before it acts on a second signal the Python handler has not seen: time for the
#: handler to recognise Prefect's re-sent copy of the first one (module docstring).
REDELIVERY_WAIT_S = 0.5
#: Seconds at most that :func:`cancel_flow_runs` spends on the Prefect API at a stop (it runs in the cleanups'
#: reserve; the server stop and the resume line come after it).
CANCEL_TIMEOUT_S = 3.0
#: Prefect flow runs of this process that a stop marks ``Cancelled`` (:func:`note_flow_run`).
FLOW_RUNS: list[str] = []


def exit_code(signum: int) -> int:
    """The conventional exit status of a process stopped by ``signum``: 128 + its number (130 SIGINT, 143 SIGTERM)."""
    return 128 + int(signum)


def signal_jobs(sig: int) -> int:
    """Send ``sig`` to every job process group of this process (running or pre-started); returns how many."""
    return sum(signal_group(pgid, sig) for pgid in PROCESSES.groups())


def kill_jobs(wait_s: float, at_once: threading.Event | None = None) -> None:
    """SIGTERM every job group, wait up to ``wait_s`` for them to go (less once ``at_once`` is set: a second
    signal), SIGKILL what is left; stop the pre-started jobs and the fork servers."""
    signal_jobs(signal.SIGTERM)
    deadline = time.monotonic() + max(wait_s, 0.0)
    while time.monotonic() < deadline and any(_group_alive(g) for g in PROCESSES.groups()):
        if at_once is not None and at_once.wait(0.1):
            break
        if at_once is None:
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


def _prefect_redelivery(signum: int, frame: object, counted: list[BaseException]) -> bool:
    """Whether a signal the handler sees now is Prefect's re-sent copy of a SIGTERM it took (module docstring): a
    SIGTERM that arrives in Prefect's own code while the main thread handles a
    ``prefect.exceptions.TerminationSignal`` not met before (``counted``: one copy per signal Prefect took; the
    same exception handled again later, in the CLI's own ``except``, is no copy). Called from the handler, in the
    main thread; never imports Prefect."""
    if signum != signal.SIGTERM:
        return False
    termination = getattr(sys.modules.get("prefect.exceptions"), "TerminationSignal", None)
    handling = sys.exc_info()[1]
    if termination is None or not isinstance(handling, termination) or any(e is handling for e in counted):
        return False
    code = getattr(frame, "f_code", None)
    if code is None or f"{os.sep}prefect{os.sep}" not in code.co_filename:
        return False
    counted.append(handling)
    return True


# ---------------------------------------------------------------------------------------------- Prefect flow runs
def note_flow_run(flow_run_id: object) -> None:
    """Note a Prefect flow run of this process (its id) for :func:`cancel_flow_runs` (``flows/run.py`` notes
    its own at its start; ``None``, outside a flow run, is ignored)."""
    if flow_run_id is not None and str(flow_run_id) not in FLOW_RUNS:
        FLOW_RUNS.append(str(flow_run_id))


#: State types a stop leaves alone: the run ended that way before the stop (a stage flow completed, a job failed).
_SETTLED = ("COMPLETED", "FAILED", "CANCELLED")


def _cancel(flow_run_ids: list[str], message: str) -> list[str]:
    """Force ``flow_run_ids``, their subflow runs (any depth) and their task runs to ``Cancelled`` with ``message``,
    unless they are :data:`_SETTLED`; the given flow runs first. Returns the ids of the flow runs cancelled."""
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterParentFlowRunId,
        FlowRunFilterState,
        FlowRunFilterStateType,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled

    settled = [StateType(t) for t in _SETTLED]
    unsettled = [t for t in StateType if t not in settled]
    open_runs = FlowRunFilterState(type=FlowRunFilterStateType(not_any_=settled))
    cancelled: list[str] = []
    with get_client(sync_client=True) as client:
        level = [UUID(i) for i in flow_run_ids]
        seen = set(level)
        while level:  # the given flow runs, then each level of their subflow runs
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=level), state=open_runs))
            for run in runs:
                client.set_flow_run_state(run.id, Cancelled(message=message), force=True)
                cancelled.append(str(run.id))
            children = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=level))
            )
            level = [run.id for run in children if run.id not in seen]
            seen.update(level)
        for task_run in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(seen))),
            task_run_filter=TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(any_=unsettled))),
        ):
            client.set_task_run_state(task_run.id, Cancelled(message=message), force=True)
    return cancelled


def cancel_flow_runs(message: str, timeout_s: float = CANCEL_TIMEOUT_S) -> list[str]:
    """Mark the flow runs of this process (:data:`FLOW_RUNS`), their subflow runs and their unfinished task runs
    ``Cancelled`` in the Prefect API with ``message``, forced over the ``Crashed`` state Prefect's engine gave them
    as the stop unwound them (``Completed``, ``Failed`` and ``Cancelled`` runs are left as they are). Public Prefect
    API only: the sync client's ``read_flow_runs`` / ``set_flow_run_state(..., force=True)`` /
    ``read_task_runs`` / ``set_task_run_state`` and :class:`prefect.states.Cancelled`. Nothing to do (Prefect not
    even imported) when no flow run was noted. Returns the ids of the flow runs cancelled.

    Raises:
        TimeoutError: the API did not answer within ``timeout_s`` (the calls go on in a daemon thread, which the
            stop's exit ends).
        Exception: what the Prefect client raised (the server unreachable).
    """
    ids = list(FLOW_RUNS)
    if not ids:
        return []
    result: dict[str, object] = {}

    def work() -> None:
        try:
            result["ok"] = _cancel(ids, message)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            result["error"] = e

    worker = threading.Thread(target=work, name="stop-cancel-flow-runs", daemon=True)
    worker.start()
    worker.join(max(timeout_s, 0.0))
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    if "ok" not in result:
        raise TimeoutError(f"the Prefect API did not answer within {timeout_s:.1f} s")
    return result["ok"]  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------- the controller
class StopController:
    """The stop handling of one CLI process (module docstring). Install it in the main thread.

    Args:
        grace_s: seconds from the first signal to the exit, at most (``orchestration.stop_grace_s``).
        say: prints a line for the user (stderr).
        resume_hint: returns the line printed at the stop (the exact command that continues the run).
        reserve_s: seconds of the grace kept for the cleanups after the jobs' share; default (None)
            :func:`~mugrpo.common.preemption.cleanup_reserve_s` of ``grace_s``, so the jobs get
            :func:`~mugrpo.common.preemption.job_grace_s` from their SIGTERM to their SIGKILL, the grace the
            launchers tell them. At most half the grace.
    """

    def __init__(
        self,
        grace_s: float,
        say: Callable[[str], None],
        resume_hint: Callable[[], str] | None = None,
        *,
        reserve_s: float | None = None,
    ) -> None:
        self.grace_s = grace_s
        self.reserve_s = cleanup_reserve_s(grace_s) if reserve_s is None else min(reserve_s, grace_s / 2)
        self.say = say
        self.resume_hint = resume_hint
        self.signum: int | None = None
        self.first_at: float | None = None
        #: When the jobs got their SIGTERM (the first signal): their SIGKILL comes :attr:`job_grace_s` after it.
        self.jobs_signalled_at: float | None = None
        self._hint_line: str | None = None
        self._cleanups: list[tuple[str, Callable[[], None]]] = []
        #: Deliveries seen by the Python handler (Prefect's re-sent copies apart), by the wakeup fd (all of
        #: them), and Prefect's re-sent copies the handler recognised.
        self._counts = {"handler": 0, "wakeup": 0, "redelivered": 0}
        self._acted = 0  # stop signals acted on: 1 after the first, 2 after a second one
        self._copies: list[BaseException] = []  # Prefect's TerminationSignals whose re-sent copy the handler saw
        #: The main thread unwinds already (the handler's KeyboardInterrupt, Prefect's TerminationSignal) or is in
        #: finish(): no (further) KeyboardInterrupt is raised into it.
        self._main_interrupted = False
        self._at_once = threading.Event()  # a second signal came: no more waiting for the jobs
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
        """Whether a stop began (a signal came, or :meth:`finish` was called)."""
        return self.signum is not None

    @property
    def code(self) -> int:
        """The exit status of the stop: 128 + the signal's number (130 when no signal came)."""
        return exit_code(self.signum if self.signum is not None else signal.SIGINT)

    @property
    def job_grace_s(self) -> float:
        """Seconds from the jobs' SIGTERM to their SIGKILL: the grace less the reserve (what the launchers tell the
        jobs, :func:`mugrpo.common.preemption.job_grace_s`)."""
        return self.grace_s - self.reserve_s

    def seconds_left(self) -> float:
        """Seconds left of the grace (to the hard exit); the whole grace before a stop began."""
        if self.first_at is None:
            return self.grace_s
        return self.first_at + self.grace_s - time.monotonic()

    def message(self) -> str:
        """What the stop says in one line, for the Prefect API (the flow runs' ``Cancelled`` state): the signal
        and the resume line, e.g. ``stopped by SIGTERM; committed work is kept. Continue with: mugrpo resume ...``."""
        name = signal.Signals(self.signum).name if self.signum is not None else "a stop"
        hint = self._hint()
        for prefix in ("stopped: ", "stopped "):
            hint = hint.removeprefix(prefix)
        return f"stopped by {name}; {hint}" if hint else f"stopped by {name}; committed work is kept"

    def _hint(self) -> str:
        """The resume line, computed once (it reads the storage)."""
        if self._hint_line is None:
            self._hint_line = ""
            if self.resume_hint is not None:
                with contextlib.suppress(Exception):
                    self._hint_line = self.resume_hint()
        return self._hint_line

    # -------------------------------------------------------------------------------------------------- signals
    def _handler(self, signum: int, frame: object) -> None:
        if _prefect_redelivery(signum, frame, self._copies):  # Prefect's copy of a SIGTERM it took: the main
            self._main_interrupted = True  # thread unwinds with Prefect's TerminationSignal already
            self._count("redelivered", signum)
            return
        self._count("handler", signum)
        if not self._main_interrupted:  # the flow unwinds from where it is (once: not inside its own cleanup)
            self._main_interrupted = True
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

    def _signals(self) -> int:
        """How many stop signals came: as many as either source saw, Prefect's re-sent copies apart (a copy means
        one came, should the main thread see it before the wakeup thread reads the first)."""
        c = self._counts
        return max(c["handler"], c["wakeup"] - c["redelivered"], min(c["redelivered"], 1))

    def _count(self, source: str, signum: int) -> bool:
        """Count one delivery of ``signum`` seen by ``source``; True for the first stop signal. Acts on it."""
        with self._lock:
            self._counts[source] += 1
            if self._signals() <= self._acted:  # the other source saw this one already (or a re-sent copy)
                return False
            if self._acted == 0:
                self._acted = 1
                self.signum, self.first_at = signum, time.monotonic()
                first = True
            elif source == "wakeup":  # maybe Prefect's copy, which the handler has not recognised yet: look again
                threading.Thread(target=self._second_if_confirmed, name="stop-second", daemon=True).start()
                return False
            else:
                self._acted = 2
                first = False
        if first:
            self._begin()
        else:
            self._second()
        return first

    def _second(self) -> None:
        """A second signal: finish at once (a finish already waiting for the jobs stops waiting)."""
        self._at_once.set()
        threading.Thread(target=self.finish, args=(0.0, "a second signal"), daemon=True).start()

    def _second_if_confirmed(self) -> None:
        """Finish at once if a second signal the wakeup thread saw is still one after :data:`REDELIVERY_WAIT_S`."""
        time.sleep(REDELIVERY_WAIT_S)
        with self._lock:
            if self._acted >= 2 or self._signals() < 2:
                return
            self._acted = 2
        self._second()

    def _begin(self) -> None:
        PROCESSES.stopping.set()
        name = signal.Signals(self.signum).name
        self._print(
            f"{name}: stopping at a safe point (at most {self.grace_s:.0f} s, orchestration.stop_grace_s; running "
            f"jobs get {self.job_grace_s:.0f} s to save their work); committed work is kept. Press Ctrl-C again to "
            "stop at once."
        )
        with self._lock:
            if self.jobs_signalled_at is None:
                self.jobs_signalled_at = time.monotonic()  # the jobs' share of the grace starts now
            PROCESSES.jobs_kill_at = self._jobs_deadline()  # a launcher following a job waits until then for it
        signal_jobs(signal.SIGTERM)
        threading.Thread(target=self._watchdog, name="stop-watchdog", daemon=True).start()

    def _jobs_deadline(self) -> float:
        """When the jobs' share of the grace ends (their SIGKILL): :attr:`job_grace_s` after their SIGTERM, and never
        later than the reserve before the hard exit allows (a SIGTERM sent late, by a slow handler)."""
        assert self.first_at is not None
        start = self.jobs_signalled_at if self.jobs_signalled_at is not None else time.monotonic()
        return min(start + self.job_grace_s, self.first_at + self.grace_s - self.reserve_s / 2)

    def _watchdog(self) -> None:
        assert self.first_at is not None
        time.sleep(max(self._jobs_deadline() - time.monotonic(), 0.0))
        threading.Thread(target=self.finish, args=(0.0, "the grace passed"), daemon=True).start()
        hard = self.first_at + self.grace_s
        time.sleep(max(hard - time.monotonic(), 0.0))
        self._print(f"stop: cleanups did not end within {self.grace_s:.0f} s; exiting now")
        os._exit(self.code)

    # --------------------------------------------------------------------------------------------------- finish
    def finish(self, job_wait_s: float | None = None, why: str = "") -> None:
        """Kill the jobs (SIGTERM, then SIGKILL after ``job_wait_s``: by default what is left of their share of the
        grace, :attr:`job_grace_s` from their SIGTERM, whichever thread calls this and when), run the cleanups,
        print the resume command and exit with :attr:`code`. Never returns; a second call (another thread) waits for
        the first one's exit."""
        if threading.current_thread() is threading.main_thread():
            self._main_interrupted = True  # a later signal no longer raises KeyboardInterrupt here
        start_watchdog = False
        if self.signum is None:  # called without a signal (the main thread's KeyboardInterrupt came first)
            with self._lock:
                if self.signum is None:
                    self.signum, self.first_at = signal.SIGINT, time.monotonic()
                    self.jobs_signalled_at = self.first_at  # kill_jobs sends their SIGTERM below
                    self._acted = max(self._acted, 1)
                    PROCESSES.stopping.set()
                    start_watchdog = True
        if start_watchdog:  # the hard exit at the grace bounds this stop too
            threading.Thread(target=self._watchdog, name="stop-watchdog", daemon=True).start()
        if not self._finishing.acquire(blocking=True, timeout=self.grace_s + 5):
            os._exit(self.code)
        if job_wait_s is None:
            job_wait_s = self._jobs_deadline() - time.monotonic()
        kill_jobs(job_wait_s, self._at_once)  # SIGTERM again: a job started as the signal came gets it too
        self._hint()  # once, before the lease goes: the cleanups' messages and the last line use it
        for _name, fn in self._cleanups:
            with contextlib.suppress(BaseException):
                fn()
        if self.resume_hint is not None and self._hint():
            self._print(self._hint())
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(self.code)

    def _print(self, line: str) -> None:
        with contextlib.suppress(Exception):
            self.say(line)
