"""What every job entry point shares: its command line, reading its spec, exit codes, and the process start time.

A job exits with :func:`~mugrpo.common.exit_codes.exit_code_of` ``(error, job=True)`` for an error it stops on
(:mod:`mugrpo.common.exit_codes` has the table): 0 done, 1 failed (retried), 2 refused (a bad spec or input, a
tampered input, a lost lease: not retried), 3 a NaN/inf update (train), 75 preempted.

The libraries the jobs call (:mod:`mugrpo.trainer`, :mod:`mugrpo.generation`, :mod:`mugrpo.evaluation.worker`,
:mod:`mugrpo.execution.warm`) never import this module: a job module parses its spec, calls the library and turns the
library's errors into exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

import fsspec
from pydantic import ValidationError

from mugrpo.common.exit_codes import ExitCode, exit_code_of
from mugrpo.common.progress import console
from mugrpo.coordination.jobspec import JobSpec

if TYPE_CHECKING:
    from mugrpo.common.preemption import PreemptionNotice

#: Process start as seen by the job (set at import of this module, i.e. right after the interpreter started).
PROCESS_START = time.monotonic()

S = TypeVar("S", bound=JobSpec)


def spec_argument(argv: list[str] | None, module: str, spec_cls: type[JobSpec], doc: str | None) -> str:
    """The one argument of a job's command line, ``python -m {module} SPEC``, parsed with argparse.

    ``-h``/``--help`` prints the usage and the job module's docstring (``doc``) and exits 0; a missing or extra
    argument prints the usage and exits 2 (a usage error: the launcher does not retry it).

    Returns:
        SPEC: the path or fsspec URL of the job's JSON spec (a ``spec_cls``).
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The run flow writes each job's spec under {root}/{run_id}/jobs/stage={k}/ and launches the job on it.",
    )
    parser.add_argument("spec", metavar="SPEC", help=f"path or fsspec URL of a {spec_cls.__name__} JSON file")
    return parser.parse_args(sys.argv[1:] if argv is None else argv).spec


def load_spec(url: str, cls: type[S]) -> S:
    """Read and validate a JSON job spec from a path or fsspec URL.

    Raises:
        SystemExit(2): the file is missing or invalid (:attr:`~mugrpo.common.exit_codes.ExitCode.ASKED_WRONG`);
            the message names the file and the bad fields.
    """
    raw_opts = os.environ.get("MUGRPO_STORAGE_OPTIONS", "")
    opts = json.loads(raw_opts) if raw_opts and "://" in url and not url.startswith("file://") else {}
    try:
        with fsspec.open(url, "rb", **opts) as f:
            raw = f.read()
    except FileNotFoundError:
        console.print(f"[red]job spec {url} does not exist[/red]")
        raise SystemExit(ExitCode.ASKED_WRONG) from None
    try:
        return cls.model_validate_json(raw)
    except ValidationError as e:
        console.print(f"[red]invalid job spec {url}:\n{e}[/red]")
        raise SystemExit(ExitCode.ASKED_WRONG) from None


@contextmanager
def refuse_untrusted(job: str, stage: int) -> Iterator[None]:
    """Turn a tampered input (:class:`~mugrpo.storage.store.ChecksumError`, naming the file) or a lost run lease
    (:class:`~mugrpo.coordination.lease.LeaseFenced`), or AdamW moments the job needs that
    ``train.keep_optimizer_state`` pruned (:class:`~mugrpo.commits.retention.OptimizerStatePruned`) into one error
    line and exit code 2: running the job again cannot fix any of them, so the launcher does not retry it. A
    pre-started job whose inputs were not committed in time (:class:`~mugrpo.coordination.start_gate.StartTimeout`)
    exits 1: a relaunch once they are may succeed. The codes are the table's (:mod:`mugrpo.common.exit_codes`,
    ``job=True``)."""
    from mugrpo.commits.retention import OptimizerStatePruned
    from mugrpo.coordination.lease import LeaseFenced
    from mugrpo.coordination.start_gate import StartTimeout
    from mugrpo.storage.store import ChecksumError

    try:
        yield
    except ChecksumError as e:
        fail(f"{job} stage {stage}: refusing a tampered input: {e}", exit_code_of(e, job=True))
    except (LeaseFenced, OptimizerStatePruned, StartTimeout) as e:
        fail(f"{job} stage {stage}: {e}", exit_code_of(e, job=True))


def prepare_process() -> None:
    """What a job process sets before its work: no library progress bars in its log
    (:func:`~mugrpo.common.progress.quiet_library_bars`), and an allocator that keeps freed memory for the next step's
    tensors instead of faulting it in again (:func:`~mugrpo.common.allocator.keep_freed_memory`)."""
    from mugrpo.common.allocator import keep_freed_memory
    from mugrpo.common.progress import quiet_library_bars

    quiet_library_bars()
    keep_freed_memory()


def since_start() -> float:
    """Seconds since this job process started (used for the switch-overhead timing T_switch)."""
    return time.monotonic() - PROCESS_START


def fail(message: str, code: ExitCode = ExitCode.FAILED) -> None:
    """Print a clear error and exit the job with ``code`` (:func:`~mugrpo.common.exit_codes.exit_code_of` of the
    error, ``job=True``; 1, FAILED, by default)."""
    console.print(f"error: {message}", style="red", markup=False, highlight=False)
    sys.exit(code)


def install_notice(what: str, *, interrupt: bool = True):
    """The job's :class:`~mugrpo.common.preemption.PreemptionNotice` (grace from ``MUGRPO_STOP_GRACE_S``), installed
    (``interrupt``: SIGTERM raises :class:`~mugrpo.common.preemption.PreemptionInterrupt` until the job says
    otherwise). A malformed grace fails the job: ``{what}: ...``, exit 2 (ASKED_WRONG: the environment is wrong)."""
    from mugrpo.common.preemption import PreemptionNotice

    try:
        return PreemptionNotice.from_env().install(interrupt=interrupt)
    except ValueError as e:
        fail(f"{what}: {e}", ExitCode.ASKED_WRONG)


def run_noticed(what: str, body: Callable[[PreemptionNotice], None], stopped: str) -> None:
    """Run a job's ``body(notice)`` with its preemption notice installed first of all (:func:`install_notice`).

    From the job's first moment a SIGTERM gets its ``preempted:`` line and exit 75: the fork server's child starts
    with SIGTERM's default action, which ends a process with no word. A notice that arrives before the body has taken
    over its handling (e.g. while the job imports and loads) ends the job at once with
    ``preempted: {stopped}``, ``{signal}`` in ``stopped`` replaced by the signal's name.
    """
    from mugrpo.common.preemption import PreemptionInterrupt

    notice = install_notice(what)
    try:
        body(notice)
    except PreemptionInterrupt:
        preempted(stopped.format(signal=notice.signal_name), notice)


def preempted(message: str, notice=None) -> None:
    """Print ``preempted: {message}`` (the line the launchers quote) and exit with
    :attr:`~mugrpo.common.exit_codes.ExitCode.PREEMPTED` (75): the job stopped on a preemption notice after saving
    what fitted in the grace; a re-run resumes from it. ``notice``: acknowledged first (no further interrupt)."""
    if notice is not None:
        notice.acknowledge()
    console.print(f"preempted: {message}", style="yellow", markup=False, highlight=False)
    sys.exit(ExitCode.PREEMPTED)
