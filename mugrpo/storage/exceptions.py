"""The exceptions the store raises, and :func:`describe_cause`, the one line a failure's message ends with.

They sit below every storage module (:mod:`mugrpo.storage.store`, :mod:`mugrpo.storage.locks`,
:mod:`mugrpo.storage.conditional`), which raise them; :mod:`mugrpo.storage.store` re-exports them, so callers catch
them from the store. The two that belong to one concern live with it: :class:`~mugrpo.storage.locks.LocalLockTimeout`
and :class:`~mugrpo.storage.conditional.PreconditionFailed`. :mod:`mugrpo.storage.errors`, above the store, turns the
faults a user can fix (endpoint, credentials, bucket) into one line.
"""

from __future__ import annotations


class StorageError(RuntimeError):
    """A storage operation failed; the message names the URL."""


class ChecksumError(StorageError):
    """A file's bytes do not match the sha256 recorded for it."""


class CommitRefused(RuntimeError):
    """Raised by a store's commit guard to refuse a commit (e.g. :class:`mugrpo.coordination.lease.LeaseFenced`): it
    reaches the caller as raised, not wrapped in a :class:`StorageError` (a refusal is not an I/O failure; retrying
    cannot fix it)."""


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
