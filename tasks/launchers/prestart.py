"""Subprocess jobs started ahead (pre-started) until a run follows them: the table of them, the one thread that
starts them, stopping those no run followed, and their priority while they wait (autogroup and nice values)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import threading
from collections.abc import Callable, Mapping

from tasks.launchers.processes import _LIVE_GROUPS, _LIVE_LOCK, _JobProcess, _signal_group

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
