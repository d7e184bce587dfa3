"""The ``subprocess`` launcher: each job runs as a child process of the flow, in its own session (process group),
spawned or forked from the job fork server (:mod:`tasks.forkserver`)."""

from __future__ import annotations

import os
import queue
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from tasks import forkserver
from tasks.launchers.errors import JobLaunchError
from tasks.launchers.prestart import autogroup_nice, can_raise_priority, set_priority
from tasks.launchers.processes import EOF, PROCESSES, JobProcess, parent_death_signal, signal_group
from tasks.launchers.protocol import Launcher, LineSink, register_launcher
from tasks.launchers.request import JobRequest, LaunchOutcome

#: Seconds an interrupted launcher waits for the stop controller to mark a stop (its thread may see the signal a
#: moment after the interrupt reached the launcher's thread).
STOP_SETTLE_S = 1.0


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

    def _start(self, request: JobRequest, nice: int = 0) -> JobProcess:
        """Start the job's process in its own session (forked from the job fork server with ``fork``, where one
        runs: :mod:`tasks.forkserver`) and a thread that reads its output.

        Raises:
            JobLaunchError: the process could not be started.
        """
        if PROCESSES.stopping.is_set():  # a retry or the next job after Ctrl-C / SIGTERM: the run is stopping
            err = JobLaunchError(f"not starting the {request.kind} job: this run is stopping", kind=request.kind)
            err.transient = False
            raise err
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **request.env}
        pdeath = parent_death_signal() if self.kill_with_parent else None
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
        return PROCESSES.adopt(request, proc, niced=bool(nice))

    def _fork(
        self, request: JobRequest, env: dict[str, str], nice: int, pdeath: Callable[[], None] | None
    ) -> JobProcess | None:
        """The job forked from the fork server of its interpreter and environment (started on first use, on the
        long-lived prestart thread: its parent-death signal must outlive this call); None when no server can run
        (the caller spawns the job)."""
        python = request.python or sys.executable
        server = PROCESSES.on_prestarter(
            forkserver.server_for, python, env, lambda: forkserver.ForkServer(python, env, pdeath)
        )
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
        return PROCESSES.adopt(request, proc, niced=bool(nice))

    def prestart(self, request: JobRequest) -> bool:
        if PROCESSES.is_prestarted(request.identity):
            return True
        nice = self.prestart_nice if can_raise_priority() else 0
        PROCESSES.hold(request.identity, PROCESSES.on_prestarter(self._start, request, nice))
        return True

    def discard_prestarted(self, labels: Mapping[str, str] | None = None) -> int:
        return PROCESSES.discard_prestarted(labels, grace_s=self.kill_grace_s)

    def run(self, request: JobRequest, on_line: LineSink) -> LaunchOutcome:
        job = PROCESSES.follow(request.identity)
        if job is None:
            job = self._start(request)
        else:
            on_line(f"following the {request.kind} job pre-started as pid {job.pgid}")
            if job.niced:  # back to this process's priority, for the job and every process it started
                set_priority(job.pgid, os.getpriority(os.PRIO_PROCESS, 0))
        return self._follow(job, on_line)

    def _follow(self, job: JobProcess, on_line: LineSink) -> LaunchOutcome:
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
        except BaseException as e:
            # Cancellation or interrupt while waiting: the job must not outlive the task that launched it. At a stop
            # (tasks.stops) it got its SIGTERM and saves its work in its share of the grace first: wait for that,
            # its lines (what it saved) still reaching the log. The interrupt (KeyboardInterrupt, Prefect's
            # TerminationSignal) may reach this thread a moment before the stop controller's thread marks the stop.
            if not isinstance(e, Exception):
                PROCESSES.stopping.wait(STOP_SETTLE_S)
            if PROCESSES.stopping.is_set():
                self._wait_for_save(job, on_line)
            signal_group(pgid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            # Stragglers: processes the job left behind in its group hold the pipe open and may write files.
            if signal_group(pgid, signal.SIGKILL) and not timed_out:
                detail = "processes left behind in the job's process group were killed"
            PROCESSES.release(pgid)
        end = time.monotonic() + 5.0
        while not eof and time.monotonic() < end:
            eof = self._drain(lines, on_line, wait_s=0.2)
        if proc.stdout is not None and eof:
            # (Without EOF a process outside the group holds the pipe open; closing the stream would block on the
            # reader thread's lock, so the daemon thread keeps it until that process exits.)
            proc.stdout.close()
        return LaunchOutcome(exit_code=proc.wait(), job_id=f"pid {pgid}", timed_out=timed_out, detail=detail)

    def _wait_for_save(self, job: JobProcess, on_line: LineSink) -> None:
        """At a stop: stream the job's lines until it exits or the stop's SIGKILL time
        (:attr:`~tasks.launchers.processes.ProcessTable.jobs_kill_at`; none set: no wait)."""
        settle = time.monotonic() + STOP_SETTLE_S
        while PROCESSES.jobs_kill_at is None and time.monotonic() < settle:
            time.sleep(0.01)
        until = PROCESSES.jobs_kill_at or 0.0
        eof = False
        while job.proc.poll() is None and time.monotonic() < until:
            eof = self._drain(job.lines, on_line, wait_s=min(0.2, max(until - time.monotonic(), 0.0))) or eof
        while not eof and job.proc.poll() is not None:
            eof = self._drain(job.lines, on_line, wait_s=0.2)

    @staticmethod
    def _drain(lines: queue.Queue, on_line: LineSink, wait_s: float) -> bool:
        """Pass queued lines to ``on_line`` (waiting up to ``wait_s`` for the first); True once EOF was seen."""
        try:
            item = lines.get(timeout=wait_s) if wait_s > 0 else lines.get_nowait()
        except queue.Empty:
            return False
        while True:
            if item is EOF:
                return True
            on_line(item)
            try:
                item = lines.get_nowait()
            except queue.Empty:
                return False

    def _terminate(self, proc: subprocess.Popen, lines: queue.Queue, on_line: LineSink) -> None:
        """SIGTERM the job's group, keep streaming its last words for ``kill_grace_s``, then SIGKILL the group."""
        signal_group(proc.pid, signal.SIGTERM)
        end = time.monotonic() + self.kill_grace_s
        while proc.poll() is None and time.monotonic() < end:
            self._drain(lines, on_line, wait_s=0.1)
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
