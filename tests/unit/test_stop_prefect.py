"""A stop under Prefect (tasks/stops.py, mugrpo/cli/lifecycle.py): Prefect's SIGTERM bridge (``capture_sigterm``,
what its flow engine installs while a flow runs) re-sends the SIGTERM it took to this process on its way out; that
copy must not read as a second signal, which would SIGKILL the jobs at once instead of giving them their share of
the grace (``job_grace_s``) to save their work. A real second SIGTERM still stops at once. Prefect's crash lines of
a stop stay off the console, and the stop's message names the signal and the resume command."""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mugrpo.common.preemption import job_grace_s

REPO_ROOT = Path(__file__).resolve().parents[2]

HELPER = """
import subprocess, sys, time
from prefect.utilities.engine import capture_sigterm  # the SIGTERM bridge of Prefect's flow engine
from tasks.stops import StopController
from tasks.launchers.processes import PROCESSES
grace = float(sys.argv[1])
stops = StopController(grace, lambda line: print(line, flush=True), lambda: "resume with: mugrpo resume R").install()
job = subprocess.Popen(  # a job that takes its whole grace: only the SIGKILL ends it
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True);"
     " time.sleep(600)"],
    start_new_session=True,
    stdout=subprocess.PIPE,
)
PROCESSES.track(job.pid)
job.stdout.readline()  # it ignores SIGTERM from now on
try:
    with capture_sigterm():
        print("ready", job.pid, flush=True)
        time.sleep(600)
except BaseException as e:
    print("unwound", type(e).__name__, flush=True)
    stops.finish()
"""


def _start(grace: float):
    proc = subprocess.Popen(
        [sys.executable, "-c", HELPER, str(grace)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PREFECT_LOGGING_LEVEL": "WARNING"},
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("ready"), line
    return proc, int(line.split()[1])


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_prefects_resent_sigterm_is_no_second_signal_the_jobs_get_their_share(tmp_path):
    grace = 4.0
    proc, job = _start(grace)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        time.sleep(job_grace_s(grace) - 0.5)
        assert _alive(job), "the job was SIGKILLed before its share of the grace (Prefect's copy read as a 2nd signal)"
        code = proc.wait(timeout=20)
    finally:
        proc.kill()
    took = time.monotonic() - t0
    out = proc.stdout.read()
    assert code == 143, out
    assert "unwound TerminationSignal" in out, out  # Prefect's bridge took the signal; its copy raised nothing
    assert job_grace_s(grace) - 0.2 <= took <= grace + 1.0, (took, out)
    assert "resume with: mugrpo resume R" in out, out
    deadline = time.monotonic() + 5
    while _alive(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(job)


def test_a_real_second_sigterm_under_prefect_still_stops_at_once():
    proc, job = _start(20.0)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)  # Prefect's copy came and went
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=20) == 143
    finally:
        proc.kill()
    assert time.monotonic() - t0 < 5, "a second SIGTERM waited for the jobs' share of the grace"


class _Stops:
    stopping = False


@pytest.fixture
def console():
    """A console handler on a ``prefect.flow_runs`` logger, as Prefect's logging setup adds one."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("prefect.flow_runs.test_stop_prefect")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)


def test_prefects_crash_lines_of_a_stop_stay_off_the_console(console):
    from mugrpo.cli.lifecycle import quiet_stop_crashes

    logger, stream = console
    stops = _Stops()
    quiet_stop_crashes(stops)
    logger.error("Crash detected! Execution was aborted by a termination signal.")  # named: dropped before the count
    logger.error("Crash detected! Execution was interrupted by an unexpected exception: OSError")  # a real crash
    stops.stopping = True
    logger.error("Crash detected! Execution was interrupted by an unexpected exception: OSError")  # during a stop
    logger.info("Finished in state Crashed('Execution was aborted by an interrupt signal.')")
    logger.info("Finished in state Completed()")
    assert stream.getvalue().splitlines() == [
        "Crash detected! Execution was interrupted by an unexpected exception: OSError",
        "Finished in state Completed()",
    ]


def test_the_stop_message_names_the_signal_and_the_resume_command():
    from tasks.stops import StopController

    stops = StopController(25.0, print, lambda: "stopped: committed work is kept. Continue with: mugrpo resume runs/r")
    stops.signum = signal.SIGTERM
    assert stops.message() == "stopped by SIGTERM; committed work is kept. Continue with: mugrpo resume runs/r"
    assert stops.reserve_s == 5.0 and stops.job_grace_s == job_grace_s(25.0) == 20.0
