"""The run lease: one writer per run, even when a preempted flow process is not dead yet.

The lease is a small JSON object ``{run}/_lease.json`` in the run's own store (no extra service):

    {"owner": "host:pid", "token": "<uuid4 hex>", "host": ..., "pid": ..., "pid_start": ...,
     "acquired_at": <unix s>, "heartbeat_at": <unix s>, "expires_at": <unix s>, "released": false}

- **Acquire** (:meth:`RunLease.acquire`): create the object with a conditional write (S3 ``If-None-Match: *``;
  locally a hard link, which fails if the name exists). If it exists, it is taken over only when it is stale:
  released, expired (``expires_at`` passed: its holder stopped heartbeating for ``ttl_s``), or held by a process
  on this host that is gone (same host, pid no longer running: a SIGKILLed ``mugrpo run`` is resumed at once
  instead of after ``ttl_s``). The takeover is a compare-and-swap (S3 ``If-Match: ETAG``; locally ``flock`` +
  compare), so of two writers racing for a stale lease exactly one wins. A live lease of another holder is
  refused with :class:`RunLeaseHeld`, naming the holder and when its lease expires.
- **Heartbeat**: the holder renews ``expires_at`` every ``ttl_s / 3`` s with the same compare-and-swap. A renewal
  that finds another token has lost the lease (:attr:`RunLease.lost`): the flow stops before its next job.
- **Fencing** (:func:`check_fence`): jobs launched by the holder carry its token (``MUGRPO_LEASE_TOKEN``).
  Every commit point (job and stage manifests, checkpoint markers, rollout shards) first checks that the lease
  still names that token, so a late job of a dead or superseded owner cannot commit: it fails with
  :class:`LeaseFenced`. The check and the write are two requests: a takeover can land between them only if the
  old holder's heartbeats stopped ``ttl_s`` (60 s) earlier and the takeover happens within the milliseconds
  between check and write; and even then the late write is one a deterministic job would have written alike.

Clocks: ``expires_at`` is the holder's wall clock plus ``ttl_s``, compared with the reader's clock: skew between
machines must stay well below ``ttl_s`` (NTP keeps it under a second).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from mugrpo.common.processes import process_stat
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import CommitRefused, PreconditionFailed, StorageError, Store, describe_cause

#: Environment variable carrying the lease token from the flow process to the jobs it launches.
TOKEN_ENV = "MUGRPO_LEASE_TOKEN"


class RunLeaseHeld(RuntimeError):
    """Another live writer holds the run's lease; the message names it and when its lease expires."""


class LeaseFenced(CommitRefused):
    """This process's lease token is no longer the holder's: its commit is refused."""


