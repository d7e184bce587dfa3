"""Launchers: start one job (a process with a CLI entry point), stream its output lines, wait for it, report.

A job is ``python -m mugrpo.jobs.{kind} SPEC_URL``: it imports no Prefect and talks only through files in object
storage (docs/design.md). A launcher decides *where* the process runs:

- ``subprocess``: a child process of the flow, in its own session (process group); on timeout, cancellation or
  death of the flow process the whole group is killed, so a resumed run never races a stale job.
- ``kubernetes``: a Kubernetes Job in the job kind's image (GPU limits, node selector, tolerations, S3 credentials
  from a Secret, HF-cache volume), created or re-attached to and watched on the Kubernetes API
  (:mod:`tasks.kubernetes`, :mod:`tasks.k8s_watch`); a Job outlives a dead flow and is re-attached on resume.

Launchers are looked up by name in :data:`LAUNCHERS` (``@register_launcher("name")``). :func:`launch_job` is the
one entry point: it runs a :class:`JobRequest` on a launcher and turns the outcome into a :class:`JobResult` or a
:class:`JobError` carrying the job's last output lines. Nothing here imports Prefect at module import.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import ctypes
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, ClassVar

from mugrpo.registry import Registry
from tasks import forkserver

#: Output lines of a job kept for results and error messages.
TAIL_LINES = 20
#: Characters kept of one output line (a progress bar without newlines must not flood the logs).
MAX_LINE_CHARS = 4000
#: Exit codes that mean "the command line or the spec is wrong": a retry cannot help (argparse/typer usage errors and
#: ``mugrpo.jobs.common.load_spec`` exit with 2).
NON_RETRYABLE_EXIT_CODES = frozenset({2})

_KIND_RE = re.compile(r"[a-z][a-z0-9_]*")
_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

LineSink = Callable[[str], None]


# ----------------------------------------------------------------------------------------------------------- errors
class JobError(RuntimeError):
    """A job did not complete. ``last_lines`` holds its last output lines (oldest first)."""

    #: Whether a retry of the same job can succeed (Prefect's retry condition reads it).
    transient = True

    def __init__(self, message: str, *, kind: str, last_lines: tuple[str, ...] = ()):
        self.kind = kind
        self.last_lines = tuple(last_lines)
        if self.last_lines:
            message += f"\n--- last {len(self.last_lines)} lines of the {kind} job ---\n" + "\n".join(self.last_lines)
        super().__init__(message)


class JobFailedError(JobError):
    """The job exited with a non-zero code (``exit_code``; negative = killed by that signal, None = unknown)."""

    def __init__(self, message: str, *, kind: str, exit_code: int | None, last_lines: tuple[str, ...] = ()):
        self.exit_code = exit_code
        self.transient = exit_code not in NON_RETRYABLE_EXIT_CODES
        super().__init__(message, kind=kind, last_lines=last_lines)


class JobTimeoutError(JobError):
    """The job ran longer than its timeout and was killed (its whole process group, or its Kubernetes Job)."""

    def __init__(self, message: str, *, kind: str, timeout_s: float, last_lines: tuple[str, ...] = ()):
        self.timeout_s = timeout_s
        super().__init__(message, kind=kind, last_lines=last_lines)


class JobLaunchError(JobError):
    """The launcher could not start or watch the job (e.g. the Kubernetes API failed); usually transient."""


# ------------------------------------------------------------------------------------------------ request / result
@dataclass(frozen=True)
class JobRequest:
    """One job to run.

    Attributes:
        kind: job kind (``generate``, ``train``, ``eval``...): the module ``mugrpo.jobs.{kind}`` runs.
        spec_url: path or fsspec URL of the job's JSON spec, passed as the only argument.
        timeout_s: wall-clock limit in seconds; past it the job is killed and :class:`JobTimeoutError` raised.
        python: interpreter of the job in its environment (e.g. a vLLM virtualenv); None = this interpreter
            (subprocess) or the image's ``python`` (Kubernetes).
        env: extra environment variables (strings), on top of what the launcher passes. Never put credentials here:
            they come from the environment (subprocess) or a Secret (Kubernetes).
        module: module to run instead of ``mugrpo.jobs.{kind}`` (stand-in jobs in tests, custom jobs).
        labels: small key/values identifying the job (run id, stage); Kubernetes labels on the Job.
        attempt: 1-based attempt number of this job (the launcher task's run count); part of a Kubernetes Job's
            name, so a resumed attempt finds the Job of an earlier one.

    Raises:
        ValueError: a malformed kind, module, timeout or environment entry (the message names it).
    """

    kind: str
    spec_url: str
    timeout_s: float
    python: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    module: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    attempt: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.attempt, int) or self.attempt < 1:
            raise ValueError(f"attempt of the {self.kind} job must be an int >= 1, got {self.attempt!r}")
        if not _KIND_RE.fullmatch(self.kind):
            raise ValueError(f"job kind {self.kind!r} must be a lowercase identifier such as 'generate'")
        if self.module is not None and not _MODULE_RE.fullmatch(self.module):
            raise ValueError(f"job module {self.module!r} is not a dotted Python module name")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        for key, value in self.env.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"env entry {key!r}={value!r} of the {self.kind} job: keys and values must be str")

    @property
    def module_name(self) -> str:
        """The module run with ``python -m``."""
        return self.module or f"mugrpo.jobs.{self.kind}"

    def command(self, default_python: str) -> list[str]:
        """``[python, "-m", module, spec_url]`` with ``python`` falling back to ``default_python``."""
        return [self.python or default_python, "-m", self.module_name, self.spec_url]

    @property
    def identity(self) -> tuple:
        """What makes two requests the same job launch: a pre-started job is followed only by an equal one."""
        return (
            self.kind,
            self.module_name,
            self.spec_url,
            self.python,
            tuple(sorted(self.env.items())),
            tuple(sorted(self.labels.items())),
            self.attempt,
        )


@dataclass(frozen=True)
class LaunchOutcome:
    """What a launcher reports: how the job ended. Job failures are outcomes, not exceptions."""

    exit_code: int | None
    job_id: str
    timed_out: bool = False
    detail: str = ""


@dataclass(frozen=True)
class JobResult:
    """A completed job: exit code (0), wall seconds from launch to exit, last output lines, where it ran."""

    kind: str
    exit_code: int
    seconds: float
    last_lines: tuple[str, ...]
    launcher: str
    job_id: str


# ----------------------------------------------------------------------------------------------------- registry
class Launcher(ABC):
    """Runs a :class:`JobRequest` to its end. Subclasses register with ``@register_launcher(name)``."""

    name: ClassVar[str] = ""

    @abstractmethod
    def run(self, request: JobRequest, on_line: LineSink) -> LaunchOutcome:
        """Start the job, call ``on_line`` (from the calling thread) with each output line as it arrives, wait.

        Must enforce ``request.timeout_s`` (returning ``timed_out=True`` after killing the job) and must kill the
        job before re-raising if the wait is interrupted (task cancellation, KeyboardInterrupt).

        Raises:
            JobLaunchError: the job could not be started or watched.
        """

    def prestart(self, request: JobRequest) -> bool:
        """Start the job now, ahead of the :meth:`run` that will follow it: the job gets ready and waits at its
        start gate (``start_after`` in its spec, :mod:`mugrpo.start_gate`). A later :meth:`run` of an equal
        request (same kind, module, spec, interpreter, environment and attempt) follows this job instead of
        starting another. Returns whether a job was started (the default: no, the job starts at :meth:`run`).

        Raises:
            JobLaunchError: the job could not be started.
        """
        return False

    def discard_prestarted(self, labels: Mapping[str, str] | None = None) -> int:
        """Stop the pre-started jobs no :meth:`run` has followed yet (those whose labels include ``labels``;
        all when None). Returns how many were stopped."""
        return 0


LAUNCHERS: Registry[type[Launcher]] = Registry("launcher")
"""Launcher classes by name; instantiate with ``LAUNCHERS[name](**options)``."""


def register_launcher(name: str) -> Callable[[type[Launcher]], type[Launcher]]:
    """Class decorator: register a :class:`Launcher` subclass in :data:`LAUNCHERS` and set its ``name``.

    Raises:
        ValueError: ``name`` is already registered to another class.
    """

    def deco(cls: type[Launcher]) -> type[Launcher]:
        LAUNCHERS.register(name)(cls)
        cls.name = name
        return cls

    return deco


def launch_job(request: JobRequest, launcher: Launcher, on_line: LineSink | None = None) -> JobResult:
    """Run ``request`` on ``launcher``; stream lines to ``on_line``; return a :class:`JobResult` on exit code 0.

    Raises:
        JobTimeoutError: the job ran past ``request.timeout_s`` and was killed.
        JobFailedError: the job exited non-zero (or its Kubernetes Job failed).
        JobLaunchError: the launcher could not start or watch the job.
    """
    tail: deque[str] = deque(maxlen=TAIL_LINES)

    def sink(line: str) -> None:
        tail.append(line)
        if on_line is not None:
            on_line(line)

    t0 = time.monotonic()
    outcome = launcher.run(request, sink)
    seconds = time.monotonic() - t0
    last = tuple(tail)
    where = f"{request.kind} job {outcome.job_id} ({launcher.name}, spec {request.spec_url})"
    if outcome.timed_out:
        raise JobTimeoutError(
            f"{where} exceeded its timeout of {request.timeout_s:g} s and was killed after {seconds:.1f} s"
            + (f"; {outcome.detail}" if outcome.detail else ""),
            kind=request.kind,
            timeout_s=request.timeout_s,
            last_lines=last,
        )
    if outcome.exit_code != 0:
        raise JobFailedError(
            f"{where} failed after {seconds:.1f} s: {describe_exit(outcome.exit_code)}"
            + (f"; {outcome.detail}" if outcome.detail else ""),
            kind=request.kind,
            exit_code=outcome.exit_code,
            last_lines=last,
        )
    return JobResult(request.kind, 0, seconds, last, launcher.name, outcome.job_id)


def describe_exit(exit_code: int | None) -> str:
    """Human text for a process exit code: ``exit code 3``, ``killed by SIGKILL``, ``exit code unknown``."""
    if exit_code is None:
        return "exit code unknown"
    if exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exit code {exit_code}"


def clip_line(line: str) -> str:
    """``line`` without its line end, cut to :data:`MAX_LINE_CHARS` characters."""
    line = line.rstrip("\r\n")
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " [...]"


# --------------------------------------------------------------------------------------------------- subprocess
_EOF = object()
#: Process groups of running subprocess jobs; killed at interpreter exit so a dying flow leaves no job behind.
_LIVE_GROUPS: set[int] = set()
_LIVE_LOCK = threading.Lock()


def _kill_live_groups() -> None:
    with _LIVE_LOCK:
        groups = list(_LIVE_GROUPS)
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)


atexit.register(_kill_live_groups)
atexit.register(forkserver.close_servers)


def discard_prestarted(labels: Mapping[str, str] | None = None) -> int:
    """SIGKILL the process groups of the subprocess jobs pre-started and not followed yet whose labels include
    ``labels`` (all when None). Returns how many were stopped. A waiting job has read nothing of the run and
    written nothing, so stopping it loses no work."""
    with _LIVE_LOCK:
        doomed = [
            key
            for key, job in _PRESTARTED.items()
            if labels is None or all(job.request.labels.get(k) == v for k, v in labels.items())
        ]
        jobs = [_PRESTARTED.pop(key) for key in doomed]
    for job in jobs:
        _signal_group(job.pgid, signal.SIGKILL)
        job.proc.wait()
        with _LIVE_LOCK:
            _LIVE_GROUPS.discard(job.pgid)
        if job.proc.stdout is not None:
            with contextlib.suppress(OSError, ValueError):
                job.proc.stdout.close()
    return len(jobs)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when no process of the group is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def _pump(stream: IO[str], lines: queue.Queue) -> None:
    """Reader thread: move output lines of the job to ``lines`` until EOF (every writer of the pipe is gone)."""
    try:
        for line in stream:
            lines.put(clip_line(line))
    except (OSError, ValueError):  # the pipe was closed under us after a kill
        pass
    finally:
        lines.put(_EOF)


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL the job when the thread that started it ends (Linux
    ``prctl(PR_SET_PDEATHSIG)``). The launcher waits for the job in that thread, so this fires when the flow
    process dies, even by SIGKILL: a dead flow cannot leave a job running. None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded in the parent: the child only makes one foreign call
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(137)

    return preexec


#: Jobs started ahead by :meth:`SubprocessLauncher.prestart`, by :attr:`JobRequest.identity`, until a run follows.
_PRESTARTED: dict[tuple, _JobProcess] = {}
_prestart_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _prestarter() -> concurrent.futures.ThreadPoolExecutor:
    """The one long-lived thread that starts pre-started jobs: a job's parent-death signal fires when the thread
    that started it ends (``PR_SET_PDEATHSIG``), so it must not be a task's thread, which ends before the job's
    run follows it."""
    global _prestart_pool
    with _LIVE_LOCK:
        if _prestart_pool is None:
            _prestart_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="job-prestart")
        return _prestart_pool


def _on_prestarter(fn: Callable, *args):
    """``fn(*args)`` on the prestart thread (:func:`_prestarter`), from any thread, that one included."""
    if threading.current_thread().name.startswith("job-prestart"):
        return fn(*args)
    return _prestarter().submit(fn, *args).result()


def autogroup_nice(pid: int | str = "self") -> int | None:
    """The nice value of ``pid``'s autogroup (Linux ``CONFIG_SCHED_AUTOGROUP``: the CPU is shared between sessions
    first, and a process's own nice value only counts inside its session), or None where there is none."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().split("nice")[1])
    except (OSError, IndexError, ValueError):
        return None


def set_priority(pid: int | str, nice: int) -> None:
    """Give ``pid``'s whole session ``nice``: its autogroup's nice value where the kernel groups by session, and
    every thread of its process group (``pid`` leads both: a job's own session). Best effort: a process gone
    meanwhile, or a kernel without autogroups, changes nothing else."""
    with contextlib.suppress(OSError, ValueError):
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    if pid != "self":
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PGRP, int(pid), nice)


