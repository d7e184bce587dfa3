"""The processes of subprocess jobs: the table that owns them (:class:`ProcessTable`: running and pre-started jobs,
the prestart thread, the stop flag), the thread moving a job's output lines to a queue, and the kernel's parent-death
signal that stops a job when the flow process dies."""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO

from tasks import forkserver
from tasks.launchers.protocol import clip_line
from tasks.launchers.request import JobRequest

#: What the output thread puts in a job's queue after its last line.
EOF = object()


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when no process of the group is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def stop_group(proc: subprocess.Popen, grace_s: float, kill_wait_s: float = 5.0) -> None:
    """Stop the process group ``proc`` leads (started with ``start_new_session``): SIGTERM, SIGKILL after ``grace_s``
    seconds, then SIGKILL to whatever it left in its group."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        if not signal_group(proc.pid, sig):
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    signal_group(proc.pid, signal.SIGKILL)


def _pump(stream: IO[str], lines: queue.Queue) -> None:
    """Reader thread: move output lines of the job to ``lines`` until EOF (every writer of the pipe is gone)."""
    try:
        for line in stream:
            lines.put(clip_line(line))
    except (OSError, ValueError):  # the pipe was closed under us after a kill
        pass
    finally:
        lines.put(EOF)


def parent_death_signal() -> Callable[[], None] | None:
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


@dataclass
class JobProcess:
    """A job's process (leader of its own process group) and the thread moving its output lines to a queue."""

    request: JobRequest
    proc: subprocess.Popen
    lines: queue.Queue
    niced: bool = False

    @property
    def pgid(self) -> int:
        return self.proc.pid


class ProcessTable:
    """The subprocess jobs of this process, in one place: the process groups of the jobs that run or wait (killed
    at interpreter exit, so a dying flow leaves no job behind), the jobs started ahead (pre-started) until a run
    follows them, the one thread that starts those, and the stop flag (set on Ctrl-C / SIGTERM by
    :mod:`tasks.stops`: no new job starts). Every method is thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: a signal handler may run while the main thread holds it
        self._groups: set[int] = set()
        self._prestarted: dict[tuple, JobProcess] = {}
        self._prestart_pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: Set once this process is stopping: the launcher starts no new job.
        self.stopping = threading.Event()
        #: ``time.monotonic()`` at which a stop SIGKILLs the jobs it sent SIGTERM (:mod:`tasks.stops`: the jobs'
        #: share of the grace, in which a job saves its work); None: no stop, or none set.
        self.jobs_kill_at: float | None = None

    # -- running jobs -----------------------------------------------------------------------------------------
    def adopt(self, request: JobRequest, proc: subprocess.Popen, *, niced: bool = False) -> JobProcess:
        """Track a just-started job: its group is killed at exit, and a thread moves its output lines to a queue."""
        self.track(proc.pid)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), name=f"job-{proc.pid}-output", daemon=True).start()
        return JobProcess(request, proc, lines, niced=niced)

    def track(self, pgid: int) -> None:
        """Track process group ``pgid`` as a job's: signalled on a stop, killed at interpreter exit."""
        with self._lock:
            self._groups.add(pgid)

    def release(self, pgid: int) -> None:
        """The job of group ``pgid`` ended and its group was killed: stop tracking it."""
        with self._lock:
            self._groups.discard(pgid)

    def groups(self) -> list[int]:
        """The process groups of the jobs that run or wait (pre-started)."""
        with self._lock:
            return sorted(self._groups)

    def kill_all(self) -> None:
        """SIGKILL every tracked group (at interpreter exit)."""
        for pgid in self.groups():
            signal_group(pgid, signal.SIGKILL)

    # -- pre-started jobs -------------------------------------------------------------------------------------
    def is_prestarted(self, identity: tuple) -> bool:
        with self._lock:
            return identity in self._prestarted

    def hold(self, identity: tuple, job: JobProcess) -> None:
        """Keep a pre-started job until a run of an equal request follows it (:meth:`follow`)."""
        with self._lock:
            self._prestarted[identity] = job

    def follow(self, identity: tuple) -> JobProcess | None:
        """The pre-started job of ``identity``, no longer held (None when there is none)."""
        with self._lock:
            return self._prestarted.pop(identity, None)

    def discard_prestarted(self, labels: Mapping[str, str] | None = None, grace_s: float = 10.0) -> int:
        """Stop the pre-started jobs not followed yet whose labels include ``labels`` (all when None) as a running
        job is stopped: SIGTERM, then SIGKILL after ``grace_s`` seconds (during a stop, at the stop's deadline for
        the jobs). Returns how many; each is stopped on a thread of its own and stays tracked until it is gone, so a
        stop's wait (:func:`tasks.stops.kill_jobs`) still sees it.

        A job still at its start gate exits at once on the SIGTERM: it has read nothing of the run and written
        nothing. But a job may pass its gate before the run follows it (its inputs were committed), e.g. a train job
        inside a checkpoint commit when a stop unwinds the flow; the SIGTERM lets it save within its grace, where a
        SIGKILL would throw its work away.
        """
        with self._lock:
            doomed = [
                key
                for key, job in self._prestarted.items()
                if labels is None or all(job.request.labels.get(k) == v for k, v in labels.items())
            ]
            jobs = [self._prestarted.pop(key) for key in doomed]
        for job in jobs:
            threading.Thread(target=self._stop, args=(job, grace_s), name=f"job-{job.pgid}-stop", daemon=True).start()
        return len(jobs)

    def _stop(self, job: JobProcess, grace_s: float) -> None:
        """A discarded pre-started job's thread: SIGTERM its group, SIGKILL it after ``grace_s`` seconds (during a
        stop, at the stop's own deadline for the jobs instead: :func:`tasks.stops.kill_jobs` SIGKILLs every tracked
        group then), then stop tracking it."""
        try:
            signal_group(job.pgid, signal.SIGTERM)
            end = time.monotonic() + grace_s
            while job.proc.poll() is None and (time.monotonic() < end or self.stopping.is_set()):
                time.sleep(0.05)
            signal_group(job.pgid, signal.SIGKILL)  # the job if it is still there, and whatever it left in its group
            job.proc.wait()
        finally:
            self.release(job.pgid)
            if job.proc.stdout is not None:
                with contextlib.suppress(OSError, ValueError):
                    job.proc.stdout.close()

    def on_prestarter(self, fn: Callable, *args):
        """``fn(*args)`` on the one long-lived thread that starts pre-started jobs (and the fork servers), from any
        thread, that one included: a job's parent-death signal fires when the thread that started it ends
        (``PR_SET_PDEATHSIG``), so it must not be a task's thread, which ends before the job's run follows it."""
        if threading.current_thread().name.startswith("job-prestart"):
            return fn(*args)
        with self._lock:
            if self._prestart_pool is None:
                self._prestart_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="job-prestart")
            pool = self._prestart_pool
        return pool.submit(fn, *args).result()


#: This process's subprocess jobs.
PROCESSES = ProcessTable()
atexit.register(PROCESSES.kill_all)
atexit.register(forkserver.close_servers)
