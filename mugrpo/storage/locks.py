"""The local store's lock: an exclusive ``flock`` on a hidden lock file, with a bounded wait that names the holder.

A local store (:class:`mugrpo.storage.store.Store`) takes it around its conditional writes (a compare and a rename,
:mod:`mugrpo.storage.conditional`) and the run lease (:mod:`mugrpo.coordination.lease`) around its takeover. It knows
nothing of a store: :meth:`Store.local_lock <mugrpo.storage.store.Store.local_lock>` names the lock file beside an
object and the URL a timeout names, and calls :func:`local_flock`. Holders are read from Linux's ``/proc/locks``
(:func:`describe_flock_holders`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from mugrpo.common.processes import process_stat
from mugrpo.storage.exceptions import StorageError

#: Seconds a local store waits for a lock another process holds (:meth:`Store.local_lock`) before it names the holder
#: and fails: the sections under it (a compare and a rename) take milliseconds. ``MUGRPO_LOCAL_LOCK_WAIT_S``
#: overrides it (a slow network filesystem).
LOCAL_LOCK_WAIT_S = 60.0
LOCAL_LOCK_WAIT_ENV = "MUGRPO_LOCAL_LOCK_WAIT_S"


class LocalLockTimeout(StorageError):
    """A local store's lock stayed held by another process past its wait (:meth:`Store.local_lock`)."""


def describe_flock_holders(lock_path: str) -> str:
    """Who holds a ``flock`` on ``lock_path``: ``"pid 123 (stopped)"`` for each holder listed in Linux's
    ``/proc/locks`` (matched by inode), with the state from ``/proc/PID/stat``; ``"another process"`` where that
    is not readable (another OS, another machine's NFS client)."""
    try:
        inode = os.stat(lock_path).st_ino
        with open("/proc/locks") as f:
            rows = [line.split() for line in f]
    except OSError:
        return "another process"
    states = {
        "R": "running",
        "S": "sleeping",
        "D": "in uninterruptible I/O",
        "T": "stopped",
        "t": "stopped by a tracer",
    }
    holders = []
    for row in rows:
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:131090 0 EOF" (a blocked waiter's row has "->" after the id)
        if "->" in row:  # a process waiting for the lock, not holding it
            continue
        if len(row) >= 6 and row[1] == "FLOCK" and row[5].rsplit(":", 1)[-1] == str(inode):
            pid = row[4]
            if pid == str(os.getpid()):
                holders.append(f"pid {pid} (this process)")
                continue
            fields = process_stat(int(pid))
            state = fields[0] if fields else "?"
            holders.append(f"pid {pid} ({states.get(state, state)})")
    return ", ".join(holders) or "another process"


@contextlib.contextmanager
def local_flock(lock: str, url: str, *, wait_s: float | None = None) -> Iterator[None]:
    """An exclusive ``flock`` on the file ``lock`` (created if missing, with its folder), held for the block.

    Every section held under it is short (a compare and a rename), so a lock still held after ``wait_s``
    (default :data:`LOCAL_LOCK_WAIT_S`, or ``MUGRPO_LOCAL_LOCK_WAIT_S``) belongs to a writer that is frozen
    (SIGSTOP, a paused container) or stuck inside a commit on this machine. Waiting on would hang silently, and
    taking the object without the lock would let that writer's rename land later over what this one commits;
    the wait therefore ends in an error that names the lock's holder (its pid and state, from ``/proc/locks``).

    Args:
        lock: the lock file's path.
        url: the URL of the object it guards, named in the error.

    Raises:
        LocalLockTimeout: the lock was held by another process for ``wait_s`` seconds; nothing was written.
    """
    import fcntl
    import time

    os.makedirs(os.path.dirname(lock), exist_ok=True)
    limit = float(os.environ.get(LOCAL_LOCK_WAIT_ENV) or LOCAL_LOCK_WAIT_S) if wait_s is None else wait_s
    # read-only: flock needs no write access, so a writer of another user (or a read-only root) can still lock
    with os.fdopen(os.open(lock, os.O_RDONLY | os.O_CREAT, 0o644), "rb") as f:
        start, pause = time.monotonic(), 0.001
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited >= limit:
                    raise LocalLockTimeout(
                        f"could not lock {url}: its lock file {lock} has been held for {waited:.0f} s "
                        f"by {describe_flock_holders(lock)}; a commit holds it for milliseconds, so that writer "
                        "is frozen (SIGSTOP, a paused container) or stuck on this machine. Resume or stop it, "
                        "then run the command again; nothing was written"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.1)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
