"""Facts about a process of this machine, by pid (Linux ``/proc``; portable where it can be)."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """Whether ``pid`` names a process (signal 0: a process of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name: ``[state, ppid, pgrp, ...]`` (``proc(5)``: field 3
    onwards; the start time in clock ticks since boot is index 19); None if the process does not exist or ``/proc``
    is not there."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()
