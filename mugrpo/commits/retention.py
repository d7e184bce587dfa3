"""Retention of the AdamW moments of committed checkpoints (``train.keep_optimizer_state``, docs/branching.md,
"Retention").

A checkpoint's optimizer state (:data:`OPTIMIZER_FILE`, two fp32 moments per trainable parameter) is by far its
largest file and is read at two moments only: when the stage's training resumes from that checkpoint, and when the
next stage starts from the stage's final checkpoint (or a fork of the run at the next stage does). Once later stages
have committed, the moments of older stages serve only a rollback or a fork there, so a run may delete them.

Pruning keeps the checkpoint committed and verifiable. Its ``_COMPLETE`` marker is rewritten first, without the
pruned file in ``files`` and with a ``pruned`` record of it::

    {"files": {...}, "pruned": {"optimizer.pt": {"sha256": ..., "bytes": ...,
                                                 "reason": "train.keep_optimizer_state=last", "pruned_at": ...}}, ...}

and only then is the file deleted, so a prune interrupted between the two leaves an extra file that no marker lists
(never a listed file that is missing, which ``mugrpo verify`` would call corrupted); the next prune deletes it. A
reader that needs the moments finds the record and raises :class:`OptimizerStatePruned`, naming the key.
"""

from __future__ import annotations

import posixpath
from datetime import UTC, datetime
from typing import Any

from mugrpo.storage.store import COMPLETE_MARKER, Store

#: The AdamW state dict of a checkpoint (:mod:`mugrpo.trainer.checkpoint`).
OPTIMIZER_FILE = "optimizer.pt"
#: The files of a checkpoint that hold optimizer state (one full state dict, also under FSDP).
OPTIMIZER_FILES = (OPTIMIZER_FILE,)
#: The config key that sets the retention.
KEY = "train.keep_optimizer_state"
#: ``auto`` keeps every stage's moments while one checkpoint's optimizer state is below this many bytes (a
#: 1B-parameter fp32 AdamW state is ~8 GB), else the last committed stage's only.
AUTO_KEEP_ALL_BELOW = 4 * 2**30


class OptimizerStatePruned(RuntimeError):
    """The optimizer state a reader needs was pruned by ``train.keep_optimizer_state``; the message names the
    checkpoint, the key and the way out."""


def kept_stages(setting: int | str, optimizer_bytes: int | None) -> int | None:
    """How many of the latest committed stages keep the moments of their checkpoints under ``setting`` (the value of
    ``train.keep_optimizer_state``); None: every stage. ``optimizer_bytes``: the bytes of one checkpoint's optimizer
    state, which ``auto`` decides by (:data:`AUTO_KEEP_ALL_BELOW`); None (nothing measured yet) keeps all."""
    if setting == "all":
        return None
    if setting == "last":
        return 1
    if setting == "auto":
        return None if optimizer_bytes is None or optimizer_bytes < AUTO_KEEP_ALL_BELOW else 1
    return int(setting)


def describe(setting: int | str, optimizer_bytes: int | None) -> str:
    """``train.keep_optimizer_state=auto (last: 8.6 GB of optimizer state per checkpoint, >= 4 GiB)`` and the like:
    the setting and, for ``auto``, what it resolved to and why (bytes in decimal units)."""
    text = f"{KEY}={setting}"
    if setting != "auto":
        return text
    keep = kept_stages(setting, optimizer_bytes)
    if optimizer_bytes is None:
        return f"{text} (all: no optimizer state measured yet)"
    size = f"{optimizer_bytes / 1e9:.2f} GB of optimizer state per checkpoint"
    return f"{text} ({'all' if keep is None else 'last'}: {size}, {'<' if keep is None else '>='} 4 GiB)"


def _marker(rel: str) -> str:
    return posixpath.join(rel, COMPLETE_MARKER)


def pruned_record(store: Store, rel: str) -> dict[str, Any]:
    """``{file name: record}`` of the files pruned from the committed folder ``rel`` (its marker's ``pruned``);
    {} when nothing was, or when ``rel`` is not committed."""
    if not store.is_complete_dir(rel):
        return {}
    return dict(store.read_json(_marker(rel)).get("pruned") or {})


def optimizer_pruned(store: Store, rel: str) -> dict[str, Any] | None:
    """The ``pruned`` record of the optimizer state of the committed checkpoint ``rel``, or None when it holds it
    (or is not committed)."""
    return pruned_record(store, rel).get(OPTIMIZER_FILE)


def prune_optimizer_state(store: Store, rel: str, reason: str) -> list[str]:
    """Delete the optimizer state of the committed checkpoint ``rel``, keeping it committed: the marker is rewritten
    first (module docstring), then the file is deleted. Idempotent: a file a previous, interrupted call recorded but
    did not delete is deleted now. Returns the names newly recorded as pruned.

    Raises:
        FileNotFoundError: ``rel`` is not a committed folder.
        mugrpo.coordination.lease.LeaseFenced: this writer does not hold the run lease (the store's guard).
    """
    if not store.is_complete_dir(rel):
        raise FileNotFoundError(f"{store.uri(rel)} is not a committed checkpoint")
    marker = store.read_json(_marker(rel))
    files, pruned = dict(marker["files"]), dict(marker.get("pruned") or {})
    doomed = [name for name in OPTIMIZER_FILES if name in files]
    if doomed:
        at = datetime.now(UTC).isoformat()
        for name in doomed:
            path = posixpath.join(rel, name)
            size = store.size(path) if store.exists(path) else None
            pruned[name] = {"sha256": files.pop(name), "bytes": size, "reason": reason, "pruned_at": at}
        store.write_json(_marker(rel), {**marker, "files": files, "pruned": pruned})
    for name in pruned:
        if name not in files:
            store.delete(posixpath.join(rel, name))  # a no-op when it is gone already
    return doomed


def refuse_pruned(store: Store, rel: str, what: str) -> None:
    """Raise :class:`OptimizerStatePruned` when the optimizer state of the committed checkpoint ``rel`` was pruned;
    ``what``: what needs it (e.g. ``train stage 3 starts from them``).

    Raises:
        OptimizerStatePruned: names the checkpoint, the reason recorded (the key and its value) and the ways out.
    """
    record = optimizer_pruned(store, rel)
    if record is None:
        return
    raise OptimizerStatePruned(
        f"the AdamW moments of checkpoint {store.uri(rel)} ({OPTIMIZER_FILE}) were pruned "
        f"({record.get('reason', KEY)}, recorded in its {COMPLETE_MARKER} marker at {record.get('pruned_at', '?')}), "
        f"and {what}. Start that stage "
        "from fresh moments with `mugrpo fork RUN --at-stage K --id NEW --fresh-optimizer` (recorded in the fork's "
        f"run.json), or restore {OPTIMIZER_FILE} (sha256 {record.get('sha256')}) and its line in the marker's "
        f'"files". Set {KEY}=all (or a larger N) to keep the moments a rollback or a fork needs.'
    )
