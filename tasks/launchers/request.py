"""A job to run (:class:`JobRequest`), how a launcher reports its end (:class:`LaunchOutcome`) and a completed job
(:class:`JobResult`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_KIND_RE = re.compile(r"[a-z][a-z0-9_]*")
_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


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
