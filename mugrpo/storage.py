"""Object storage: any fsspec URL (a local folder by default, ``s3://bucket/prefix`` through s3fs).

Writes are atomic: on a local filesystem a file is written under a temporary name in the same folder, fsynced, then
renamed; on object stores the whole object is sent in one PUT, which S3 makes visible all at once. A reader therefore
never sees part of a file. Folders (model dirs, checkpoints) are committed by writing every file and then a
``_COMPLETE`` marker last; a folder without its marker is ignored and may be overwritten.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import uuid
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

COMPLETE_MARKER = "_COMPLETE"
TMP_TAG = ".tmp-"


def _fault_pause(rel: str) -> None:
    """Fault injection for crash tests: with ``MUGRPO_FAULT_PAUSE="SUBSTRING:SECONDS"`` set, a write whose path
    contains SUBSTRING pauses between writing its temporary file and the rename, so a test can SIGKILL the process
    in the middle of a commit. Unset (always, outside tests), this does nothing.
    """
    spec = os.environ.get("MUGRPO_FAULT_PAUSE")
    if not spec:
        return
    needle, _, seconds = spec.rpartition(":")
    if needle and needle in rel:
        import sys
        import time

        print(f"MUGRPO_FAULT_PAUSE {rel}", file=sys.stderr, flush=True)
        time.sleep(float(seconds))


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


class StorageError(RuntimeError):
    """A storage operation failed; the message names the URL."""


class ChecksumError(StorageError):
    """A file's bytes do not match the sha256 recorded for it."""


class Store:
    """A root URL plus an fsspec filesystem. All paths given to methods are relative to the root.

    Args:
        url: a local path or fsspec URL, e.g. ``runs`` or ``s3://bucket/prefix``.
        storage_options: passed to fsspec (for S3: ``endpoint_url``, ``key``, ``secret``...). Credentials are best
            left to the environment (``AWS_ACCESS_KEY_ID``...); they are never logged.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None):
        self.url = str(url).rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
        self.fs = fs
        self.root = root.rstrip("/") if root != "/" else root
        self.is_local = isinstance(fs, LocalFileSystem)
        if self.is_local:
            Path(self.root).mkdir(parents=True, exist_ok=True)
            self.root = os.path.abspath(self.root)

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    # paths
    def full(self, rel: str) -> str:
        """Filesystem path (without protocol) of ``rel``."""
        return posixpath.join(self.root, rel) if rel else self.root

    def uri(self, rel: str = "") -> str:
        """Full URL of ``rel`` including the protocol (e.g. ``s3://bucket/prefix/run/...``)."""
        full = self.full(rel)
        if self.is_local:
            return full
        protocol = self.fs.protocol[0] if isinstance(self.fs.protocol, (tuple, list)) else self.fs.protocol
        return f"{protocol}://{full}"

    # bytes
    def write_bytes(self, rel: str, data: bytes) -> str:
        """Write ``data`` atomically at ``rel``; returns its sha256. Raises StorageError on failure."""
        path = self.full(rel)
        try:
            if self.is_local:
                folder = os.path.dirname(path)
                os.makedirs(folder, exist_ok=True)
                tmp = os.path.join(folder, f".{os.path.basename(path)}{TMP_TAG}{uuid.uuid4().hex}")
                try:
                    with open(tmp, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    _fault_pause(rel)
                    os.replace(tmp, path)
                except OSError:  # disk full (ENOSPC), file too large (EFBIG)...: leave no partial temporary file
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
            else:
                self.fs.pipe_file(path, data)  # one PUT: all-or-nothing on S3
        except OSError as e:
            raise StorageError(f"could not write {self.uri(rel)}: {e}") from e
        return sha256_bytes(data)

    def read_bytes(self, rel: str, *, expected_sha256: str | None = None) -> bytes:
        """Read ``rel``; with ``expected_sha256``, raise ChecksumError if the bytes differ."""
        try:
            with self.fs.open(self.full(rel), "rb") as f:
                data = f.read()
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{self.uri(rel)} does not exist") from e
        if expected_sha256 is not None:
            actual = sha256_bytes(data)
            if actual != expected_sha256:
                raise ChecksumError(
                    f"checksum mismatch for {self.uri(rel)}: manifest says sha256 {expected_sha256}, "
                    f"file has {actual}. The file was changed or corrupted after it was committed."
                )
        return data

    def write_json(self, rel: str, obj: Any) -> str:
        return self.write_bytes(rel, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())

    def read_json(self, rel: str) -> Any:
        data = self.read_bytes(rel)
        try:
            return json.loads(data)
        except json.JSONDecodeError as e:
            raise StorageError(f"{self.uri(rel)} is not valid JSON: {e}") from e

    # queries
    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.full(rel))

    def listdir(self, rel: str) -> list[str]:
        """Names (not paths) directly under ``rel``, sorted; [] if it does not exist. Temporary files are hidden."""
        try:
            entries = self.fs.ls(self.full(rel), detail=False)
        except FileNotFoundError:
            return []
        names = sorted({posixpath.basename(e.rstrip("/")) for e in entries})
        return [n for n in names if TMP_TAG not in n]

    def size(self, rel: str) -> int:
        return int(self.fs.size(self.full(rel)))

    def delete(self, rel: str, *, recursive: bool = False) -> None:
        if self.exists(rel):
            self.fs.rm(self.full(rel), recursive=recursive)

    def invalidate_cache(self) -> None:
        self.fs.invalidate_cache()

    # folders
    def is_complete_dir(self, rel: str) -> bool:
        """True if the folder ``rel`` was committed (its ``_COMPLETE`` marker exists)."""
        return self.exists(posixpath.join(rel, COMPLETE_MARKER))

    def upload_dir(self, local_dir: str | os.PathLike, rel: str, *, meta: dict | None = None) -> dict[str, str]:
        """Copy a local folder to ``rel`` file by file (each atomic), then write the ``_COMPLETE`` marker.

        Returns {relative file name: sha256}. The marker holds the checksums, so :meth:`download_dir` verifies them.
        """
        local_dir = Path(local_dir)
        sums: dict[str, str] = {}
        for p in sorted(local_dir.rglob("*")):
            if p.is_file():
                name = p.relative_to(local_dir).as_posix()
                sums[name] = self.write_bytes(posixpath.join(rel, name), p.read_bytes())
        self.write_json(posixpath.join(rel, COMPLETE_MARKER), {"files": sums, **(meta or {})})
        return sums

    def download_dir(self, rel: str, local_dir: str | os.PathLike) -> Path:
        """Copy a committed folder to ``local_dir``, verifying every file against the marker's checksums.

        Raises FileNotFoundError if the folder was not committed, ChecksumError on a mismatch.
        """
        if not self.is_complete_dir(rel):
            raise FileNotFoundError(f"{self.uri(rel)} is not a committed folder (no {COMPLETE_MARKER} marker)")
        marker = self.read_json(posixpath.join(rel, COMPLETE_MARKER))
        local_dir = Path(local_dir)
        for name, digest in marker["files"].items():
            data = self.read_bytes(posixpath.join(rel, name), expected_sha256=digest)
            dest = local_dir / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        return local_dir

    def local_path(self, rel: str) -> Path | None:
        """The local filesystem path of ``rel`` when the store is local, else None (then download it)."""
        return Path(self.full(rel)) if self.is_local else None
