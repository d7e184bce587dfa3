"""The process tree of a local run, by role, and SIGKILL of one role (the chaos harness's victims).

A local ``mugrpo run`` is one flow process (Prefect flows run in it); each job is a child process in its own session
(``tasks/launchers/subprocess_launcher.py``: ``python -m mugrpo.jobs.{generate,train,eval,segment}``), and each
job's verifier pool (``mugrpo/rewards/pool.py``) is a set of ``multiprocessing`` workers under the job (spawned, or
forked from the job's ``multiprocessing`` forkserver). Jobs may be forked from the job fork server
(``mugrpo.jobs.forkserver``): their command line still names their module (setproctitle). Roles are read from
``/proc`` (Linux): no psutil needed for parent links and command lines.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["JOB_ROLES", "ROLES", "Proc", "alive", "cmdline", "kill", "process_tree", "wait_gone"]

#: Job modules a flow launches, by role.
JOB_ROLES = ("generate", "train", "eval", "segment")
#: Every role a victim can have: the flow process, a job, a verifier worker, or the whole tree.
ROLES = ("flow", *JOB_ROLES, "verifier", "tree")


@dataclass(frozen=True)
class Proc:
    """One live process of the tree: pid, parent pid, role (one of :data:`ROLES` but ``"tree"``, or ``"other"``)."""

    pid: int
    ppid: int
    role: str


def _stat_ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # a zombie (or a task being reaped) is dead already
        return None
    return int(fields[1])


def cmdline(pid: int) -> list[str]:
    """The command line of ``pid`` as a list of arguments ([] when it is gone). A job forked from the job fork
    server shows its command as one space-separated string (setproctitle): it is split on spaces."""
    try:
        argv = [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []
    return argv[0].split() if len(argv) == 1 else argv


#: The role of a job's ``multiprocessing`` forkserver (the verifier pool's, ``reward.start_method: forkserver``):
#: the workers are its children. Not a victim role: it serves only the starts of new workers.
_VERIFIER_FORKSERVER = "verifier-forkserver"


def _role(pid: int, root: int, parent_role: str | None) -> str:
    if pid == root:
        return "flow"
    argv = cmdline(pid)
    for job in JOB_ROLES:
        if f"mugrpo.jobs.{job}" in argv:
            return job
    joined = " ".join(argv)
    if "multiprocessing" not in joined or "resource_tracker" in joined:
        return "other"
    if parent_role in JOB_ROLES:  # a spawned worker, or the forkserver the workers are forked from
        return _VERIFIER_FORKSERVER if "multiprocessing.forkserver" in joined else "verifier"
    if parent_role == _VERIFIER_FORKSERVER:
        return "verifier"
    return "other"


def process_tree(root: int) -> list[Proc]:
    """``root`` (the flow process) and its live descendants, parents before children.

    Returns [] when ``root`` is gone.
    """
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = _stat_ppid(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    if _stat_ppid(root) is None:
        return []
    out = [Proc(root, -1, "flow")]
    todo = [out[0]]
    while todo:
        parent = todo.pop(0)
        for pid in sorted(children.get(parent.pid, [])):
            proc = Proc(pid, parent.pid, _role(pid, root, parent.role))
            out.append(proc)
            todo.append(proc)
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    return _stat_ppid(pid) is not None


def wait_gone(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    """Wait up to ``timeout_s`` for every pid to be gone (the last processes of a killed group are reaped by init a
    moment later); returns those still alive then."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def kill(pids: list[int]) -> list[int]:
    """SIGKILL each pid (parents first, as given); returns those that were alive to receive it."""
    hit = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            hit.append(pid)
        except ProcessLookupError:
            pass
    return hit
