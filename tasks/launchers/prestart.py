"""Subprocess jobs started ahead (pre-started): stopping those no run followed, and their priority while they wait
(autogroup and nice values). The table of them is :class:`tasks.launchers.processes.ProcessTable`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

from tasks.launchers.processes import PROCESSES


def discard_prestarted(labels: Mapping[str, str] | None = None) -> int:
    """Stop this process's pre-started subprocess jobs not followed yet whose labels include ``labels`` (all when
    None): SIGTERM, SIGKILL after 10 s; returns how many
    (:meth:`tasks.launchers.processes.ProcessTable.discard_prestarted`)."""
    return PROCESSES.discard_prestarted(labels)


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
