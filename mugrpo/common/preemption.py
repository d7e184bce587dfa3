"""A preemption notice: the SIGTERM a job receives before its SIGKILL, and the time it has to save its work.

Whoever stops a job gives it a grace between the two signals: ``mugrpo run``'s stop path
(``orchestration.stop_grace_s`` less the seconds it keeps for its own cleanups, :func:`job_grace_s`), Kubernetes'
``terminationGracePeriodSeconds`` on an eviction or a node drain (set from the same number), a spot VM's notice. The
launchers pass that grace to the job in :data:`GRACE_ENV`; a job installs a :class:`PreemptionNotice` and asks it,
at its safe points, whether a stop was asked for and whether a piece of work of a predicted length still fits in the
time left. A job that stops on a notice exits with :data:`PREEMPTED_EXIT_CODE` (75, ``EX_TEMPFAIL`` of sysexits.h:
"try again later"), which the launchers report as a preemption, not a failure.

The handler only records the signal (the time it came): the work in flight runs on to the next safe point, where
the job decides. A second SIGTERM (or a SIGINT) changes nothing; the sender's SIGKILL ends the job wherever it is,
and every commit being a temporary file renamed into place, that leaves only temporary files (resume ignores them).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from mugrpo.common.exit_codes import ExitCode

#: Exit code of a job that stopped on a preemption notice after saving what fitted (sysexits.h ``EX_TEMPFAIL``):
#: :attr:`mugrpo.common.exit_codes.ExitCode.PREEMPTED`, under the name the launchers and their tests use.
PREEMPTED_EXIT_CODE = ExitCode.PREEMPTED
#: Environment variable: seconds from the SIGTERM a job receives to its SIGKILL (the launchers set it).
GRACE_ENV = "MUGRPO_STOP_GRACE_S"
#: Seconds of ``orchestration.stop_grace_s`` that ``mugrpo run`` keeps for its own cleanups after the jobs' wait
#: (lease release, Prefect server, resume line): the jobs get the rest (:func:`job_grace_s`).
CLEANUP_RESERVE_S = 5.0
#: Seconds between re-deliveries of an interrupting notice's signal until the job acknowledges it (a
#: :class:`PreemptionInterrupt` raised inside a destructor is printed and dropped by the interpreter).
REDELIVER_S = 0.5
#: Grace assumed when :data:`GRACE_ENV` is not set (a job started by hand): Kubernetes' default
#: ``terminationGracePeriodSeconds``.
DEFAULT_GRACE_S = 30.0


def cleanup_reserve_s(stop_grace_s: float) -> float:
    """Seconds of a stop's grace ``stop_grace_s`` kept for the CLI's cleanups: :data:`CLEANUP_RESERVE_S`, at most
    half the grace."""
    return min(CLEANUP_RESERVE_S, stop_grace_s / 2)


def job_grace_s(stop_grace_s: float) -> float:
    """Seconds a job gets from its SIGTERM to its SIGKILL under a stop of grace ``stop_grace_s``
    (``orchestration.stop_grace_s``): the grace less :func:`cleanup_reserve_s`."""
    return stop_grace_s - cleanup_reserve_s(stop_grace_s)


def termination_grace_period_s(grace_s: float) -> int:
    """Kubernetes ``terminationGracePeriodSeconds`` (whole seconds, >= 1) that gives a job ``grace_s`` seconds."""
    return max(1, math.ceil(grace_s))


def grace_from_env(environ: dict[str, str] | None = None) -> float:
    """The job's grace in seconds: :data:`GRACE_ENV`, else :data:`DEFAULT_GRACE_S`.

    Raises:
        ValueError: :data:`GRACE_ENV` is set but is not a number >= 0 (the message names it).
    """
    raw = (os.environ if environ is None else environ).get(GRACE_ENV)
    if raw is None or raw == "":
        return DEFAULT_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{GRACE_ENV}={raw!r}: expected seconds >= 0 from a job's SIGTERM to its SIGKILL")
    return value


class PreemptionInterrupt(BaseException):
    """Raised in the main thread at a preemption notice by a notice installed with ``interrupt=True`` (jobs whose
    work in flight is not worth finishing: a generation shard being sampled, an evaluation). A BaseException, as
    KeyboardInterrupt, so that no ``except Exception`` of the work in flight swallows it; ``finally`` blocks and
    context managers run (a commit thread finishes the shard it is committing)."""


@dataclass(frozen=True)
class Fit:
    """Whether a piece of work fits in the time left of a notice: ``fits``, the ``predicted_s`` seconds it takes
    (None: unknown, and then it is tried) and the seconds ``left_s``."""

    fits: bool
    predicted_s: float | None
    left_s: float

    def describe(self) -> str:
        predicted = "unknown" if self.predicted_s is None else f"{self.predicted_s:.1f} s"
        return f"predicted {predicted}, {self.left_s:.1f} s of the grace left"


class PreemptionNotice:
    """The SIGTERM of a job process and the grace it gives (module docstring). Install it in the main thread.

    Args:
        grace_s: seconds from the SIGTERM to the SIGKILL (:func:`grace_from_env`).
        margin_s: seconds of the grace never planned on (the exit itself: flushing logs, interpreter teardown);
            at most a quarter of the grace.
    """

    def __init__(self, grace_s: float, *, margin_s: float = 1.0) -> None:
        self.grace_s = grace_s
        self.margin_s = min(margin_s, grace_s / 4)
        self.received_at: float | None = None
        self.signal_name = ""
        self._event = threading.Event()
        self._interrupt = False
        self._acknowledged = threading.Event()

    @classmethod
    def from_env(cls) -> PreemptionNotice:
        """A notice whose grace is :data:`GRACE_ENV` (:func:`grace_from_env`)."""
        return cls(grace_from_env())

    def install(self, signals: tuple[int, ...] = (signal.SIGTERM,), *, interrupt: bool = False) -> PreemptionNotice:
        """Record ``signals`` from now on instead of dying of them; with ``interrupt``, the first
        one also raises :class:`PreemptionInterrupt` in the main thread, again every :data:`REDELIVER_S` until
        :meth:`acknowledge` (a raise that lands in a destructor is dropped). Outside the main thread (a job run
        in-process by another program) nothing is installed: the notice never comes. Returns self."""
        if threading.current_thread() is not threading.main_thread():
            return self  # a job run in a thread of another program (the lab): its signals are not ours
        self._interrupt = interrupt
        for sig in signals:
            signal.signal(sig, self._handler)
        return self

    def _handler(self, signum: int, frame: object) -> None:
        first = self.received_at is None
        self.notify(signal.Signals(signum).name)
        if not self._interrupt or self._acknowledged.is_set():
            return
        if first:  # a raise that lands in a destructor is only printed: re-deliver until the job acknowledges it
            threading.Thread(target=self._redeliver, args=(signum,), name="preemption-redeliver", daemon=True).start()
        elif isinstance(sys.exc_info()[1], PreemptionInterrupt):
            return  # the first one is propagating (a commit thread being waited for on the way out): let it
        raise PreemptionInterrupt(self.signal_name)

    def _redeliver(self, signum: int) -> None:
        while not self._acknowledged.wait(REDELIVER_S):
            signal.pthread_kill(threading.main_thread().ident, signum)

    def acknowledge(self) -> None:
        """The job caught :class:`PreemptionInterrupt` and is stopping: no further raise, no re-delivery."""
        self._acknowledged.set()

    def stop_interrupting(self) -> None:
        """From now on only record the notice: the job has reached work it stops at its own safe points (a train
        job's update loop). A notice that came before is kept (:attr:`requested`)."""
        self._interrupt = False
        self._acknowledged.set()

    def notify(self, name: str = "SIGTERM") -> None:
        """Record a notice now (the signal handler calls it; the first one counts)."""
        if self.received_at is None:
            self.received_at, self.signal_name = time.monotonic(), name
            self._event.set()

    @property
    def requested(self) -> bool:
        """Whether a notice came."""
        return self._event.is_set()

    def left_s(self) -> float:
        """Seconds left to plan on: to the SIGKILL less the margin (the whole grace before a notice came)."""
        if self.received_at is None:
            return self.grace_s - self.margin_s
        return self.received_at + self.grace_s - self.margin_s - time.monotonic()

    def fits(self, predicted_s: float | None) -> Fit:
        """Whether work of ``predicted_s`` seconds ends in :meth:`left_s` (unknown: tried, since a commit cut off by
        the SIGKILL leaves only temporary files)."""
        left = self.left_s()
        return Fit(predicted_s is None or predicted_s <= left, predicted_s, left)
