"""A process pool with a per-item wall-clock limit that kills and replaces overrunning workers, on pebble.

Why not ``concurrent.futures.ProcessPoolExecutor``: ``future.result(timeout)`` only stops *waiting*; the hung
worker keeps running and Python 3.11 has no public way to kill one worker of the executor. pebble's
``ProcessPool`` (https://github.com/noxdafox/pebble) does what the verifier needs: a per-task ``timeout`` whose
clock starts when a worker acknowledges the task (not while it waits in the queue), after which that worker is
terminated and replaced, and a worker that dies mid-task fails only its own task (``ProcessExpired`` with its exit
code). A worker that dies mid-item is an accident of the machine (OOM killer, a SIGKILL), not a property of the
item, so the item is retried on a fresh worker (``died_retries`` times) before its death becomes its result: a
reward committed to a rollout never depends on which worker happened to die (bench/chaos.py kills them). It
replaced our own 240-line pool after passing the same tests: hang, raise, crash, timeout,
parallelism, clean shutdown (tests/unit/test_rewards.py).

Workers are started with ``spawn`` or ``forkserver`` (never ``fork``: the parent may hold torch thread pools or
CUDA state). :meth:`TimeoutPool.wait_ready` runs no-op tasks until every worker has answered one, so that the
workers' imports happen before the first batch, not on the clock of its first items.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Literal

from pebble import ProcessExpired, ProcessPool

__all__ = ["Outcome", "TimeoutPool"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    """Result of one item: ``status`` is ``"ok"`` (``value`` set), ``"timeout"`` or ``"error: <Type>: <msg>"``."""

    status: str
    value: Any = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _worker_init(initializer: Callable[[], None] | None) -> None:
    """Worker start-up: Ctrl-C and SIGTERM are the parent's to handle (a preempted job finishes scoring the shard it
    commits, :mod:`mugrpo.common.preemption`; a SIGKILL of the job's group still ends the workers); then the
    caller's initializer."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if initializer is not None:
        initializer()


def _ready(seconds: float) -> int:
    """No-op task of :meth:`TimeoutPool.wait_ready`: the worker's pid, after a short sleep so others take the next."""
    time.sleep(seconds)
    return os.getpid()


