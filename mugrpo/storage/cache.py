"""The machine's policy cache (``$MUGRPO_CACHE/policies``, default ``<temp dir>/mugrpo-cache/policies``): policy
folders downloaded from a remote store and LoRA adapters merged into their base, kept between jobs so that a
stage's generation, training and evaluation jobs fetch or merge each policy once.

Bounded: each entry is a folder with a marker file (its last use is the marker's mtime); whenever an entry is added
the least recently used entries go until the cache holds at most ``MUGRPO_CACHE_GB`` (default
:data:`DEFAULT_BUDGET_GB`) — never an entry a live process uses. A process that is handed an entry holds a shared
``flock`` on the entry's lock file until it exits (jobs are one process each, and load the policy they are handed
at any point of their life); eviction takes the lock exclusively without waiting and skips the entry when it cannot,
so the cache may stay above its budget by the entries in use. The kernel drops a dead process's locks, SIGKILL
included. The lock is advisory and local: the cache belongs to one machine (on Kubernetes, to one pod).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from mugrpo.common.scratch import scratch_dir

#: Cache budget when ``MUGRPO_CACHE_GB`` is not set: ~19 full SmolLM2-135M policies, or what one 7B policy in bf16
#: needs while the previous one is in use.
DEFAULT_BUDGET_GB = 32.0
LOCK_NAME = ".in-use.lock"
#: Marker of a complete entry; its mtime is the entry's last use.
COMPLETE = ".complete"

#: Open lock files of the entries this process was handed (their shared locks live as long as the process).
_held: dict[Path, int] = {}


def machine_cache_dir() -> Path:
    """The machine's cache folder: ``MUGRPO_CACHE``, else ``<temp dir>/mugrpo-cache`` (not created here). It holds
    one folder per cache: the policy cache (:func:`cache_root`) and the model-config verdicts
    (:mod:`mugrpo.provenance.fingerprint`); with ``MUGRPO_CACHE`` set, infra/vllm_venv.py's environments too."""
    return Path(os.environ.get("MUGRPO_CACHE") or Path(tempfile.gettempdir()) / "mugrpo-cache")


def cache_root() -> Path:
    """The policy cache's folder: ``policies/`` under :func:`machine_cache_dir` (not created here). Its own folder,
    as the machine's cache folder also holds other caches that eviction must never touch."""
    return machine_cache_dir() / "policies"


def budget_bytes() -> int:
    """The cache's budget in bytes, from ``MUGRPO_CACHE_GB`` (GiB, a float; default :data:`DEFAULT_BUDGET_GB`).

    Raises:
        ValueError: ``MUGRPO_CACHE_GB`` is not a number >= 0 (the message names the variable and its value).
    """
    raw = os.environ.get("MUGRPO_CACHE_GB", "")
    try:
        gb = float(raw) if raw.strip() else DEFAULT_BUDGET_GB
    except ValueError:
        gb = -1.0
    if not gb >= 0:
        raise ValueError(f"MUGRPO_CACHE_GB={raw!r}: expected a size in GiB >= 0, e.g. MUGRPO_CACHE_GB=32")
    return int(gb * 1024**3)


def cached(name: str, build: Callable[[Path], object], *, root: Path | None = None) -> Path:
    """The cache entry ``name``: the folder itself when it is complete, else built now by ``build(folder)`` into a
    temporary folder of the cache, marked complete and renamed into place (atomic: a concurrent builder's copy
    either wins or is dropped), then the cache is brought back within its budget (:func:`evict`). The entry is held
    for the life of this process (see the module docstring) and its last use recorded.

    Raises:
        whatever ``build`` raises (its temporary folder is removed);
        ValueError: a malformed ``MUGRPO_CACHE_GB``;
        OSError: the cache folder cannot be written.
    """
    root = cache_root() if root is None else Path(root)
    entry = root / name
    for _ in range(3):  # a miss, built, then evicted by another process before we held it: build again
        hit = _hold(entry)
        if hit is not None:
            return hit
        root.mkdir(parents=True, exist_ok=True)
        tmp = scratch_dir("cache-build", parent=root)  # a killed build's folder is swept by the next one
        try:
            build(tmp)
            (tmp / COMPLETE).touch()
            if entry.exists() and not (entry / COMPLETE).exists():
                _remove(entry)  # a folder at the entry's name that this cache never completed (put there by hand)
            try:
                os.replace(tmp, entry)
            except OSError:  # a concurrent build landed first: use that one
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        hit = _hold(entry)
        if hit is not None:
            evict(root=root)
            return hit
    raise OSError(f"cache entry {entry} was removed three times while being built: is MUGRPO_CACHE_GB too small?")


