"""The stop controller (tasks/stops.py) in a small helper process: a flow that swallows the interrupt and hangs
(as Prefect's client retries or its event drain did) still exits within the grace with 128 + the signal's number,
after its cleanups and the resume line; a second signal exits at once; a SIGTERM handler swapped in after install
(Prefect's flow engine does that) does not hide the signal; a job process group gets SIGTERM at the first signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

HELPER = """
import os, signal, sys, time, subprocess
from tasks.stops import StopController
from tasks.launchers.processes import PROCESSES
grace, mode, out = float(sys.argv[1]), sys.argv[2], sys.argv[3]
stops = StopController(grace, lambda line: print(line, flush=True), lambda: "resume with: mugrpo resume R", reserve_s=1)
stops.install()
stops.add_cleanup("mark", lambda: open(out, "w").write("cleaned"))
job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
PROCESSES.track(job.pid)
if mode == "swap":  # a handler that swallows SIGTERM, as Prefect's bridge replaces ours while a flow runs
    signal.signal(signal.SIGTERM, lambda s, f: None)
ready = False
while True:  # a flow that never gets to a safe point: it swallows the interrupt and hangs
    try:
        if not ready:
            ready = True
            print("ready", job.pid, flush=True)
        time.sleep(600)
    except KeyboardInterrupt:
        if mode == "cooperate":
            stops.finish()
"""


def _start(tmp_path: Path, grace: float, mode: str):
    proc = subprocess.Popen(
        [sys.executable, "-c", HELPER, str(grace), mode, str(tmp_path / "cleaned")],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("ready"), line
    return proc, int(line.split()[1])


def _gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("sig", "mode"), [(signal.SIGTERM, "hang"), (signal.SIGINT, "hang"), (signal.SIGTERM, "swap")])
def test_a_hung_flow_still_exits_within_the_grace_after_its_cleanups(tmp_path, sig, mode):
    proc, job = _start(tmp_path, 3.0, mode)
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        code = proc.wait(timeout=20)
    finally:
        proc.kill()
    took = time.monotonic() - t0
    out = proc.stdout.read()
    assert code == 128 + sig, out
    assert 1.5 <= took <= 3.0 + 1.0, took  # the watchdog's soft deadline (grace - reserve), never past the grace
    assert (tmp_path / "cleaned").read_text() == "cleaned"
    assert "Press Ctrl-C again" in out and "resume with: mugrpo resume R" in out
    assert _gone(job), "the job's process group outlived the stop"


def test_a_cooperating_flow_exits_at_once_and_a_second_signal_does_not_wait(tmp_path):
    proc, job = _start(tmp_path, 20.0, "cooperate")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 130
    assert time.monotonic() - t0 < 5
    assert _gone(job)

    proc, job = _start(tmp_path, 20.0, "hang")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        assert proc.wait(timeout=20) == 130
    finally:
        proc.kill()
    assert time.monotonic() - t0 < 5, "a second Ctrl-C waited for the grace"
    assert _gone(job)
