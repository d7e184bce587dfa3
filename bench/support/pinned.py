"""Child processes pinned to one core: how the lab, quality and staleness benches run two runs at once on a 2-core
machine without the two competing for each other's core (``taskset -c N``, one torch/OpenMP thread each)."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent import futures
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_pinned(script: Path, args: list[str], log: Path, core: int | None, name: str) -> float:
    """Run ``python SCRIPT ARGS`` in a child process, its output to ``log``; pinned to ``core`` with one
    torch/OpenMP thread when ``core`` is given (and ``taskset`` exists). Returns its wall seconds.

    Raises:
        RuntimeError: the child exited non-zero (the message names ``name`` and gives the tail of its log).
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(script), *args]
    if core is not None and shutil.which("taskset"):
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        cmd = ["taskset", "-c", str(core), *cmd]
    t0 = time.monotonic()
    with log.open("wb") as out:
        code = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"run {name} failed (exit {code}):\n{log.read_text(errors='replace')[-3000:]}")
    return time.monotonic() - t0


def map_on_cores(fn: Callable, items: Iterable, jobs: int, on_done: Callable) -> None:
    """Call ``fn(item, core)`` for every item, ``jobs`` at a time, in the items' order, each call given a core of its
    own (0..jobs-1 modulo the machine's cores; None when ``jobs`` is 1: no pinning); ``on_done(item, result)`` runs in
    the calling thread as each call finishes. The first exception stops submitting and is raised once the running
    calls have finished."""
    ncores = os.cpu_count() or 1
    cores: queue.SimpleQueue = queue.SimpleQueue()
    for c in range(jobs):
        cores.put(c % ncores if jobs > 1 else None)
    todo = list(items)
    with futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        pending: dict[futures.Future, tuple] = {}

        def submit() -> None:
            item, core = todo.pop(0), cores.get()
            pending[pool.submit(fn, item, core)] = (item, core)

        while todo and len(pending) < jobs:
            submit()
        error: BaseException | None = None
        while pending:
            finished, _ = futures.wait(pending, return_when=futures.FIRST_COMPLETED)
            for fut in finished:
                item, core = pending.pop(fut)
                cores.put(core)
                try:
                    on_done(item, fut.result())
                except BaseException as e:  # noqa: BLE001  (raised below once the running calls end)
                    error = error or e
                if todo and error is None:
                    submit()
        if error is not None:
            raise error