@dataclass
class LeaseRecord:
    """The content of ``_lease.json`` (times in Unix seconds, UTC)."""

    owner: str
    token: str
    host: str
    pid: int
    pid_start: str
    acquired_at: float
    heartbeat_at: float
    expires_at: float
    released: bool = False
    #: Where the holder writes: the URI of its lease file (empty in leases written before it was recorded). A lease
    #: read at another URI came along with a copy of the run folder.
    uri: str = ""

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> LeaseRecord:
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError) as e:
            raise StorageError(f"{where} is not a valid run lease ({e}); delete it if no run is writing") from e

    def describe(self, now: float, where: str = "") -> str:
        """Who holds the lease and until when; read at ``where`` (the URI of the lease file read), a lease its
        holder wrote elsewhere (a copied run folder) also says which folder the holder is writing."""
        when = datetime.fromtimestamp(self.heartbeat_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        text = f"{self.owner} (last heartbeat {when}, lease expires in {max(self.expires_at - now, 0):.0f} s)"
        if self.uri and where and self.uri != where:
            folder = self.uri.rsplit("/", 1)[0]
            text += (
                f", which is writing {folder}: this folder is a copy of that run, its lease copied along; "
                f"delete {where.rsplit('/', 1)[-1]} in the copy to run the copy"
            )
        return text

    def stale(self, now: float) -> str | None:
        """Why the lease can be taken over, or None if its holder is live."""
        if self.released:
            return "released"
        if now >= self.expires_at:
            return f"expired {now - self.expires_at:.0f} s ago"
        if self.host == socket.gethostname() and _process_start(self.pid) != self.pid_start:
            return f"its process {self.pid} on this host is gone"
        return None


def _process_start(pid: int) -> str:
    """Start time of ``pid`` in clock ticks since boot (from /proc; '' if the process does not exist). Guards
    against a reused pid."""
    fields = process_stat(pid)
    return "" if fields is None else fields[19]


class RunLease:
    """The lease of run ``run_id`` in ``store``; use it as a context manager (acquire, heartbeat, release).

    Args:
        store: the run's store.
        run_id: the run.
        ttl_s: seconds a lease lives without a heartbeat (a dead holder blocks the run at most this long).
        wait_s: seconds to wait for a live holder's lease to expire before giving up (0: refuse at once).

    Raises (on acquire):
        RunLeaseHeld: another live holder; the message names it.
    """

    def __init__(self, store: Store, run_id: str, *, ttl_s: float = 60.0, wait_s: float = 0.0):
        if ttl_s <= 0:
            raise ValueError(f"lease ttl_s must be > 0, got {ttl_s}")
        self.store, self.run_id, self.ttl_s, self.wait_s = store, run_id, ttl_s, wait_s
        self.rel = RunLayout(run_id).lease
        self.token = uuid.uuid4().hex
        self.record: LeaseRecord | None = None
        self.version: str | None = None
        self.lost: str | None = None
        self.heartbeats = 0
        #: What the command line's preflight checked before taking this lease
        #: (:class:`mugrpo.orchestration.preflight.Cleared`): the run flow, under this lease, uses it instead of
        #: checking (and hashing) the same files again.
        self.cleared: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_env: str | None = None

    def _new_record(self, now: float) -> LeaseRecord:
        host, pid = socket.gethostname(), os.getpid()
        return LeaseRecord(
            owner=f"{host}:{pid}",
            token=self.token,
            host=host,
            pid=pid,
            pid_start=_process_start(pid),
            acquired_at=now,
            heartbeat_at=now,
            expires_at=now + self.ttl_s,
            uri=self.store.uri(self.rel),
        )

    def try_acquire(self) -> str | None:
        """One attempt: take the lease if it is free or stale. Returns None on success, else the holder's
        description."""
        now = time.time()
        record = self._new_record(now)
        try:
            self.version = self.store.create_exclusive(self.rel, record.to_bytes())
            self.record = record
            return None
        except PreconditionFailed:
            pass
        current = self.store.read_versioned(self.rel)
        if current is None:  # deleted in between (by hand): create it again
            return self.try_acquire()
        holder = LeaseRecord.from_bytes(current[0], self.store.uri(self.rel))
        if holder.stale(now) is None:
            return holder.describe(now, self.store.uri(self.rel))
        try:
            self.version = self.store.replace_if(self.rel, record.to_bytes(), current[1])
        except PreconditionFailed:
            return "a writer that took it over at the same moment"
        self.record = record
        return None

    def acquire(self) -> RunLease:
        """Take the lease (waiting up to ``wait_s`` for a live holder's to expire) and start heartbeating.

        Raises:
            RunLeaseHeld: a live holder kept it; names the holder and the way out.
        """
        deadline = time.monotonic() + self.wait_s
        while (holder := self.try_acquire()) is not None:
            if time.monotonic() >= deadline:
                raise RunLeaseHeld(
                    f"run {self.run_id!r} at {self.store.uri(self.rel)} is being "
                    f"written by {holder}. Two writers would commit over each other: wait for it to finish, or stop "
                    f"it; a writer that died without releasing is taken over once its lease expires "
                    f"(orchestration.lease_ttl_s)."
                )
            time.sleep(min(1.0, max(self.ttl_s / 10, 0.05)))
        self._previous_env = os.environ.get(TOKEN_ENV)
        os.environ[TOKEN_ENV] = self.token  # inherited by job subprocesses; tasks add it to remote jobs' env
        self._thread = threading.Thread(target=self._beat, name=f"lease-{self.run_id}", daemon=True)
        self._thread.start()
        _HELD[self.store.uri(self.rel)] = self
        return self

    def heartbeat(self) -> None:
        """Renew the lease once (compare-and-swap on the version this holder last wrote). On a lost lease, sets
        :attr:`lost` (a transient storage error is left for the next beat)."""
        assert self.record is not None and self.version is not None
        now = time.time()
        record = LeaseRecord(**{**asdict(self.record), "heartbeat_at": now, "expires_at": now + self.ttl_s})
        try:
            self.version = self.store.replace_if(self.rel, record.to_bytes(), self.version)
            self.record = record
            self.heartbeats += 1
        except PreconditionFailed:
            current = self.store.read_versioned(self.rel)
            other = LeaseRecord.from_bytes(current[0], self.rel).owner if current else "nobody (deleted)"
            self.lost = f"the lease of run {self.run_id!r} was taken over by {other}"

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            if self.lost:
                return
            try:
                self.heartbeat()
            except (StorageError, OSError):  # OSError: the lock file beside the lease (a root turned read-only)
                pass  # storage briefly unreachable: retried at the next beat; jobs stay fenced by the token

    def ensure_held(self) -> None:
        """Raise :class:`LeaseFenced` if a heartbeat found the lease taken over."""
        if self.lost:
            raise LeaseFenced(f"{self.lost}; this writer stops (its jobs' commits are refused)")

    def release(self) -> str | None:
        """Stop heartbeating and mark the lease released (compare-and-swap: a lease taken over is left alone).

        Never raises for storage: when the lease cannot be written (a root turned read-only, a full disk, storage
        gone), returns the one line that says so and when the next writer may take the run (the lease expires by
        itself after ``ttl_s``; on this host at once when this process has exited); else None."""
        _HELD.pop(self.store.uri(self.rel), None)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._previous_env is None:
            os.environ.pop(TOKEN_ENV, None)
        else:
            os.environ[TOKEN_ENV] = self._previous_env
        if self.record is None or self.lost:
            return None
        record = LeaseRecord(**{**asdict(self.record), "released": True, "expires_at": time.time()})
        try:
            self.store.replace_if(self.rel, record.to_bytes(), self.version)
        except PreconditionFailed:
            return None  # taken over: the new holder's lease is left alone
        except (StorageError, OSError) as e:  # OSError: the lock file beside the lease, on a root turned read-only
            return (
                f"the run lease of {self.store.uri(self.rel)} could not be released ({_cause(e)}): it expires by "
                f"itself after orchestration.lease_ttl_s ({self.ttl_s:g} s) and the next writer takes it then (on "
                f"this host, as soon as this process has exited)"
            )
        return None

    def __enter__(self) -> RunLease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        line = self.release()
        if line is not None:  # a deployment's flow (no command line to print it): its log says why
            logging.getLogger(__name__).warning(line)


def _cause(exc: BaseException) -> str:
    """The OS's words for the first OS error in ``exc``'s chain (``read-only file system``), else its description."""
    e: BaseException | None = exc
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno:
            return os.strerror(e.errno).lower()
        e = e.__cause__ or e.__context__
    return describe_cause(exc)


#: Leases this process holds (acquired, not released), by the lease object's URL.
_HELD: dict[str, RunLease] = {}


def held_lease(store: Store, run_id: str) -> RunLease | None:
    """The lease of run ``run_id`` this process holds (``mugrpo run`` takes it before Prefect starts; the run flow
    then runs under it instead of taking it again), or None."""
    return _HELD.get(store.uri(RunLayout(run_id).lease))


def live_holder(store: Store, run_id: str) -> str | None:
    """The description of the live writer holding ``run_id``'s lease, or None when it is free or stale (a cheap
    pre-check; :meth:`RunLease.acquire` is what takes it)."""
    current = store.read_versioned(RunLayout(run_id).lease)
    if current is None:
        return None
    where = store.uri(RunLayout(run_id).lease)
    holder = LeaseRecord.from_bytes(current[0], where)
    now = time.time()
    return None if holder.stale(now) else holder.describe(now, where)


class LeaseFence:
    """The commit guard of a run writer's stores (:class:`mugrpo.storage.store.Store` ``guard``): every write and delete
    under a run folder becomes visible only after :func:`check_fence` passed for it, so a writer that lost the run
    (a preempted flow, a job frozen past its lease) changes nothing the new holder committed.

    - Local store: the check and the rename (or removal) run under the lease's own lock, the ``flock`` its takeover
      takes: a takeover cannot land between them.
    - S3: the check runs right before the final request; a small object (every manifest, marker, plan, table part
      and shard) is then written with ``If-Match`` its ETag (``If-None-Match: *`` when absent), so an object another
      writer committed in between is not replaced (:meth:`mugrpo.storage.store.Store.write_bytes`). A multipart upload
      (weights, optimizer state) is checked before it starts and before its completing request.

    The lease object itself and paths outside a run folder pass unguarded. The token is the process's
    ``MUGRPO_LEASE_TOKEN`` at each write (a flow sets it when it takes the lease).
    """

    def __call__(self, store: Store, rel: str, commit) -> None:
        try:
            run_id = rel.split("/", 1)[0]
            lease = RunLayout(run_id).lease
        except ValueError:
            commit()
            return
        if rel == lease or "/" not in rel:
            commit()
            return
        if store.is_local:
            with store.local_lock(lease):
                check_fence(store, run_id, rel)
                commit()
        else:
            check_fence(store, run_id, rel)
            try:
                commit()
            except PreconditionFailed:  # the object changed since the check: whose bytes are they?
                check_fence(store, run_id, rel)  # a takeover's: refused as fenced
                raise


def check_fence(store: Store, run_id: str, what: str) -> None:
    """Refuse a commit (``what``, e.g. the object about to be written) by a writer that does not hold the lease.

    With ``MUGRPO_LEASE_TOKEN`` set (a job launched by a lease holder): the lease must still carry that token.
    Without it (a job or library call run by hand): refused only while another writer holds a live lease.
    A run without a lease object (library use, tests of single jobs) is not fenced.

    Raises:
        LeaseFenced: names the holder and the refused write.
    """
    try:
        rel = RunLayout(run_id).lease
    except ValueError:  # a path outside any run (e.g. a scratch folder): nothing to fence
        return
    current = store.read_versioned(rel)
    if current is None:
        return
    holder = LeaseRecord.from_bytes(current[0], store.uri(rel))
    token = os.environ.get(TOKEN_ENV)
    now = time.time()
    if token:
        if holder.token != token:
            raise LeaseFenced(
                f"refusing to commit {store.uri(what)}: run {run_id!r} is now held by {holder.owner}, not by the "
                f"writer that launched this job (its lease was lost); the current holder redoes this work"
            )
    elif holder.stale(now) is None:
        raise LeaseFenced(
            f"refusing to commit {store.uri(what)}: run {run_id!r} is being written by "
            f"{holder.describe(now, store.uri(rel))}"
        )
