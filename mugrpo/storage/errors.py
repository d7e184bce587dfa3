"""One clear line for the storage faults a user can fix: unreachable endpoint, missing or refused credentials, no
such bucket.

s3fs/botocore report these as deep tracebacks (``EndpointConnectionError`` under aiohttp's ``ClientConnectorError``,
``NoSuchBucket`` under two ``FileNotFoundError`` wrappers, ...). :func:`explain_storage_error` walks an exception's
cause chain, recognizes the kind, and says which URL failed, why, and the option or environment variable that fixes
it. The CLI commands (``run``, ``resume``, ``status``, ``report``, ``sql``) call :func:`check_store` before any work
and print that line instead of a traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

from mugrpo.storage.store import StorageError, Store

ENDPOINT_HELP = (
    "set the endpoint with `--storage-option endpoint_url=URL` (CLI), the AWS_ENDPOINT_URL environment variable, "
    "or `run.storage_options: {endpoint_url: URL}` in the config"
)
CREDENTIALS_HELP = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment; credentials are never "
    "taken from the config"
)

_CONNECT_ERRORS = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ConnectionClosedError",
    "ClientConnectorError",
    "ClientConnectorDNSError",
    "ServerDisconnectedError",
    "ConnectionRefusedError",
    "gaierror",
}
_REFUSED_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken"}


class StorageUnavailable(StorageError):
    """The store cannot be used at all (endpoint, credentials, bucket); the message is one line that says the fix."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _error_code(e: BaseException) -> str | None:
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        return response.get("Error", {}).get("Code")
    return None


def _have_credentials() -> bool:
    """True when botocore finds credentials (environment, profile or instance metadata)."""
    try:
        import botocore.session

        return botocore.session.get_session().get_credentials() is not None
    except Exception:  # noqa: BLE001 - a broken AWS config file is itself "no usable credentials"
        return False


def explain_storage_error(exc: BaseException, url: str, storage_options: dict | None = None) -> str | None:
    """One line naming ``url``, the cause and the fix, if ``exc`` is a storage fault a user can fix; else None.

    Recognized kinds (anywhere in the cause chain): connection failures (wrong or missing endpoint, server down,
    DNS), missing or refused credentials (``NoCredentialsError``, ``InvalidAccessKeyId``, ``AccessDenied``,
    ``PermissionError``), and a bucket that does not exist (``NoSuchBucket``).
    """
    endpoint = (storage_options or {}).get("endpoint_url")
    for e in _chain(exc):
        name, code = type(e).__name__, _error_code(e)
        if name in _CONNECT_ERRORS:
            where = endpoint or os.environ.get("AWS_ENDPOINT_URL")
            if where is None:  # the host botocore tried, e.g. https://bucket.s3.amazonaws.com
                tried = re.search(r"(https?://[^\"'/\s]+)", str(getattr(e, "kwargs", {}).get("endpoint_url") or e))
                where = tried.group(1) if tried else "the default AWS endpoint"
            return f"cannot reach the storage of {url} at {where} ({name}: {_first_line(e)}): {ENDPOINT_HELP}"
        if name in {"NoCredentialsError", "PartialCredentialsError"}:
            return f"no credentials to read {url}: {CREDENTIALS_HELP}"
        if code == "NoSuchBucket" or "bucket does not exist" in str(e).lower():
            bucket = url.split("://", 1)[-1].split("/", 1)[0]
            at = f" at {endpoint}" if endpoint else ""
            return f"bucket {bucket!r} of {url} does not exist{at}: create it, or fix the URL or the endpoint"
        if code in _REFUSED_CODES or isinstance(e, PermissionError):
            if not _have_credentials():
                return f"access to {url} denied and no credentials were found: {CREDENTIALS_HELP}"
            return (
                f"access to {url} denied ({code or name}): the credentials in the environment were refused; "
                f"{CREDENTIALS_HELP}"
            )
    return None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


def check_store(store: Store, url: str | None = None) -> None:
    """Touch the store once (one listing of its root) so an unusable store fails before any work starts.

    Args:
        store: the store to check.
        url: the URL the user asked for (e.g. the run's), named in the message; default the store's root.

    Raises:
        StorageUnavailable: with the line of :func:`explain_storage_error`.
    """
    url = url or store.uri()
    try:
        store.exists("")
        if not store.is_local:
            store.fs.ls(store.root, detail=False)
    except FileNotFoundError as e:
        message = explain_storage_error(e, url, store.storage_options)
        if message is not None:
            raise StorageUnavailable(message) from e
        # a prefix that does not exist yet is fine: the first write creates it
    except Exception as e:  # noqa: BLE001 - re-raised as is unless we can explain it
        message = explain_storage_error(e, url, store.storage_options)
        if message is None:
            raise
        raise StorageUnavailable(message) from e


#: Bytes the writability probe writes and fsyncs: a real block, so a disk with almost no space left is refused at
#: the start rather than in the middle of the run lease or the first policy.
PROBE_BYTES = 1 << 20


def _missing_folders(path: str) -> list[str]:
    """``path`` and its ancestors that do not exist yet, innermost first."""
    out = []
    while path and not os.path.exists(path):
        out.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return out


def check_writable(store: Store, rel: str, url: str | None = None) -> None:
    """Write, fsync and delete one probe object of :data:`PROBE_BYTES` in the store's root (beside the run folder
    ``rel``, which it does not create), so a run root the process may not write to, or a disk without room for a
    block, fails with one line before any work starts, not in the first job after Prefect's server started. A local
    root folder the probe had to create is removed again, so a refused start leaves no folder behind.

    The probe is a real write (``os.access`` answers yes to root whatever the mode, and says nothing about S3
    policies or read-only mounts); it is named ``.mugrpo-write-probe-*`` and removed at once.

    Raises:
        StorageUnavailable: permission denied, a read-only filesystem, a full disk...: names ``url`` and the cause.
    """
    import errno
    import uuid

    url = url or store.uri(rel)
    # beside the run folder, not in it: a refused run leaves no folder behind (and a probe is not a commit)
    probe = f".mugrpo-write-probe-{uuid.uuid4().hex}"
    created = _missing_folders(store.root) if store.is_local else []
    try:
        try:
            store.write_bytes(probe, bytes(PROBE_BYTES))
        finally:
            store.delete(probe)
            for folder in created:  # innermost first; only folders the probe created, and only if still empty
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
    except Exception as e:  # noqa: BLE001 - re-raised as is unless we can explain it
        os_error = next((c for c in _chain(e) if isinstance(c, OSError) and c.errno is not None), None)
        if store.is_local and os_error is not None:
            hint = {
                errno.EACCES: "give this user write access to the folder (owner or mode), or choose another run.root",
                errno.EPERM: "give this user write access to the folder (owner or mode), or choose another run.root",
                errno.EROFS: "the filesystem is mounted read-only: choose another run.root",
                errno.ENOSPC: f"the disk is full (no room for a {PROBE_BYTES >> 20} MiB block): free space, or choose "
                "another run.root",
                errno.EDQUOT: "the disk quota is exhausted: free space, or choose another run.root",
                errno.EFBIG: f"a file size limit (ulimit -f) forbids a {PROBE_BYTES >> 20} MiB file: raise it, or "
                "run elsewhere",
            }.get(os_error.errno, "fix the folder, or choose another run.root")
            raise StorageUnavailable(
                f"cannot write to {url}: {os_error.strerror} ({os_error.filename or url}); {hint}"
            ) from e
        message = explain_storage_error(e, url, store.storage_options)
        if message is None:
            raise
        raise StorageUnavailable(message) from e