def _hold(entry: Path) -> Path | None:
    """``entry`` if it is complete, held with a shared lock for this process's life and its last use recorded; None
    on a miss (absent, incomplete, or evicted while we waited for the lock)."""
    if entry in _held:
        with contextlib.suppress(OSError):
            os.utime(entry / COMPLETE)
        if (entry / COMPLETE).exists():
            return entry
        os.close(_held.pop(entry))
    if not (entry / COMPLETE).exists():
        return None
    try:
        fd = _open_lock(entry)
    except OSError:  # renamed away by an eviction since the check
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)  # an eviction holds the lock exclusively only while it renames the entry away
    try:
        same = os.fstat(fd).st_ino == os.stat(entry / LOCK_NAME).st_ino and (entry / COMPLETE).exists()
    except OSError:
        same = False
    if not same:
        os.close(fd)
        return None
    _held[entry] = fd
    with contextlib.suppress(OSError):
        os.utime(entry / COMPLETE)
    return entry


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under ``folder`` (0 for a folder that vanished meanwhile)."""
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def _last_use(entry: Path) -> float:
    """When ``entry`` was last handed out: its marker's mtime."""
    return (entry / COMPLETE).stat().st_mtime


def evict(budget: int | None = None, root: Path | None = None) -> list[Path]:
    """Remove the least recently used entries of the cache until it holds at most ``budget`` bytes (default
    :func:`budget_bytes`), skipping the entries a live process holds (see the module docstring) and the folders
    being built; returns the removed entries, least recently used first.

    Raises:
        ValueError: a malformed ``MUGRPO_CACHE_GB`` (when ``budget`` is not given).
    """
    budget = budget_bytes() if budget is None else budget
    root = cache_root() if root is None else Path(root)
    sized = []
    try:
        for entry in root.iterdir():
            # entries only: not the scratch folders of builds and evictions, nor a folder cached() never made
            if entry.is_dir() and not entry.name.startswith((".", "mugrpo-")) and (entry / COMPLETE).exists():
                with contextlib.suppress(OSError):
                    sized.append((_last_use(entry), entry, folder_bytes(entry)))
    except OSError:
        return []
    total = sum(size for _, _, size in sized)
    removed = []
    for _, entry, size in sorted(sized, key=lambda item: item[0]):
        if total <= budget:
            break
        if entry not in _held and _remove(entry):
            total -= size
            removed.append(entry)
    return removed


def _remove(entry: Path) -> bool:
    """Remove ``entry`` unless a live process holds it: take its lock exclusively without waiting, rename the entry
    away while holding it (a process that looks it up from then on misses it and builds it anew), then delete.
    True if it was removed."""
    try:
        fd = _open_lock(entry)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        doomed = scratch_dir("cache-evict", parent=entry.parent)  # swept by the next one if we are killed now
        try:
            os.replace(entry, doomed / entry.name)
        except OSError:
            shutil.rmtree(doomed, ignore_errors=True)
            return False
    finally:
        os.close(fd)
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def _open_lock(entry: Path) -> int:
    """A descriptor of ``entry``'s lock file, created if missing (not inherited by exec'd children)."""
    return os.open(entry / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