def can_raise_priority() -> bool:
    """Whether this process may lower a niceness again (``CAP_SYS_NICE``, Linux): only then are pre-started jobs
    niced while they wait (:class:`SubprocessLauncher`)."""
    try:
        with open("/proc/self/status") as f:
            caps = next(line for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caps.split()[1], 16) >> 23 & 1)


@dataclass
class _JobProcess:
    """A job's process (leader of its own process group) and the thread moving its output lines to a queue."""

    request: JobRequest
    proc: subprocess.Popen
    lines: queue.Queue
    niced: bool = False

    @property
    def pgid(self) -> int:
        return self.proc.pid


@register_launcher("subprocess")
class SubprocessLauncher(Launcher):
    """Run the job as a child process in its own session; stdout and stderr are merged, line by line.

    The child's environment is this process's environment, then ``PYTHONUNBUFFERED=1`` (lines arrive as they are
    printed, not when a buffer fills), then ``request.env``.

    Pre-started jobs (:meth:`prestart`) are children of this process too, held in a module-level table until a
    :meth:`run` of an equal request follows them (its timeout counts from then); their output lines wait in a
    queue. Where this process may raise a priority back (:func:`can_raise_priority`), a pre-started job's process
    group runs at ``prestart_nice`` while it gets ready, so its imports take the cores the running job leaves idle,
    and is set back to this process's niceness when its run follows it.

    Args:
        kill_grace_s: seconds between SIGTERM and SIGKILL to the job's process group on timeout or cancellation.
        kill_with_parent: Linux only: the kernel SIGKILLs the job's leader process if this process dies (even by
            SIGKILL). Processes the job started itself are not covered: a job must stop its children when it dies.
        prestart_nice: niceness added to a pre-started job until it is followed (0: none).
    """

    def __init__(
        self, kill_grace_s: float = 10.0, kill_with_parent: bool = True, prestart_nice: int = 10, fork: bool = False
    ):
        if kill_grace_s < 0:
            raise ValueError(f"kill_grace_s must be >= 0, got {kill_grace_s}")
        if not 0 <= prestart_nice <= 19:
            raise ValueError(f"prestart_nice must be within 0..19, got {prestart_nice}")
        self.kill_grace_s = kill_grace_s
        self.kill_with_parent = kill_with_parent
        self.prestart_nice = prestart_nice
        self.fork = fork

    def _start(self, request: JobRequest, nice: int = 0) -> _JobProcess:
        """Start the job's process in its own session (forked from the job fork server with ``fork``, where one
        runs: :mod:`tasks.forkserver`) and a thread that reads its output.

        Raises:
            JobLaunchError: the process could not be started.
        """
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **request.env}
        pdeath = _parent_death_signal() if self.kill_with_parent else None
        if self.fork and forkserver.supported():
            job = self._fork(request, env, nice, pdeath)
            if job is not None:
                return job

        def preexec() -> None:
            if pdeath is not None:
                pdeath()
            if nice:
                os.nice(nice)
                set_priority("self", (autogroup_nice() or 0) + nice)  # the session's share (after setsid)

        try:
            proc = subprocess.Popen(
                request.command(sys.executable),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                text=True,
                encoding="utf-8",
                errors="replace",
                start_new_session=True,  # own session and process group: pgid == pid
                preexec_fn=preexec if (pdeath is not None or nice) else None,
            )
        except OSError as e:
            raise JobLaunchError(
                f"cannot start the {request.kind} job {request.command(sys.executable)}: {e}", kind=request.kind
            ) from e
        with _LIVE_LOCK:
            _LIVE_GROUPS.add(proc.pid)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), name=f"job-{proc.pid}-output", daemon=True).start()
        return _JobProcess(request, proc, lines, niced=bool(nice))

    def _fork(
        self, request: JobRequest, env: dict[str, str], nice: int, pdeath: Callable[[], None] | None
    ) -> _JobProcess | None:
        """The job forked from the fork server of its interpreter and environment (started on first use, on the
        long-lived prestart thread: its parent-death signal must outlive this call); None when no server can run
        (the caller spawns the job)."""
        python = request.python or sys.executable
        server = _on_prestarter(forkserver.server_for, python, env, lambda: forkserver.ForkServer(python, env, pdeath))
        if server is None:
            return None
        try:
            proc = server.fork(
                [request.module_name, request.spec_url], env, nice=nice, title=shlex.join(request.command(python))
            )
        except OSError as e:
            raise JobLaunchError(
                f"cannot fork the {request.kind} job from the job fork server: {e}", kind=request.kind
            ) from e
        with _LIVE_LOCK:
            _LIVE_GROUPS.add(proc.pid)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), name=f"job-{proc.pid}-output", daemon=True).start()
        return _JobProcess(request, proc, lines, niced=bool(nice))

    def prestart(self, request: JobRequest) -> bool:
        with _LIVE_LOCK:
            if request.identity in _PRESTARTED:
                return True
        nice = self.prestart_nice if can_raise_priority() else 0
        job = _on_prestarter(self._start, request, nice)
        with _LIVE_LOCK:
            _PRESTARTED[request.identity] = job
        return True

    def discard_prestarted(self, labels: Mapping[str, str] | None = None) -> int:
        return discard_prestarted(labels)

    def run(self, request: JobRequest, on_line: LineSink) -> LaunchOutcome:
        with _LIVE_LOCK:
            job = _PRESTARTED.pop(request.identity, None)
        if job is None:
            job = self._start(request)
        else:
            on_line(f"following the {request.kind} job pre-started as pid {job.pgid}")
            if job.niced:  # back to this process's priority, for the job and every process it started
                set_priority(job.pgid, os.getpriority(os.PRIO_PROCESS, 0))
        return self._follow(job, on_line)

    def _follow(self, job: _JobProcess, on_line: LineSink) -> LaunchOutcome:
        """Stream the job's lines to ``on_line`` until it exits or its timeout (from now) passes."""
        proc, lines, pgid, request = job.proc, job.lines, job.pgid, job.request
        deadline = time.monotonic() + request.timeout_s
        timed_out, eof, detail = False, False, ""
        try:
            while proc.poll() is None:
                if time.monotonic() >= deadline:
                    timed_out = True
                    self._terminate(proc, lines, on_line)
                    break
                eof = self._drain(lines, on_line, wait_s=min(0.2, max(deadline - time.monotonic(), 0.0))) or eof
        except BaseException:
            # Cancellation or interrupt while waiting: the job must not outlive the task that launched it.
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            # Stragglers: processes the job left behind in its group hold the pipe open and may write files.
            if _signal_group(pgid, signal.SIGKILL) and not timed_out:
                detail = "processes left behind in the job's process group were killed"
            with _LIVE_LOCK:
                _LIVE_GROUPS.discard(pgid)
        end = time.monotonic() + 5.0
        while not eof and time.monotonic() < end:
            eof = self._drain(lines, on_line, wait_s=0.2)
        if proc.stdout is not None and eof:
            # (Without EOF a process outside the group holds the pipe open; closing the stream would block on the
            # reader thread's lock, so the daemon thread keeps it until that process exits.)
            proc.stdout.close()
        return LaunchOutcome(exit_code=proc.wait(), job_id=f"pid {pgid}", timed_out=timed_out, detail=detail)

    @staticmethod
    def _drain(lines: queue.Queue, on_line: LineSink, wait_s: float) -> bool:
        """Pass queued lines to ``on_line`` (waiting up to ``wait_s`` for the first); True once EOF was seen."""
        try:
            item = lines.get(timeout=wait_s) if wait_s > 0 else lines.get_nowait()
        except queue.Empty:
            return False
        while True:
            if item is _EOF:
                return True
            on_line(item)
            try:
                item = lines.get_nowait()
            except queue.Empty:
                return False

    def _terminate(self, proc: subprocess.Popen, lines: queue.Queue, on_line: LineSink) -> None:
        """SIGTERM the job's group, keep streaming its last words for ``kill_grace_s``, then SIGKILL the group."""
        _signal_group(proc.pid, signal.SIGTERM)
        end = time.monotonic() + self.kill_grace_s
        while proc.poll() is None and time.monotonic() < end:
            self._drain(lines, on_line, wait_s=0.1)
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
