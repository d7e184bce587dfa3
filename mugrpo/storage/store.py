"""Object storage: any fsspec URL (a local folder by default, ``s3://bucket/prefix`` through s3fs).

Writes are atomic: on a local filesystem a file is written under a temporary name in the same folder, fsynced, then
renamed; on S3 a small object is sent in one PUT and a large one as a multipart upload, and S3 makes either visible
all at once, on the PUT or on ``CompleteMultipartUpload`` (a failed upload is aborted: no object appears). A reader
therefore never sees part of a file. Folders (model dirs, checkpoints) are committed by writing every file and then a
``_COMPLETE`` marker last; a folder without its marker is ignored and may be overwritten.

Bounded memory: files move in :data:`CHUNK_BYTES` chunks (:meth:`Store.write_file`, :meth:`Store.read_to_file`,
:meth:`Store.hash_file`) with the sha256 computed on the fly, so a 56 GB optimizer state never sits in memory.
:meth:`Store.read_bytes` / :meth:`Store.write_bytes` remain for small files (JSON, Parquet shards).

Faults: S3 requests are retried by botocore (the one retry layer; s3fs's own loop is set to a single attempt) within
:class:`RetryBudget`; past it the error names the object and the cause (:class:`StorageError`).

:class:`Store` is the one public class. This module holds its byte I/O: paths, atomic and streamed writes and reads,
hashing, folders, and :meth:`Store.publish`, through which every write and delete passes its commit guard. The other
concerns are modules of their own, each with one job: the conditional commits of the run lease
(:mod:`mugrpo.storage.conditional`, a mixin of :class:`Store`: those methods are the store's and use its byte I/O),
the local ``flock`` and the naming of its holder (:mod:`mugrpo.storage.locks`: plain functions on a lock file,
which :meth:`Store.local_lock` calls), the exceptions (:mod:`mugrpo.storage.exceptions`) and the digests
(:mod:`mugrpo.storage.digests`). The names callers use are re-exported here: every exception a store raises is
caught as ``mugrpo.storage.store.X``.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Literal

import fsspec
from fsspec.implementations.local import LocalFileSystem
from pydantic import BaseModel, ConfigDict, Field

from mugrpo.common.faults import fault_pause
from mugrpo.storage.conditional import ConditionalWrites
from mugrpo.storage.conditional import PreconditionFailed as PreconditionFailed  # re-exported: callers catch it here
from mugrpo.storage.digests import (
    StoredObject,
    digest_cache,
    local_version,
    log_read,
    sha256_bytes,
    sha256_from_s3_checksum,
)
from mugrpo.storage.exceptions import ChecksumError, CommitRefused, StorageError, describe_cause
from mugrpo.storage.locks import LOCAL_LOCK_WAIT_ENV as LOCAL_LOCK_WAIT_ENV  # re-exported (callers set it)
from mugrpo.storage.locks import LocalLockTimeout as LocalLockTimeout  # re-exported: callers catch it here
from mugrpo.storage.locks import local_flock

COMPLETE_MARKER = "_COMPLETE"
TMP_TAG = ".tmp-"
#: The S3 multipart part size (the AWS CLI's default ``multipart_chunksize``, 8 MiB), also the read-ahead block of
#: a streamed S3 read. Files over 9,000 parts (~70 GiB here) get larger parts (:meth:`Store.write_file`).
PART_BYTES = 8 * 2**20
#: Bytes per chunk of a streamed read or write held by our own code: a writer's buffer peaks at one part plus one
#: chunk, so memory per transfer is a small multiple of :data:`PART_BYTES`, whatever the file's size.
CHUNK_BYTES = 2**20
#: S3's maximum number of parts of a multipart upload (kept below with a margin).
MAX_PARTS = 9_000
#: The largest object S3 takes in one ``PutObject`` (5 GiB): :meth:`Store.write_bytes` sends up to this in one request,
#: so the object carries its full-object SHA-256 checksum (:mod:`mugrpo.storage.digests`).
MAX_PUT_BYTES = 5 * 2**30
#: The checksum S3 computes and keeps for every object this store sends in one request.
S3_CHECKSUM = {"ChecksumAlgorithm": "SHA256"}
#: The ``_COMPLETE`` marker's key holding, on S3, the ETag of each multipart file at commit (:meth:`Store.upload_dir`).
MARKER_ETAGS = "etags"
_S3_PROTOCOLS = ("s3://", "s3a://")


class RetryBudget(BaseModel):
    """How hard S3 requests are retried before a job fails (botocore's retry handler; AWS SDKs and Tools Reference
    Guide, "Retry behavior"). Each request (PUT, part upload, GET of a range, listing...) is attempted at most
    ``max_attempts`` times, with exponential backoff and full jitter between attempts, on 500/502/503/504,
    throttling (``SlowDown``), connection resets and timeouts. Local stores do not retry."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    max_attempts: int = Field(
        5,
        ge=1,
        le=50,
        description="Attempts per S3 request, first included (botocore `total_max_attempts`; 5 = s3fs's default). "
        "Standard mode backs off `rand(0, 1) * 2**attempt` s, at most 20 s, so 5 attempts wait <= ~15 s in all.",
    )
    mode: Literal["standard", "adaptive"] = Field(
        "standard",
        description="botocore retry mode: `standard` (backoff only) or `adaptive` (also a client-side token bucket "
        "that slows requests after throttling responses).",
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="Seconds to open a connection before it is retried.")
    read_timeout_s: float = Field(
        60.0, gt=0, description="Seconds without a byte from the server before the request is retried."
    )

    def s3_options(self, storage_options: dict[str, Any]) -> dict[str, Any]:
        """``storage_options`` for s3fs with this budget filled in (keys the user set win)."""
        out = dict(storage_options)
        config = dict(out.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": self.max_attempts, "mode": self.mode})
        config.setdefault("connect_timeout", self.connect_timeout_s)
        config.setdefault("read_timeout", self.read_timeout_s)
        out["config_kwargs"] = config
        return out


#: A store's commit guard (``Store(guard=...)``): called as ``guard(store, rel, commit)`` where a write or delete of
#: ``rel`` is about to become visible; it calls ``commit()`` exactly once, or raises (a :class:`CommitRefused` to
#: refuse it) and leaves it unpublished.
CommitGuard = Callable[["Store", str, Callable[[], None]], None]


class Store(ConditionalWrites):
    """A root URL plus an fsspec filesystem. All paths given to methods are relative to the root.

    Args:
        url: a local path or fsspec URL, e.g. ``runs`` or ``s3://bucket/prefix``.
        storage_options: passed to fsspec (for S3: ``endpoint_url``, ``key``, ``secret``...). Credentials are best
            left to the environment (``AWS_ACCESS_KEY_ID``...); they are never logged.
        retry: the retry budget of S3 requests (default :class:`RetryBudget`); ignored by other filesystems.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        retry: RetryBudget | None = None,
        guard: CommitGuard | None = None,
    ) -> None:
        self.url = str(url).rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryBudget()
        self.guard = guard
        options = self.storage_options
        if self.url.startswith(_S3_PROTOCOLS):
            options = self.retry.s3_options(options)
        fs, root = fsspec.core.url_to_fs(self.url, **options)
        self.fs = fs
        self.root = root.rstrip("/") if root != "/" else root
        self.is_local = isinstance(fs, LocalFileSystem)
        #: Bytes of file content this store read, and requests that only inspected an object (HEAD / stat).
        self.bytes_read, self.heads = 0, 0
        if self.url.startswith(_S3_PROTOCOLS):
            fs.retries = 1  # s3fs's own retry loop off: botocore is the one retry layer, so the budget is exact
        if self.is_local:  # created by the first write, not here: a refused run leaves no folder behind
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
    def _failed(self, verb: str, rel: str, e: BaseException) -> StorageError:
        budget = f" (after up to {self.retry.max_attempts} attempts per request)" if not self.is_local else ""
        return StorageError(f"could not {verb} {self.uri(rel)}{budget}: {describe_cause(e)}")

    def write_bytes(self, rel: str, data: bytes) -> str:
        """Write ``data`` atomically at ``rel`` (for small files; see :meth:`write_file`); returns its sha256.

        With a :attr:`guard` on S3 the PUT is conditional on the object not having changed since the guard's check
        (``If-Match`` its ETag, ``If-None-Match: *`` when absent), so bytes another writer committed in between are
        never replaced (:meth:`publish`).

        Raises:
            StorageError: the write failed (past the retry budget on S3); names the object and the cause.
            PreconditionFailed: (S3, with a guard) the object changed between the check and the write, and its bytes
                are not these.
        """
        if self.is_local or (self.guard is None and len(data) > MAX_PUT_BYTES):
            return self.write_chunks(rel, [data])
        if self.guard is None:  # one PutObject: S3 keeps the object's full-object SHA-256 (mugrpo.storage.digests)
            fault_pause(rel)
            try:
                self.publish(rel, lambda: self._put(rel, data))
            except (StorageError, CommitRefused):
                raise
            except Exception as e:  # noqa: BLE001 - every cause gets the object's name
                raise self._failed("write", rel, e) from e
            return sha256_bytes(data)
        return self._guarded_put(rel, data)  # conditional (mugrpo.storage.conditional)

    def publish(self, rel: str, commit: Callable[[], None]) -> None:
        """Make a write or delete of ``rel`` visible: ``commit()`` (a rename, the final PUT, a removal), through the
        store's :attr:`guard` when it has one (the run lease's fence, :class:`mugrpo.coordination.lease.LeaseFence`: a
        writer that lost the run publishes nothing). Every write and delete of this class goes through here."""
        if self.guard is None:
            commit()
        else:
            self.guard(self, rel, commit)

    def write_chunks(self, rel: str, chunks: Iterable[bytes], *, part_bytes: int = PART_BYTES) -> str:
        """Write the concatenation of ``chunks`` atomically at ``rel``; returns its sha256 (computed on the fly).

        Local: a temporary file in the same folder, fsynced, then renamed. S3: s3fs's buffered writer with
        ``part_bytes`` blocks: a file smaller than one block is one PUT, a larger one a multipart upload that
        S3 commits only on ``CompleteMultipartUpload``; on any error the upload is aborted, so no object appears.
        Memory: one chunk plus one block.

        Raises:
            StorageError: the write failed; names the object and the cause.
        """
        path = self.full(rel)
        digest = hashlib.sha256()
        try:
            if self.is_local:
                folder = os.path.dirname(path)
                os.makedirs(folder, exist_ok=True)
                tmp = os.path.join(folder, f".{os.path.basename(path)}{TMP_TAG}{uuid.uuid4().hex}")
                try:
                    with open(tmp, "wb") as f:
                        for chunk in chunks:
                            digest.update(chunk)
                            f.write(chunk)
                        f.flush()
                        os.fsync(f.fileno())
                    fault_pause(rel)
                    self.publish(rel, lambda: os.replace(tmp, path))
                    self._remember(path, digest.hexdigest())
                except BaseException:
                    if os.path.exists(tmp):  # an error, Ctrl-C or SIGTERM: no orphan (SIGKILL leaves one, hidden)
                        os.unlink(tmp)
                    raise
            else:
                f = self.fs.open(path, "wb", block_size=part_bytes, **S3_CHECKSUM)  # kept by a one-PUT object
                try:
                    for chunk in chunks:
                        digest.update(chunk)
                        f.write(chunk)
                    fault_pause(rel)
                    self.publish(rel, f.close)  # the commit: the one PUT, or CompleteMultipartUpload
                except BaseException:
                    try:
                        f.discard()  # AbortMultipartUpload: the parts sent so far are dropped
                    except Exception:  # noqa: BLE001 - the server may be gone; S3 lifecycle rules reap parts
                        pass
                    finally:  # never flushed again, not even by the file's __del__ at interpreter exit (which
                        f.buffer, f.closed = None, True  # would wait forever on fsspec's stopped event loop)
                    raise
        except (StorageError, CommitRefused):
            raise
        except Exception as e:  # noqa: BLE001 - every cause (OSError, botocore, aiohttp) gets the object's name
            raise self._failed("write", rel, e) from e
        return digest.hexdigest()

    def write_file(self, rel: str, src: str | os.PathLike) -> str:
        """Stream the local file ``src`` to ``rel`` atomically in :data:`CHUNK_BYTES` chunks; returns its sha256.

        Raises:
            StorageError: the write failed; names the object and the cause.
        """
        size = os.path.getsize(src)
        return self.write_chunks(rel, _file_chunks(src), part_bytes=max(PART_BYTES, -(-size // MAX_PARTS)))

    def iter_chunks(self, rel: str) -> Iterator[bytes]:
        """The bytes of ``rel`` in chunks of at most :data:`CHUNK_BYTES`.

        Raises:
            FileNotFoundError: ``rel`` does not exist (names its URL).
            StorageError: the read failed (past the retry budget on S3); names the object and the cause.
        """
        read = 0
        try:
            with self.fs.open(self.full(rel), "rb", block_size=PART_BYTES) as f:
                while chunk := f.read(CHUNK_BYTES):
                    read += len(chunk)
                    yield chunk
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{self.uri(rel)} does not exist") from e
        except Exception as e:  # noqa: BLE001
            raise self._failed("read", rel, e) from e
        finally:
            self.bytes_read += read
            if read:
                log_read(self.uri(rel), read)

    def check_sha256(self, rel: str, actual: str, expected: str | None) -> None:
        """Raise ChecksumError naming ``rel`` when ``expected`` is given and differs from ``actual``."""
        if expected is not None and actual != expected:
            raise ChecksumError(
                f"checksum mismatch for {self.uri(rel)}: manifest says sha256 {expected}, "
                f"file has {actual}. The file was changed or corrupted after it was committed."
            )

    def hash_file(self, rel: str) -> tuple[str, int]:
        """(sha256 hex, size in bytes) of ``rel``, streamed (memory: one chunk). A local file's digest is remembered
        in the hash cache (:class:`mugrpo.storage.digests.DigestCache`) when the file did not change while it was read.

        Raises:
            FileNotFoundError: ``rel`` does not exist (names its URL).
            StorageError: the read failed; names the object and the cause.
        """
        fault_pause(rel)  # a test SIGKILLs a check here
        before = self._local_stat(rel)
        digest, size = hashlib.sha256(), 0
        for chunk in self.iter_chunks(rel):
            digest.update(chunk)
            size += len(chunk)
        after = self._local_stat(rel)
        if before is not None and after is not None and local_version(after) == local_version(before):
            digest_cache().record(self.full(rel), local_version(before), digest.hexdigest())  # (a read moves atime)
        return digest.hexdigest(), size

    def stat_object(self, rel: str) -> StoredObject:
        """What the store says about ``rel`` without reading its bytes (:mod:`mugrpo.storage.digests`): its size,
        the sha256 the store vouches for (S3's full-object checksum; a local hash-cache hit) and its version (ETag;
        local size, mtime, inode, device). One HEAD on S3, one ``stat`` locally.

        Raises:
            FileNotFoundError: ``rel`` does not exist (names its URL).
            StorageError: the request failed; names the object and the cause.
        """
        self.heads += 1
        if self.is_local:
            try:
                st = os.stat(self.full(rel))
            except FileNotFoundError as e:
                raise FileNotFoundError(f"{self.uri(rel)} does not exist") from e
            version = local_version(st)
            return StoredObject(st.st_size, digest_cache().lookup(self.full(rel), version), version)
        bucket, key, _ = self.fs.split_path(self.full(rel))
        try:
            head = self.fs.call_s3("head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{self.uri(rel)} does not exist") from e
        except Exception as e:  # noqa: BLE001
            raise self._failed("inspect", rel, e) from e
        etag = str(head.get("ETag", "")).strip('"')
        multipart = "-" in etag
        sha = None if multipart else sha256_from_s3_checksum(head.get("ChecksumSHA256"))
        return StoredObject(int(head["ContentLength"]), sha, etag, multipart)

    def _local_stat(self, rel: str) -> os.stat_result | None:
        if not self.is_local:
            return None
        try:
            return os.stat(self.full(rel))
        except OSError:
            return None

    def _remember(self, path: str, sha256: str) -> None:
        """Record a local file just written in the hash cache."""
        try:
            st = os.stat(path)
        except OSError:
            return
        digest_cache().record(path, local_version(st), sha256)

    def _put(self, rel: str, data: bytes, **condition: str) -> dict:
        """One ``PutObject`` of ``data`` at ``rel`` with the store's SHA-256 checksum (S3)."""
        bucket, key, _ = self.fs.split_path(self.full(rel))
        out = self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **S3_CHECKSUM, **condition)
        self.fs.invalidate_cache(self.full(rel))
        return out

    def verify_file(self, rel: str, expected_sha256: str) -> None:
        """Re-hash ``rel`` where it lies (streamed) and check it against ``expected_sha256``.

        Raises:
            ChecksumError: the bytes differ (names ``rel``).
            FileNotFoundError: ``rel`` does not exist.
        """
        self.check_sha256(rel, self.hash_file(rel)[0], expected_sha256)

    def read_to_file(self, rel: str, dest: str | os.PathLike, *, expected_sha256: str | None = None) -> str:
        """Stream ``rel`` into the local file ``dest`` (temporary name, then rename); returns the sha256.

        Raises:
            FileNotFoundError: ``rel`` does not exist.
            ChecksumError: the bytes differ from ``expected_sha256`` (``dest`` is then not created).
            StorageError: the read failed; names the object and the cause.
        """
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}{TMP_TAG}{uuid.uuid4().hex}")
        digest = hashlib.sha256()
        try:
            with open(tmp, "wb") as f:
                for chunk in self.iter_chunks(rel):
                    digest.update(chunk)
                    f.write(chunk)
            self.check_sha256(rel, digest.hexdigest(), expected_sha256)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return digest.hexdigest()

    def read_bytes(self, rel: str, *, expected_sha256: str | None = None) -> bytes:
        """Read the whole of ``rel`` (small files; stream big ones with :meth:`read_to_file`).

        Raises:
            FileNotFoundError: ``rel`` does not exist.
            ChecksumError: with ``expected_sha256``, the bytes differ.
            StorageError: the read failed; names the object and the cause.
        """
        data = b"".join(self.iter_chunks(rel))
        self.check_sha256(rel, sha256_bytes(data), expected_sha256)
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
        """Remove ``rel`` (a folder with ``recursive``) if it exists, through the :attr:`guard`."""
        if self.exists(rel):
            self.publish(rel, lambda: self.fs.rm(self.full(rel), recursive=recursive))

    def invalidate_cache(self) -> None:
        self.fs.invalidate_cache()

    # local temporary files and locks (the conditional writes, mugrpo.storage.conditional)
    def _local_tmp(self, rel: str, data: bytes) -> str:
        """A fsynced temporary file beside ``rel`` holding ``data``; on a failed write (a full disk) it is removed
        and the error names ``rel``.

        Raises:
            StorageError: the write failed; names the object and the cause.
        """
        path = self.full(rel)
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}{TMP_TAG}{uuid.uuid4().hex}")
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException as e:
            if os.path.exists(tmp):
                os.unlink(tmp)
            if isinstance(e, OSError):
                raise self._failed("write", rel, e) from e
            raise
        return tmp

    def local_lock_path(self, rel: str) -> str:
        """The hidden lock file beside ``rel`` that :meth:`local_lock` ``flock``s (local stores)."""
        path = self.full(rel)
        return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}{TMP_TAG}lock")

    def local_lock(self, rel: str, *, wait_s: float | None = None) -> AbstractContextManager[None]:
        """An exclusive ``flock`` on a hidden lock file beside ``rel`` (local stores), held for the block; a lock
        still held by another process after ``wait_s`` (default ``LOCAL_LOCK_WAIT_S``, or
        ``MUGRPO_LOCAL_LOCK_WAIT_S``) fails, naming its holder (:func:`mugrpo.storage.locks.local_flock`).

        Raises:
            LocalLockTimeout: the lock was held by another process for ``wait_s`` seconds; nothing was written.
        """
        return local_flock(self.local_lock_path(rel), self.uri(rel), wait_s=wait_s)

    # folders
    def is_complete_dir(self, rel: str) -> bool:
        """True if the folder ``rel`` was committed (its ``_COMPLETE`` marker exists)."""
        return self.exists(posixpath.join(rel, COMPLETE_MARKER))

    def upload_dir(self, local_dir: str | os.PathLike, rel: str, *, meta: dict | None = None) -> dict[str, str]:
        """Copy a local folder to ``rel`` file by file (each atomic and streamed), then write the ``_COMPLETE`` marker.

        Returns {relative file name: sha256}. The marker holds the checksums, so :meth:`download_dir` verifies them;
        on S3 it also holds, under :data:`MARKER_ETAGS`, the ETag of each file uploaded in parts (one HEAD each), what
        a quick check compares without reading it (:mod:`mugrpo.storage.digests`).
        """
        local_dir = Path(local_dir)
        sums: dict[str, str] = {}
        for p in sorted(local_dir.rglob("*")):
            if p.is_file():
                name = p.relative_to(local_dir).as_posix()
                sums[name] = self.write_file(posixpath.join(rel, name), p)
        marker: dict[str, Any] = {"files": sums, **(meta or {})}
        if not self.is_local:
            stored = {name: self.stat_object(posixpath.join(rel, name)) for name in sums}
            marker[MARKER_ETAGS] = {name: s.version for name, s in stored.items() if s.multipart}
        self.write_json(posixpath.join(rel, COMPLETE_MARKER), marker)
        return sums

    def download_dir(self, rel: str, local_dir: str | os.PathLike) -> Path:
        """Copy a committed folder to ``local_dir`` (streamed), verifying every file against the marker's checksums.

        Raises FileNotFoundError if the folder was not committed, ChecksumError on a mismatch.
        """
        if not self.is_complete_dir(rel):
            raise FileNotFoundError(f"{self.uri(rel)} is not a committed folder (no {COMPLETE_MARKER} marker)")
        marker = self.read_json(posixpath.join(rel, COMPLETE_MARKER))
        local_dir = Path(local_dir)
        for name, digest in marker["files"].items():
            self.read_to_file(posixpath.join(rel, name), local_dir / name, expected_sha256=digest)
        return local_dir

    def local_path(self, rel: str) -> Path | None:
        """The local filesystem path of ``rel`` when the store is local, else None (then download it)."""
        return Path(self.full(rel)) if self.is_local else None


def _file_chunks(src: str | os.PathLike) -> Iterator[bytes]:
    with open(src, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            yield chunk
