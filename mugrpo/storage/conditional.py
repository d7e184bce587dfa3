"""Conditional commits: write an object only if it is absent, or unchanged since it was read.

The run lease (:mod:`mugrpo.coordination.lease`) is built on them (:meth:`~ConditionalWrites.read_versioned`,
:meth:`~ConditionalWrites.create_exclusive`, :meth:`~ConditionalWrites.replace_if`), and so is a guarded store's
PUT on S3 (:meth:`mugrpo.storage.store.Store.write_bytes` with a commit guard: bytes another writer committed since
the guard's check are never replaced). On S3 the condition is the request's (``If-None-Match: *``, ``If-Match:
ETAG``; S3's 412 or 409 is :class:`PreconditionFailed`); locally it is a compare and a rename under the store's
``flock`` (:mod:`mugrpo.storage.locks`).

:class:`ConditionalWrites` is a mixin of :class:`mugrpo.storage.store.Store`, the one public class: these methods
are the store's, and use its byte I/O (the attributes and methods listed on the class), so this module holds only
what a condition adds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import fsspec

from mugrpo.common.faults import fault_pause
from mugrpo.storage.digests import sha256_bytes
from mugrpo.storage.exceptions import StorageError


class PreconditionFailed(StorageError):
    """A conditional write lost: the object exists (create) or changed since it was read (replace)."""


class ConditionalWrites:
    """The conditional writes of a store (mixed into :class:`mugrpo.storage.store.Store`, which provides the
    attributes and methods declared below)."""

    fs: Any
    is_local: bool
    full: Callable[[str], str]
    uri: Callable[..., str]
    local_lock: Callable[..., AbstractContextManager[None]]
    publish: Callable[[str, Callable[[], None]], None]
    invalidate_cache: Callable[[], None]
    _local_tmp: Callable[[str, bytes], str]
    _put: Callable[..., dict]
    _failed: Callable[[str, str, BaseException], StorageError]

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

    def _guarded_put(self, rel: str, data: bytes) -> str:
        """The PUT of :meth:`mugrpo.storage.store.Store.write_bytes` on S3 with a guard: conditional on the object not
        having changed since the guard's check (``If-Match`` its ETag, ``If-None-Match: *`` when absent); returns
        the sha256 of ``data``.

        Raises:
            PreconditionFailed: the object changed between the check and the write, and its bytes are not these.
        """
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

    def _conditional_put(self, rel: str, data: bytes, **condition: str) -> str:
        try:
            out = self._put(rel, data, **condition)
        except Exception as e:  # noqa: BLE001
            if _precondition_failed(e):
                raise PreconditionFailed(f"{self.uri(rel)}: conditional write refused ({condition})") from e
            raise self._failed("write", rel, e) from e
        return out["ETag"]


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
