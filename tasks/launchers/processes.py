"""The processes of subprocess jobs: each job's process group (killed at interpreter exit), the thread moving its
output lines to a queue, and the kernel's parent-death signal that stops a job when the flow process dies."""

from __future__ import annotations

import atexit
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from tasks import forkserver
from tasks.launchers.protocol import clip_line
from tasks.launchers.request import JobRequest

# --------------------------------------------------------------------------------------------------- subprocess
_EOF = object()
#: Process groups of running subprocess jobs; killed at interpreter exit so a dying flow leaves no job behind.
_LIVE_GROUPS: set[int] = set()
_LIVE_LOCK = threading.Lock()
#: Set once this process is stopping (Ctrl-C, SIGTERM: :mod:`tasks.stops`): the launcher starts no new job.
STOPPING = threading.Event()


def _kill_live_groups() -> None:
    with _LIVE_LOCK:
        groups = list(_LIVE_GROUPS)
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)


atexit.register(_kill_live_groups)
atexit.register(forkserver.close_servers)


def live_groups() -> list[int]:
    """The process groups of the subprocess jobs of this process that run or wait (pre-started)."""
    with _LIVE_LOCK:
        return sorted(_LIVE_GROUPS)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when no process of the group is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def _pump(stream: IO[str], lines: queue.Queue) -> None:
    """Reader thread: move output lines of the job to ``lines`` until EOF (every writer of the pipe is gone)."""
    try:
        for line in stream:
            lines.put(clip_line(line))
    except (OSError, ValueError):  # the pipe was closed under us after a kill
        pass
    finally:
        lines.put(_EOF)


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL the job when the thread that started it ends (Linux
    ``prctl(PR_SET_PDEATHSIG)``). The launcher waits for the job in that thread, so this fires when the flow
    process dies, even by SIGKILL: a dead flow cannot leave a job running. None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded in the parent: the child only makes one foreign call
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(137)

    return preexec


@dataclass
class _JobProcess:
    """A job's process (leader of its own process group) and the thread moving its output lines to a queue."""

    request: JobRequest
    proc: subprocess.Popen
    lines: queue.Queue
    niced: bool = False

    @property
    def pgid(self) -> int:
        return self.proc.pid
