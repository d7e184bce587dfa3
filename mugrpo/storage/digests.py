"""What a store can say about a committed file's content without reading its bytes.

Resume checks the files of earlier stages by this (:mod:`mugrpo.commits.verify`, quick mode), so a start's cost
follows what it builds on, not how long the run has been going:

- **S3**: every object sent in one ``PutObject`` carries the store's own SHA-256 checksum
  (``ChecksumAlgorithm=SHA256``: S3 computes and keeps it; a ``HeadObject`` with ``ChecksumMode=ENABLED`` returns
  it), which *is* the sha256 a manifest records. A multipart object's checksum is one of its parts (S3 "composite"
  checksums), so for those the committing ``_COMPLETE`` marker records the object's ETag and size at commit, and a
  HEAD compares them (any replacement of the object changes its ETag).
- **Local folders**: a hash cache (:class:`DigestCache`, SQLite beside the user's caches) keyed by path, size,
  modification time (ns), inode and device: filled by every write of the store and every full hash, consulted by
  the quick check. A rewrite, a copy or a move changes the key, and the file is hashed again. What no key shows (a
  bit flipped in place by the medium, a write that restores the mtime) is left to the full ``mugrpo verify``.

Every read of file bytes through a :class:`mugrpo.storage.store.Store` may be logged (:func:`log_read`,
``MUGRPO_READ_LOG``): tests and ``bench/resume_scale.py`` count the bytes a start reads through it.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: Where the local hash cache lives (default: ``$XDG_CACHE_HOME/mugrpo/digests.sqlite``, ``~/.cache`` without it);
#: ``off`` disables it (every quick check of a local file then hashes it).
DIGEST_CACHE_ENV = "MUGRPO_DIGEST_CACHE"
#: With this set to a file path, every read of file bytes through a Store appends ``URI<TAB>BYTES`` to it.
READ_LOG_ENV = "MUGRPO_READ_LOG"


@dataclass(frozen=True)
class StoredObject:
    """What the store says about one object without reading it.

    Attributes:
        size: bytes.
        sha256: hex sha256 of the content when the store vouches for it (S3's full-object SHA-256 checksum of a
            single-PUT object; a local hash-cache hit), else None.
        version: the object's identity as the store keeps it: the ETag on S3; ``size:mtime_ns:inode:device`` locally.
        multipart: (S3) the object was uploaded in parts: its checksum is not the content's sha256.
    """

    size: int
    sha256: str | None
    version: str
    multipart: bool = False


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_from_s3_checksum(checksum: str | None) -> str | None:
    """The hex sha256 of a full-object ``ChecksumSHA256`` header value (base64 of 32 bytes), or None for a missing
    or composite one (``...-N``)."""
    if not checksum or "-" in checksum:
        return None
    try:
        raw = base64.b64decode(checksum, validate=True)
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None


def local_version(st: os.stat_result) -> str:
    """The key a local file's cached digest is valid for: size, modification time (ns), inode, device."""
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_dev}"


def _default_path() -> Path | None:
    where = os.environ.get(DIGEST_CACHE_ENV)
    if where == "off":
        return None
    if where:
        return Path(where)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mugrpo" / "digests.sqlite"


class DigestCache:
    """A local file's sha256 keyed by (absolute path, :func:`local_version`): the local half of the quick check.

    One SQLite file shared by every process of the machine (WAL journal, short transactions). The cache is an
    accelerator only: any error opening or writing it disables it for the process with one warning, and a check
    then hashes the file instead.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._broken = path is None
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection | None:
        if self._broken:
            return None
        if self._conn is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS digests (path TEXT PRIMARY KEY, version TEXT NOT NULL, "
                    "sha256 TEXT NOT NULL)"
                )
                self._conn = conn
            except (OSError, sqlite3.Error) as e:
                self._disable(e)
        return self._conn

    def _disable(self, e: BaseException) -> None:
        self._broken, self._conn = True, None
        log.warning("local hash cache %s disabled (%s): quick checks hash local files instead", self.path, e)

    def lookup(self, path: str, version: str) -> str | None:
        """The cached sha256 of ``path`` if it was recorded for this ``version``, else None."""
        with self._lock:
            conn = self._connect()
            if conn is None:
                return None
            try:
                row = conn.execute("SELECT version, sha256 FROM digests WHERE path = ?", (path,)).fetchone()
            except sqlite3.Error as e:
                self._disable(e)
                return None
        return row[1] if row is not None and row[0] == version else None

    def record(self, path: str, version: str, sha256: str) -> None:
        """Remember that ``path`` at ``version`` holds bytes with this sha256."""
        with self._lock:
            conn = self._connect()
            if conn is None:
                return
            try:
                conn.execute(
                    "INSERT OR REPLACE INTO digests (path, version, sha256) VALUES (?, ?, ?)", (path, version, sha256)
                )
            except sqlite3.Error as e:
                self._disable(e)


_CACHES: dict[Path | None, DigestCache] = {}


def digest_cache() -> DigestCache:
    """This process's :class:`DigestCache` at the configured place (:data:`DIGEST_CACHE_ENV`)."""
    path = _default_path()
    if path not in _CACHES:
        _CACHES[path] = DigestCache(path)
    return _CACHES[path]


def local_file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of the local file at ``path``: from the hash cache (:class:`DigestCache`) when it was recorded for
    the file's current version (size, mtime, inode, device: :func:`local_version`), else read (streamed, 1 MiB at a
    time) and recorded, when the file did not change while it was read.

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    path = os.path.abspath(path)
    version = local_version(os.stat(path))
    cached = digest_cache().lookup(path, version)
    if cached is not None:
        return cached
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if local_version(os.stat(path)) == version:
        digest_cache().record(path, version, digest.hexdigest())
    return digest.hexdigest()


def log_read(uri: str, nbytes: int) -> None:
    """Append one read of ``nbytes`` bytes of ``uri`` to the read log, when :data:`READ_LOG_ENV` names one."""
    where = os.environ.get(READ_LOG_ENV)
    if where:
        with open(where, "a") as f:
            f.write(f"{uri}\t{nbytes}\n")


def read_log(path: str | os.PathLike) -> dict[str, int]:
    """{URI: bytes read} summed over a read log :func:`log_read` wrote ({} when there is none)."""
    out: dict[str, int] = {}
    if os.path.exists(path):
        for line in Path(path).read_text().splitlines():
            uri, n = line.rsplit("\t", 1)
            out[uri] = out.get(uri, 0) + int(n)
    return out
