"""bench/support/pinned.py: runs on cores of their own, in order, an error raised once the running calls end."""

from __future__ import annotations

import threading
import time

import pytest

from bench.support.pinned import map_on_cores, run_pinned


def test_map_on_cores_runs_jobs_at_a_time_each_on_its_own_core():
    running, peak, lock = set(), [0], threading.Lock()
    started, done = [], {}

    def fn(item, core):
        with lock:
            started.append(item)
            assert core not in running  # no two calls share a core
            running.add(core)
            peak[0] = max(peak[0], len(running))
        time.sleep(0.05)
        with lock:
            running.discard(core)
        return item * 10

    map_on_cores(fn, range(6), 2, lambda item, result: done.__setitem__(item, result))
    assert started[:2] == [0, 1] and sorted(started) == list(range(6))  # started in order
    assert peak[0] == 2 and done == {i: i * 10 for i in range(6)}


def test_map_on_cores_one_job_is_not_pinned_and_an_error_stops_new_starts():
    cores, started = [], []

    def fn(item, core):
        cores.append(core)
        started.append(item)
        if item == 1:
            raise RuntimeError("run 1 failed")
        return item

    with pytest.raises(RuntimeError, match="run 1 failed"):
        map_on_cores(fn, range(5), 1, lambda item, result: None)
    assert cores == [None, None] and started == [0, 1]


def test_run_pinned_names_the_run_and_gives_its_log_tail(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(
        "import os, sys\nprint('threads', os.environ.get('OMP_NUM_THREADS'))\nsys.exit(sys.argv[1] == 'fail')\n"
    )
    log = tmp_path / "log"
    assert run_pinned(script, ["ok"], log, 0, "r0") >= 0
    assert "threads 1" in log.read_text()  # pinned: one OpenMP thread
    with pytest.raises(RuntimeError, match=r"run r1 failed \(exit 1\):\nthreads"):
        run_pinned(script, ["fail"], log, None, "r1")
