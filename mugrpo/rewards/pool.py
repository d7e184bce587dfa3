"""A process pool with a per-item wall-clock limit that kills and replaces overrunning workers.

Why not ``concurrent.futures.ProcessPoolExecutor``: ``future.result(timeout)`` only stops *waiting*; the
hung worker keeps running, Python 3.11 has no public way to kill one worker of the executor, and an item
queued behind others starts its clock before it starts running. Here each worker owns a pipe and takes
one item at a time, so the clock starts when the item reaches an idle, ready worker, and a worker over the
limit is SIGKILLed and replaced without touching the items on the other workers.

Workers are started with ``spawn`` or ``forkserver`` (never ``fork``: the parent may hold torch thread pools
or CUDA state). The function a pool runs is fixed when the pool is created and sent to each worker at start,
so its module is imported before the worker reports ready, not on the clock of the first item.
"""

from __future__ import annotations

import enum
import logging
import multiprocessing
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Literal

__all__ = ["Outcome", "TimeoutPool"]

logger = logging.getLogger(__name__)

_READY = "ready"
_STOP = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """Result of one item: ``status`` is ``"ok"`` (``value`` set), ``"timeout"`` or ``"error: <Type>: <msg>"``."""

    status: str
    value: Any = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _worker_main(conn: Connection, fn: Callable[[Any], Any], initializer: Callable[[], None] | None) -> None:
    """Worker loop: run ``fn`` on each item received, send back an :class:`Outcome`; stop on ``None``/EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if initializer is not None:
        initializer()
    conn.send(_READY)
    while True:
        try:
            item = conn.recv()
        except EOFError:  # parent gone
            return
        if item is _STOP:
            return
        try:
            outcome = Outcome("ok", fn(item))
        except Exception as exc:  # an item's failure is its result, never the worker's death
            outcome = Outcome(f"error: {type(exc).__name__}: {exc}")
        try:
            conn.send(outcome)
        except Exception as exc:  # e.g. an unpicklable return value
            conn.send(Outcome(f"error: {type(exc).__name__}: result not sendable: {exc}"))


class _State(enum.Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"


class _Worker:
    """One worker process, the parent end of its pipe, and what it is doing."""

    def __init__(self, ctx: Any, fn: Callable, initializer: Callable | None, start_timeout_s: float) -> None:
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=_worker_main, args=(child_conn, fn, initializer), daemon=True, name="mugrpo-reward-worker"
        )
        self.process.start()
        child_conn.close()  # so a dead worker reads as EOF on our end
        self.state = _State.STARTING
        self.deadline = time.monotonic() + start_timeout_s
        self.item_index = -1

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


class TimeoutPool:
    """Runs ``fn(item)`` for a batch of items on ``num_workers`` processes, each item under a time limit.

    Args:
        fn: module-level function (picklable by reference) applied to each item.
        num_workers: worker processes (>= 1).
        start_method: ``"spawn"`` or ``"forkserver"``.
        initializer: optional module-level function each worker runs once before reporting ready.
        start_timeout_s: how long a worker may take to start before :meth:`map` raises ``RuntimeError``.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        fn: Callable[[Any], Any],
        num_workers: int,
        *,
        start_method: Literal["spawn", "forkserver"] = "spawn",
        initializer: Callable[[], None] | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
        self._ctx = multiprocessing.get_context(start_method)
        self._fn = fn
        self._initializer = initializer
        self._start_timeout_s = start_timeout_s
        self._workers: list[_Worker] = [self._new_worker() for _ in range(num_workers)]
        self._closed = False
        self.num_replaced = 0
        """Workers killed and replaced so far (timeouts and crashes)."""

    def _new_worker(self) -> _Worker:
        return _Worker(self._ctx, self._fn, self._initializer, self._start_timeout_s)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = self._new_worker()
        self.num_replaced += 1

    def map(self, items: Sequence[Any], timeout_s: float) -> list[Outcome]:
        """``fn`` of every item, in input order, spread over the workers.

        Each item's clock starts when it is handed to an idle worker. An item still running after
        ``timeout_s`` seconds gets ``Outcome("timeout")`` and its worker is killed and replaced; an item
        whose ``fn`` raises gets ``Outcome("error: <Type>: <msg>")``; a worker that dies mid-item gives
        ``"error: WorkerDied: ..."``. None of these raise.

        Raises:
            RuntimeError: the pool is closed, or a worker failed to start within ``start_timeout_s``.
        """
        if self._closed:
            raise RuntimeError("TimeoutPool is closed")
        for worker in list(self._workers):
            if worker.state is _State.BUSY:  # left over from a map() interrupted by an exception
                self._replace(worker)
        outcomes: list[Outcome | None] = [None] * len(items)
        pending = deque(range(len(items)))
        while pending or any(w.state is _State.BUSY for w in self._workers):
            for worker in self._workers:
                if worker.state is _State.IDLE and pending:
                    index = pending.popleft()
                    worker.conn.send(items[index])
                    worker.state, worker.item_index = _State.BUSY, index
                    worker.deadline = time.monotonic() + timeout_s
            active = [w for w in self._workers if w.state is not _State.IDLE]
            wait_s = max(0.0, min(w.deadline for w in active) - time.monotonic())
            ready = set(wait([w.conn for w in active], timeout=wait_s))
            for worker in active:
                if worker.conn in ready:
                    self._receive(worker, outcomes)
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.state is _State.BUSY and now >= worker.deadline:
                    outcomes[worker.item_index] = Outcome("timeout")
                    logger.warning(
                        "reward item %d timed out after %.1f s; replacing its worker", worker.item_index, timeout_s
                    )
                    self._replace(worker)
                elif worker.state is _State.STARTING and now >= worker.deadline:
                    raise self._start_failure(worker)
        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]

    def wait_ready(self) -> None:
        """Block until every worker has started (imported its modules and run the initializer).

        Raises:
            RuntimeError: the pool is closed, or a worker failed to start within ``start_timeout_s``.
        """
        if self._closed:
            raise RuntimeError("TimeoutPool is closed")
        while starting := [w for w in self._workers if w.state is _State.STARTING]:
            wait_s = max(0.0, min(w.deadline for w in starting) - time.monotonic())
            ready = set(wait([w.conn for w in starting], timeout=wait_s))
            for worker in starting:
                if worker.conn in ready:
                    self._receive(worker, [])
                elif time.monotonic() >= worker.deadline:
                    raise self._start_failure(worker)

    def _start_failure(self, worker: _Worker) -> RuntimeError:
        return RuntimeError(
            f"reward worker did not start within {self._start_timeout_s} s (exit code "
            f"{worker.process.exitcode}); check that the reward modules import in a fresh interpreter"
        )

    def _receive(self, worker: _Worker, outcomes: list[Outcome | None]) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            worker.process.join(timeout=5)
            code = worker.process.exitcode
            if worker.state is _State.STARTING:
                raise RuntimeError(
                    f"reward worker exited with code {code} while starting; check that the reward modules "
                    "import in a fresh interpreter"
                ) from None
            outcomes[worker.item_index] = Outcome(f"error: WorkerDied: exit code {code}")
            self._replace(worker)
            return
        if worker.state is _State.BUSY:
            outcomes[worker.item_index] = message
        worker.state = _State.IDLE

    def close(self) -> None:
        """Stop every worker (politely, then SIGKILL after 5 s). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            try:
                worker.conn.send(_STOP)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 5.0
        for worker in self._workers:
            worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
            worker.kill()

    def __enter__(self) -> TimeoutPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
