"""Local scratch folders (a checkpoint staged before upload, a trainer's work folder, a policy being published) that a
killed process does not leave behind for good.

A scratch folder is removed by its own process when the work ends (``finally``), but a SIGKILL, the OOM killer or a
stop past its grace skips that, and a full fine-tuning checkpoint stages its optimizer state here (twice the policy's
fp32 size: ~1 GB for a 135M model, ~56 GB for 7B). Each folder's name therefore carries its process's pid and pid
namespace (``mugrpo-ckpt-n4026531836p4242-x1y2``); creating a scratch folder first removes the folders of the same
temp dir whose process is gone. Only folders of this process's pid namespace are swept (another container sharing
the temp dir counts its pids in its own namespace), and a pid that was reused keeps its folder until that process
ends too: the sweep never removes a live process's folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mugrpo.common.processes import process_alive

#: ``mugrpo-<kind>-n<pid namespace inode>p<pid>-<random>``
_NAME = re.compile(r"^mugrpo-(?P<kind>[A-Za-z0-9_.-]+?)-n(?P<ns>\d+)p(?P<pid>\d+)-")


def _pid_namespace() -> str | None:
    """This process's pid namespace inode (Linux ``/proc/self/ns/pid``: ``pid:[4026531836]``), or None elsewhere."""
    try:
        link = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    digits = re.sub(r"\D", "", link)
    return digits or None


def sweep_orphans(parent: str | Path | None = None) -> list[Path]:
    """Remove the scratch folders under ``parent`` (default: the system temp dir) left by processes of this pid
    namespace that no longer run; returns what was removed. Folders of live processes, of other namespaces and
    anything not named by :func:`scratch_dir` are left alone."""
    ns = _pid_namespace()
    if ns is None:
        return []
    root = Path(parent or tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        match = _NAME.match(entry.name)
        if match is None or match["ns"] != ns or not entry.is_dir(follow_symlinks=False):
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or process_alive(pid):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def scratch_dir(kind: str, *, parent: str | Path | None = None) -> Path:
    """A new empty folder ``mugrpo-<kind>-n<ns>p<pid>-*`` under ``parent`` (default: the system temp dir), made
    after :func:`sweep_orphans` of that parent. The caller removes it (or uses :func:`scratch`).

    Raises:
        OSError: the folder could not be created (a full or read-only temp dir).
    """
    sweep_orphans(parent)
    return Path(tempfile.mkdtemp(prefix=f"mugrpo-{kind}-n{_pid_namespace() or 0}p{os.getpid()}-", dir=parent))


@contextlib.contextmanager
def scratch(kind: str, *, parent: str | Path | None = None) -> Iterator[Path]:
    """:func:`scratch_dir` for a block: removed when the block ends, however it ends short of a kill."""
    path = scratch_dir(kind, parent=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
