"""Exit codes: the one table that gives every refusal and failure its exit code, for ``mugrpo`` and for the jobs.

Five codes (:class:`ExitCode`); docs/reliability.md ("Exit codes", "Refusals") lists the cases behind each:

======  ===============  ==============================================================================================
code    name             meaning
======  ===============  ==============================================================================================
0       OK               done (a job whose work was already committed too)
1       FAILED           the work failed (a job's error, a disk that filled mid-run, inputs not committed in time):
                         committed work is kept; fix the cause, then ``mugrpo resume``. Also a check that found a
                         problem (``mugrpo verify``, ``audit``, ``data check``, a failed ``sql`` query)
2       ASKED_WRONG      what was asked is wrong (a config key or value, an argument, an input, a job spec); nothing
                         was written. A job also exits 2 for every refusal it meets (a tampered input, a lost lease):
                         2 is the one code its launcher does not retry, and ``mugrpo`` prints the job's block
3       STATE_REFUSES    the run's stored state refuses it (another writer holds the lease, corrupted committed
                         files, pruned AdamW moments, a fork's parent); a train job's NaN/inf loss or gradient
75      PREEMPTED        a job stopped on a preemption notice after saving what fitted (sysexits.h ``EX_TEMPFAIL``:
                         a re-run resumes)
======  ===============  ==============================================================================================

(A stop of ``mugrpo run`` exits 130 / 143, 128 + the signal's number: :mod:`tasks.stops`, not a row here.)

:data:`TABLE` maps each exception class to its code, most specific first; :func:`exit_code_of` is how the command
line (:mod:`mugrpo.cli`) and the jobs (:mod:`mugrpo.jobs.common`) pick a code for an exception they caught. A subclass
has its parent's code unless it has a row of its own. A row has a second code where a job exits otherwise than the
command line (``job=True``). :class:`~mugrpo.orchestration.preflight.Refusal` and
:class:`~mugrpo.orchestration.fork.ForkRefused` carry their code (an :class:`ExitCode`, set from this table where they
wrap another error): :func:`exit_code_of` returns it, their row gives the default.

This module is the lowest layer (:mod:`mugrpo.common`): it imports nothing of mugrpo and names the classes by their
qualified names (``module.Class``), so the command line's table lookup imports no library (no torch for a refusal);
``tests/unit/test_exit_codes.py`` checks that every name is a class.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


class ExitCode(IntEnum):
    """The exit codes of ``mugrpo`` and of its jobs (the module docstring's table)."""

    #: done
    OK = 0
    #: the work failed: a job's error, a write of the flow that failed, inputs not committed in time
    FAILED = 1
    #: what was asked is wrong: config, argument, input, job spec; a job's refusal (not retried)
    ASKED_WRONG = 2
    #: the run's stored state refuses it: lease held, corruption, pruned moments, a fork's parent; a NaN/inf update
    STATE_REFUSES = 3
    #: a job stopped on a preemption notice after saving (sysexits.h EX_TEMPFAIL: try again later)
    PREEMPTED = 75


_FAILED, _ASKED, _STATE, _PREEMPTED = (
    ExitCode.FAILED,
    ExitCode.ASKED_WRONG,
    ExitCode.STATE_REFUSES,
    ExitCode.PREEMPTED,
)


class Row(NamedTuple):
    """One row of :data:`TABLE`: the code of ``mugrpo``; the code of a job where it differs; whether an instance
    carries its own code in ``exit_code`` (an :class:`ExitCode`; then ``code`` is its default)."""

    code: ExitCode
    job: ExitCode | None = None
    carried: bool = False


#: Exception class (``module.Class``, where it is defined) -> its :class:`Row`, most specific first. The first row met
#: along a class's MRO decides.
TABLE: dict[str, Row] = {
    # refusals that carry their own code (the row is the default)
    "mugrpo.orchestration.preflight.Refusal": Row(_ASKED, carried=True),
    "mugrpo.orchestration.fork.ForkRefused": Row(_ASKED, carried=True),
    # the run's state refuses it
    "mugrpo.orchestration.resume.MomentsPrunedError": Row(_STATE),
    "mugrpo.coordination.lease.RunLeaseHeld": Row(_STATE),
    "mugrpo.coordination.lease.LeaseFenced": Row(_STATE, _ASKED),  # a job refuses to commit; the run was taken over
    "mugrpo.storage.locks.LocalLockTimeout": Row(_STATE),
    "mugrpo.commits.verify.CorruptedRunError": Row(_STATE),
    "mugrpo.commits.retention.OptimizerStatePruned": Row(_STATE, _ASKED),
    "mugrpo.trainer.step.NonFiniteError": Row(_STATE),  # a NaN/inf loss: the train job stops, checkpoint intact
    # what was asked is wrong (the inputs' refusals are ChecksumErrors too: their RunRefused row comes first)
    "mugrpo.provenance.refusals.InputChangedError": Row(_ASKED),
    "mugrpo.provenance.refusals.RunRefused": Row(_ASKED),
    "mugrpo.storage.exceptions.ChecksumError": Row(_STATE, _ASKED),  # committed data changed; a job: a tampered input
    "mugrpo.storage.errors.StorageUnavailable": Row(_ASKED),  # endpoint, credentials, bucket
    "mugrpo.config.loading.ConfigError": Row(_ASKED),
    "mugrpo.commits.tables.RolloutDataError": Row(_ASKED),
    "mugrpo.commits.tables.SchemaError": Row(_ASKED),
    "builtins.FileNotFoundError": Row(_ASKED),  # a run or a file named that is not there
    "builtins.ValueError": Row(_ASKED),  # a value given that is not one (a run id, two runs sharing one)
    # preempted
    "mugrpo.trainer.preemption.Preempted": Row(_PREEMPTED),
    "mugrpo.common.preemption.PreemptionInterrupt": Row(_PREEMPTED),
    # the work failed
    "mugrpo.coordination.start_gate.StartTimeout": Row(_FAILED),
    "mugrpo.generation.spec.GenerationError": Row(_FAILED),
    "tasks.launchers.errors.JobError": Row(_FAILED),
    "mugrpo.storage.exceptions.StorageError": Row(_FAILED),  # a write of the run flow (a full disk)
}


def exit_code_for(cls: type[BaseException], *, job: bool = False) -> ExitCode:
    """The code :data:`TABLE` gives exception class ``cls``: its own row, else its nearest ancestor's (MRO order).

    Args:
        cls: an exception class.
        job: the code a job exits with (differs for a job's refusals: 2, the code its launcher does not retry).

    Returns:
        The row's code; :attr:`ExitCode.FAILED` for a class the table does not know (an unexpected error).
    """
    row = _row(cls)
    if row is None:
        return ExitCode.FAILED
    return row.job if job and row.job is not None else row.code


def _row(cls: type[BaseException]) -> Row | None:
    """The row of ``cls`` or of its nearest ancestor that has one (MRO order); None when none has."""
    for klass in cls.__mro__:
        row = TABLE.get(f"{klass.__module__}.{klass.__qualname__}")
        if row is not None:
            return row
    return None


def exit_code_of(exc: BaseException, *, job: bool = False) -> ExitCode:
    """The exit code for exception ``exc``: the code it carries in ``exit_code`` where its row says it carries one
    (a :class:`~mugrpo.orchestration.preflight.Refusal`, a :class:`~mugrpo.orchestration.fork.ForkRefused`), else
    its class's code (:func:`exit_code_for`). The command line exits with it (``job=False``), a job with ``job=True``.

    Other ``exit_code`` attributes do not count: a launcher's ``JobFailedError.exit_code`` is the job's own exit
    status, and a failed job stops ``mugrpo`` with 1 (its refusal with 2 or 3, as :mod:`mugrpo.cli.run` says)."""
    row = _row(type(exc))
    carried = getattr(exc, "exit_code", None) if row is not None and row.carried else None
    if carried is not None:
        return ExitCode(carried)
    return exit_code_for(type(exc), job=job)
