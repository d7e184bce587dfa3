"""The errors of a job that did not complete, each carrying the job's last output lines (:class:`JobError`)."""

from __future__ import annotations

from mugrpo.common.exit_codes import ExitCode

#: Exit codes that mean "the job refused" (the command line, the spec or an input is wrong, an input was tampered
#: with, the run lease is lost): a retry cannot help (argparse/typer usage errors, ``mugrpo.jobs.common.load_spec`` and
#: every refusal of a job exit with 2, :mod:`mugrpo.common.exit_codes`).
NON_RETRYABLE_EXIT_CODES = frozenset({ExitCode.ASKED_WRONG})


# ----------------------------------------------------------------------------------------------------------- errors
class JobError(RuntimeError):
    """A job did not complete. ``last_lines`` holds its last output lines (oldest first); ``summary`` is the message
    without them (the job's lines were streamed to the run's log as they came: a console shows them already)."""

    #: Whether a retry of the same job can succeed (Prefect's retry condition reads it).
    transient = True

    def __init__(self, message: str, *, kind: str, last_lines: tuple[str, ...] = ()):
        self.kind = kind
        self.last_lines = tuple(last_lines)
        self.summary = message
        if self.last_lines:
            message += f"\n--- last {len(self.last_lines)} lines of the {kind} job ---\n" + "\n".join(self.last_lines)
        super().__init__(message)


class JobFailedError(JobError):
    """The job exited with a non-zero code (``exit_code``; negative = killed by that signal, None = unknown)."""

    def __init__(self, message: str, *, kind: str, exit_code: int | None, last_lines: tuple[str, ...] = ()):
        self.exit_code = exit_code
        self.transient = exit_code not in NON_RETRYABLE_EXIT_CODES
        super().__init__(message, kind=kind, last_lines=last_lines)

    @property
    def refusal(self) -> str | None:
        """The job's own one-block refusal (exit code 2, its ``error: ...`` line and what follows it,
        :func:`mugrpo.jobs.common.fail`), or None when the job failed otherwise."""
        if self.exit_code not in NON_RETRYABLE_EXIT_CODES:
            return None
        starts = [i for i, line in enumerate(self.last_lines) if line.startswith("error: ")]
        if not starts:
            return None
        block = [self.last_lines[starts[-1]].removeprefix("error: ")]
        block += [line for line in self.last_lines[starts[-1] + 1 :] if line.strip()]
        return "\n".join(block)


class JobPreemptedError(JobFailedError):
    """The job stopped on a preemption notice (a SIGTERM: an eviction, a node drain, a stop) after saving what fitted
    in its grace, and exited with :attr:`~mugrpo.common.exit_codes.ExitCode.PREEMPTED` (75). Always transient: a
    re-run of the same job resumes from the saved update. ``notice`` is the job's own ``preempted: ...`` line (what
    it saved), or ``""`` when it printed none."""

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        exit_code: int | None = ExitCode.PREEMPTED,
        last_lines: tuple[str, ...] = (),
        notice: str = "",
    ):
        super().__init__(message, kind=kind, exit_code=exit_code, last_lines=last_lines)
        self.notice = notice
        self.transient = True


class JobTimeoutError(JobError):
    """The job ran longer than its timeout and was killed (its whole process group, or its Kubernetes Job)."""

    def __init__(self, message: str, *, kind: str, timeout_s: float, last_lines: tuple[str, ...] = ()):
        self.timeout_s = timeout_s
        super().__init__(message, kind=kind, last_lines=last_lines)


class JobLaunchError(JobError):
    """The launcher could not start or watch the job (e.g. the Kubernetes API failed); usually transient."""
