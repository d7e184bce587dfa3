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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import fsspec
from fsspec.implementations.local import LocalFileSystem
from pydantic import BaseModel, ConfigDict, Field

from mugrpo.common.faults import fault_pause
from mugrpo.common.processes import process_stat
from mugrpo.storage.digests import (
    StoredObject,
    digest_cache,
    local_version,
    log_read,
    sha256_from_s3_checksum,
)

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
#: Seconds a local store waits for a lock another process holds (:meth:`Store.local_lock`) before it names the holder
#: and fails: the sections under it (a compare and a rename) take milliseconds. ``MUGRPO_LOCAL_LOCK_WAIT_S``
#: overrides it (a slow network filesystem).
LOCAL_LOCK_WAIT_S = 60.0
LOCAL_LOCK_WAIT_ENV = "MUGRPO_LOCAL_LOCK_WAIT_S"


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


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


class StorageError(RuntimeError):
    """A storage operation failed; the message names the URL."""


class ChecksumError(StorageError):
    """A file's bytes do not match the sha256 recorded for it."""


#: A store's commit guard (``Store(guard=...)``): called as ``guard(store, rel, commit)`` where a write or delete of
#: ``rel`` is about to become visible; it calls ``commit()`` exactly once, or raises (a :class:`CommitRefused` to
#: refuse it) and leaves it unpublished.
CommitGuard = Callable[["Store", str, Callable[[], None]], None]


class CommitRefused(RuntimeError):
    """Raised by a store's commit guard to refuse a commit (e.g. :class:`mugrpo.coordination.lease.LeaseFenced`): it
    reaches the caller as raised, not wrapped in a :class:`StorageError` (a refusal is not an I/O failure; retrying
    cannot fix it)."""


class LocalLockTimeout(StorageError):
    """A local store's lock stayed held by another process past its wait (:meth:`Store.local_lock`)."""


class PreconditionFailed(StorageError):
    """A conditional write lost: the object exists (create) or changed since it was read (replace)."""


def describe_cause(exc: BaseException) -> str:
    """``Type: message`` of the deepest exception in ``exc``'s cause chain that says something, plus the S3 error
    code when there is one (e.g. ``ClientError [SlowDown]: ...``)."""
    best, code = exc, None
    e: BaseException | None = exc
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        response = getattr(e, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code"):
            code = response["Error"]["Code"]
        if str(e).strip():
            best = e
        e = e.__cause__ or e.__context__
    line = (str(best).strip().splitlines() or [""])[0][:300]
    return f"{type(best).__name__}{f' [{code}]' if code else ''}: {line}"


class Store:
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
        try:
            self.invalidate_cache()
            version = self.fs.info(self.full(rel)).get("ETag")
        except FileNotFoundError:
            version = None
        condition = {"IfMatch": version} if version else {"IfNoneMatch": "*"}

        def put() -> None:
            try:
                self._conditional_put(rel, data, **condition)
            except PreconditionFailed:
                current = self.read_versioned(rel)
                if current is None or current[0] != data:  # someone else's bytes: never replaced
                    raise
                # the same bytes, written by a sibling job of this writer (e.g. a fan-out worker's prompt plan)

        fault_pause(rel)
        self.publish(rel, put)
        return sha256_bytes(data)

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

    # conditional writes (the run lease, mugrpo.coordination.lease)
    def read_versioned(self, rel: str) -> tuple[bytes, str] | None:
        """``(bytes, version)`` of ``rel``, or None if it does not exist. The version is what
        :meth:`replace_if` compares: the ETag on S3 (bytes and ETag come from one GET, so they match), the sha256
        of the bytes locally."""
        if self.is_local:
            path = self.full(rel)
            if not os.path.exists(path):
                return None
            data = Path(path).read_bytes()
            return data, sha256_bytes(data)
        bucket, key, _ = self.fs.split_path(self.full(rel))

        async def get() -> tuple[bytes, str]:
            response = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            async with response["Body"] as body:
                return await body.read(), response["ETag"]

        try:
            return fsspec.asyn.sync(self.fs.loop, get)
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001
            raise self._failed("read", rel, e) from e

    def create_exclusive(self, rel: str, data: bytes) -> str:
        """Create ``rel`` with ``data`` only if it does not exist; returns the new version.

        S3: ``PutObject`` with ``If-None-Match: *`` (S3 conditional writes, 2024; moto implements them). Local: a
        temporary file hard-linked to the name (``link`` fails atomically if the name exists).

        Raises:
            PreconditionFailed: ``rel`` exists.
            StorageError: the write failed for another reason.
        """
        if self.is_local:
            with self.local_lock(rel):
                tmp = self._local_tmp(rel, data)
                try:
                    os.link(tmp, self.full(rel))
                except FileExistsError as e:
                    raise PreconditionFailed(f"{self.uri(rel)} already exists") from e
                finally:
                    os.unlink(tmp)
            return sha256_bytes(data)
        return self._conditional_put(rel, data, IfNoneMatch="*")

    def replace_if(self, rel: str, data: bytes, version: str) -> str:
        """Overwrite ``rel`` with ``data`` only if its version is still ``version``; returns the new version.

        S3: ``PutObject`` with ``If-Match: ETAG``. Local: under an exclusive ``flock`` on a lock file beside it,
        compare the sha256, then write a temporary file and rename it.

        Raises:
            PreconditionFailed: ``rel`` changed (or vanished) since ``version`` was read.
        """
        if self.is_local:
            with self.local_lock(rel):
                current = self.read_versioned(rel)
                if current is None or current[1] != version:
                    raise PreconditionFailed(f"{self.uri(rel)} changed since it was read")
                os.replace(self._local_tmp(rel, data), self.full(rel))
            return sha256_bytes(data)
        return self._conditional_put(rel, data, IfMatch=version)

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

    @contextlib.contextmanager
    def local_lock(self, rel: str, *, wait_s: float | None = None) -> Iterator[None]:
        """An exclusive ``flock`` on a hidden lock file beside ``rel`` (local stores), held for the block.

        Every section held under it is short (a compare and a rename), so a lock still held after ``wait_s``
        (default :data:`LOCAL_LOCK_WAIT_S`, or ``MUGRPO_LOCAL_LOCK_WAIT_S``) belongs to a writer that is frozen
        (SIGSTOP, a paused container) or stuck inside a commit on this machine. Waiting on would hang silently, and
        taking the object without the lock would let that writer's rename land later over what this one commits;
        the wait therefore ends in an error that names the lock's holder (its pid and state, from ``/proc/locks``).

        Raises:
            LocalLockTimeout: the lock was held by another process for ``wait_s`` seconds; nothing was written.
        """
        import fcntl
        import time

        path = self.full(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        lock = self.local_lock_path(rel)
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
                            f"could not lock {self.uri(rel)}: its lock file {lock} has been held for {waited:.0f} s "
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

    def _conditional_put(self, rel: str, data: bytes, **condition: str) -> str:
        try:
            out = self._put(rel, data, **condition)
        except Exception as e:  # noqa: BLE001
            if _precondition_failed(e):
                raise PreconditionFailed(f"{self.uri(rel)}: conditional write refused ({condition})") from e
            raise self._failed("write", rel, e) from e
        return out["ETag"]

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


def _precondition_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (s3fs wraps botocore's ClientError in OSError) is S3's 412 PreconditionFailed or 409
    ConditionalRequestConflict (a concurrent conditional write won)."""
    e: BaseException | None = exc
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in {"PreconditionFailed", "ConditionalRequestConflict"} or status in {412, 409}:
                return True
        e = e.__cause__ or e.__context__
    return False
