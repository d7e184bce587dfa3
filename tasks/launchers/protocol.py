"""The launcher protocol (:class:`Launcher`), the registry of launchers (:data:`LAUNCHERS`) and the one entry point
that runs a job on a launcher (:func:`launch_job`); the output-line helpers every launcher shares."""

from __future__ import annotations

import signal
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from typing import ClassVar

from mugrpo.common.exit_codes import ExitCode
from mugrpo.common.registry import Registry
from tasks.launchers.errors import JobFailedError, JobPreemptedError, JobTimeoutError
from tasks.launchers.request import JobRequest, JobResult, LaunchOutcome

#: Output lines of a job kept for results and error messages.
TAIL_LINES = 20
#: Characters kept of one output line (a progress bar without newlines must not flood the logs).
MAX_LINE_CHARS = 4000

#: How a job's own line about its preemption starts (what it saved, :mod:`mugrpo.common.preemption`).
PREEMPTED_PREFIX = "preempted:"

LineSink = Callable[[str], None]


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
        start gate (``start_after`` in its spec, :mod:`mugrpo.coordination.start_gate`). A later :meth:`run` of an equal
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
        JobPreemptedError: the job stopped on a SIGTERM after saving its work (exit code 75,
            :attr:`~mugrpo.common.exit_codes.ExitCode.PREEMPTED`); transient: a re-run resumes from it.
        JobFailedError: the job exited non-zero otherwise (or its Kubernetes Job failed).
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
    if outcome.exit_code == ExitCode.PREEMPTED:
        notice = next((line for line in reversed(last) if line.startswith(PREEMPTED_PREFIX)), "")
        raise JobPreemptedError(
            f"{where} preempted after {seconds:.1f} s (SIGTERM): saved its work; a re-run resumes from it"
            + (f"; {notice}" if notice else "")
            + (f"; {outcome.detail}" if outcome.detail else ""),
            kind=request.kind,
            exit_code=outcome.exit_code,
            last_lines=last,
            notice=notice,
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
    """Human text for a process exit code: ``exit code 3``, ``killed by SIGKILL``, ``exit code unknown``,
    ``preempted (exit code 75)`` (:attr:`~mugrpo.common.exit_codes.ExitCode.PREEMPTED`)."""
    if exit_code is None:
        return "exit code unknown"
    if exit_code == ExitCode.PREEMPTED:
        return f"preempted (exit code {exit_code})"
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