class TimeoutPool:
    """Runs ``fn(item)`` for a batch of items on ``num_workers`` processes, each item under a time limit.

    Args:
        fn: module-level function (picklable by reference) applied to each item.
        num_workers: worker processes (>= 1).
        start_method: ``"spawn"`` or ``"forkserver"``.
        initializer: optional module-level function each worker runs once at start.
        start_timeout_s: how long :meth:`wait_ready` may wait for the workers before it raises ``RuntimeError``.
        preload: with ``"forkserver"``, modules the forkserver imports once before it forks the workers (what
            ``fn`` and ``initializer`` import), so that a worker start costs a fork, not the imports.
        died_retries: how many times an item whose worker died under it is run again on a fresh worker before
            ``"error: WorkerDied: ..."`` becomes its outcome (an item that kills every worker it meets is its own
            result; one killed from outside must not change the reward).

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
        died_retries: int = 2,
        preload: Sequence[str] = (),
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
        if died_retries < 0:
            raise ValueError(f"died_retries must be >= 0, got {died_retries}")
        self._fn = fn
        self._died_retries = died_retries
        self._num_workers = num_workers
        self._start_timeout_s = start_timeout_s
        context = multiprocessing.get_context(start_method)
        if start_method == "forkserver" and preload:
            # The server (one per process, started with the first forkserver pool) imports these once; each
            # worker is then a fork of it instead of an interpreter importing them again.
            context.set_forkserver_preload(list(preload))
        self._pool = ProcessPool(
            max_workers=num_workers,
            initializer=_worker_init,
            initargs=(initializer,),
            context=context,
        )
        self._closed = False
        self._warmup: list = []  # no-op tasks scheduled by start(), answered once the workers are up
        self.num_replaced = 0
        """Workers killed and replaced so far (timeouts and crashes)."""

    def map(self, items: Sequence[Any], timeout_s: float) -> list[Outcome]:
        """``fn`` of every item, in input order, spread over the workers.

        Each item's clock starts when a worker takes it. An item still running after ``timeout_s`` seconds gets
        ``Outcome("timeout")`` and its worker is killed and replaced; an item whose ``fn`` raises gets
        ``Outcome("error: <Type>: <msg>")``; an item whose worker dies under it is run again on a fresh worker, up to
        ``died_retries`` times, and only then gives ``"error: WorkerDied: exit code N"``.
        None of these raise.

        Raises:
            RuntimeError: the pool is closed or broken (e.g. the initializer fails in every worker).
        """
        if self._closed:
            raise RuntimeError("TimeoutPool is closed")
        try:
            futures = [self._pool.schedule(self._fn, args=(item,), timeout=timeout_s) for item in items]
        except RuntimeError as e:
            raise RuntimeError(f"reward worker pool is not usable: {e}") from e
        return [
            self._outcome(index, item, future, timeout_s)
            for index, (item, future) in enumerate(zip(items, futures, strict=True))
        ]

    def _outcome(self, index: int, item: Any, future: Any, timeout_s: float) -> Outcome:
        for attempt in range(1, self._died_retries + 2):
            try:
                return Outcome("ok", future.result())
            except FutureTimeout:
                self.num_replaced += 1
                logger.warning("reward item %d timed out after %.1f s; its worker was replaced", index, timeout_s)
                return Outcome("timeout")
            except ProcessExpired as e:
                self.num_replaced += 1
                if attempt > self._died_retries:
                    return Outcome(f"error: WorkerDied: exit code {e.exitcode}")
                logger.warning(
                    "reward item %d: its worker died (exit code %s); running it again on a fresh worker (%d of %d)",
                    index,
                    e.exitcode,
                    attempt,
                    self._died_retries,
                )
                future = self._pool.schedule(self._fn, args=(item,), timeout=timeout_s)
            except Exception as e:  # an item's failure is its result (pebble re-raises fn's exception here)
                return Outcome(f"error: {type(e).__name__}: {e}")
        raise AssertionError("unreachable: the last attempt returns")

    def start(self) -> None:
        """Start the workers and return without waiting for them: the no-op tasks :meth:`wait_ready` waits on are
        scheduled now, so the workers' start (an interpreter and the reward modules' imports each) runs while the
        caller does other work (the generate job loads its engine meanwhile). Idempotent until ``wait_ready``.

        Raises:
            RuntimeError: the pool is closed.
        """
        if self._closed:
            raise RuntimeError("TimeoutPool is closed")
        if not self._warmup:
            self._warmup = [self._pool.schedule(_ready, args=(0.2,)) for _ in range(self._num_workers)]

    def wait_ready(self) -> None:
        """Block until the workers have started (imported their modules, run the initializer); starts them first
        unless :meth:`start` did.

        Raises:
            RuntimeError: the pool is closed, or the workers did not start within ``start_timeout_s`` of this call.
        """
        if self._closed:
            raise RuntimeError("TimeoutPool is closed")
        deadline = time.monotonic() + self._start_timeout_s
        ready: set[int] = set()
        while len(ready) < self._num_workers:  # until every worker has answered once
            self.start()
            futures, self._warmup = self._warmup, []
            try:
                ready.update(f.result(timeout=max(0.0, deadline - time.monotonic())) for f in futures)
            except Exception as e:
                raise RuntimeError(
                    f"reward workers failed to start or did not start within {self._start_timeout_s} s "
                    f"({type(e).__name__}: {e}); check that the reward modules import in a fresh interpreter"
                ) from e

    def close(self) -> None:
        """Stop every worker (pending items are cancelled, running ones killed) and wait for them. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._pool.stop()
        self._pool.join(timeout=10)

    def __enter__(self) -> TimeoutPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
