"""Committed policy folders on local disk: the folder itself on a local store, else a verified cached download."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from mugrpo.storage import COMPLETE_MARKER, Store


def local_policy_dir(store: Store, rel: str) -> Path:
    """A local folder holding the committed HF policy at ``rel``: the folder itself on a local store, else a
    verified download into a cache folder keyed by the store URL and path.

    ``rel`` is a committed HF dir (``policies/stage=k``) or a committed training checkpoint
    (``checkpoints/stage=k/step=n``), whose ``model/`` subfolder is then returned: the behavior policy of a stage
    whose policy was not published (``orchestration.publish_policy_every > 1``).

    Raises:
        FileNotFoundError: the policy folder was never committed (no ``_COMPLETE`` marker).
        mugrpo.storage.ChecksumError: a file of it differs from its marker's sha256 (names the file).
    """
    if not store.is_complete_dir(rel):
        raise FileNotFoundError(f"policy {store.uri(rel)} is not committed (no _COMPLETE marker)")
    local = store.local_path(rel)
    if local is not None:
        verify_committed_dir(store, rel)
    else:
        cache_root = Path(os.environ.get("MUGRPO_CACHE", Path(tempfile.gettempdir()) / "mugrpo-cache"))
        key = hashlib.sha256(store.uri(rel).encode()).hexdigest()[:16]
        local = cache_root / key
        if not (local / ".verified").exists():
            store.download_dir(rel, local)
            (local / ".verified").touch()
    if not (local / "config.json").exists() and (local / "model" / "config.json").exists():
        return local / "model"  # a training checkpoint: its HF policy dir
    return local


def verify_committed_dir(store: Store, rel: str) -> None:
    """Re-hash (streamed) every file of the committed folder ``rel`` against its ``_COMPLETE`` marker.

    Raises:
        mugrpo.storage.ChecksumError: names the first file that differs.
        FileNotFoundError: a listed file is missing.
    """
    for name, digest in store.read_json(f"{rel}/{COMPLETE_MARKER}")["files"].items():
        store.verify_file(f"{rel}/{name}", digest)
