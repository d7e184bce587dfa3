"""Pre-started jobs and the job fork server (tasks/launchers/, tasks/forkserver.py, mugrpo/jobs/forkserver.py),
with real processes: the stand-in job of tests/jobs_fixture.py, launched ahead of its run, then followed.

- A pre-started job is followed by the run of an equal request: one process, its early lines delivered, its
  outcome (even one it reached before the run) reported; jobs nobody follows are stopped by label as running jobs
  are (SIGTERM, then SIGKILL after the grace: one may be at work already), tracked until they are gone.
- While it waits it runs at a lower priority (its session's too, where the kernel groups by session), and is
  set back once followed.
- A forked job is a child of the fork server with its own command line and session, and takes its thread count
  from its own environment, as a new interpreter would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_launchers import FORK_ENV, JOB_ENV, alive, launcher, standin, wait_gone, write_spec

from tasks.launchers.errors import JobFailedError
from tasks.launchers.prestart import autogroup_nice, can_raise_priority, discard_prestarted
from tasks.launchers.processes import PROCESSES
from tasks.launchers.protocol import launch_job
from tasks.launchers.subprocess_launcher import SubprocessLauncher


@pytest.fixture(params=["spawn", "fork"])
def start(request) -> str:
    return request.param


def wait_for(path: Path, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    time.sleep(0.05)  # written whole
    return json.loads(path.read_text())


def wait_untracked(pgid: int, timeout_s: float = 30.0) -> None:
    """Wait until the process table no longer tracks job group ``pgid`` (its stop is over)."""
    deadline = time.monotonic() + timeout_s
    while pgid in PROCESSES.groups():
        assert time.monotonic() < deadline, f"job group {pgid} is still tracked {timeout_s:.0f} s on"
        time.sleep(0.05)


def proc_nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_a_prestarted_job_is_followed_not_started_again(start, tmp_path):
    gate, pids, counter = tmp_path / "gate", tmp_path / "pids.json", tmp_path / "attempts"
    spec = write_spec(
        tmp_path / "spec.json",
        before=["getting ready"],
        pid_file=str(pids),
        counter_file=str(counter),
        gate_file=str(gate),
        after=["done"],
    )
    request = standin(spec)
    impl = launcher(start)
    assert impl.prestart(request)
    assert impl.prestart(request)  # an equal request while it waits: still the one job
    job = wait_for(pids)["job"]
    assert alive(job)
    seen: list[str] = []

    def on_line(line: str) -> None:
        seen.append(line)
        if line == "attempt 1":
            gate.touch()

    result = launch_job(request, launcher(start), on_line=on_line)
    assert result.exit_code == 0 and result.job_id == f"pid {job}"
    assert seen[0] == f"following the standin job pre-started as pid {job}"
    assert seen[1:] == ["getting ready", "attempt 1", "done"]  # the lines printed before the run included
    assert counter.read_text() == "1"  # one process ran the job
    assert discard_prestarted() == 0


def test_an_outcome_reached_before_the_run_is_reported(start, tmp_path):
    spec = write_spec(tmp_path / "spec.json", before=["failing early"], exit_code=3, pid_file=str(tmp_path / "p"))
    request = standin(spec)
    launcher(start).prestart(request)
    assert wait_gone([wait_for(tmp_path / "p")["job"]], timeout_s=30) == []
    with pytest.raises(JobFailedError) as info:
        launch_job(request, launcher(start))
    assert info.value.exit_code == 3 and "failing early" in info.value.last_lines


def test_unfollowed_prestarted_jobs_are_stopped_by_label(start, tmp_path):
    requests = {}
    for run in ("a", "b"):
        spec = write_spec(tmp_path / f"{run}.json", pid_file=str(tmp_path / f"{run}.pid"), sleep_s=600)
        req = standin(spec)
        requests[run] = type(req)(**{**req.__dict__, "labels": {"run": run, "stage": "1"}})
        launcher(start).prestart(requests[run])
    pids = {run: wait_for(tmp_path / f"{run}.pid")["job"] for run in requests}
    assert launcher(start).discard_prestarted({"run": "a"}) == 1
    assert wait_gone([pids["a"]]) == [] and alive(pids["b"])
    assert discard_prestarted() == 1
    assert wait_gone([pids["b"]]) == []


def test_a_discarded_prestarted_job_gets_sigterm_and_stays_tracked_until_it_is_gone(start, tmp_path):
    """A pre-started job may pass its start gate (its inputs were committed) before the run follows it, e.g. a train
    job that reached a checkpoint commit when a stop unwinds the flow, which discards the jobs no run followed. It
    gets SIGTERM, as a running job does, not SIGKILL, so it can save; and its group stays tracked until it is gone,
    so the stop's wait sees it (tasks/stops.py gives the tracked groups the jobs' share of the grace)."""
    term, pids = tmp_path / "term", tmp_path / "pids.json"
    spec = write_spec(tmp_path / "spec.json", pid_file=str(pids), sleep_s=600, term_file=str(term))
    launcher(start).prestart(standin(spec))
    job = wait_for(pids)["job"]
    assert discard_prestarted() == 1
    assert discard_prestarted() == 0  # no longer held as pre-started
    assert wait_gone([job], timeout_s=30) == []
    assert term.read_text() == "SIGTERM"  # it saw the SIGTERM (a SIGKILL leaves no file)
    wait_untracked(job)  # released once its stop is over


def test_a_discarded_prestarted_job_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    pids = tmp_path / "pids.json"
    spec = write_spec(tmp_path / "spec.json", pid_file=str(pids), sleep_s=600, ignore_term=True)
    SubprocessLauncher(kill_grace_s=0.5).prestart(standin(spec))
    job = wait_for(pids)["job"]
    assert SubprocessLauncher(kill_grace_s=0.5).discard_prestarted() == 1
    assert alive(job)  # SIGTERM ignored: still there within the grace
    assert job in PROCESSES.groups()
    assert wait_gone([job], timeout_s=30) == []  # SIGKILLed after it


def test_during_a_stop_a_discarded_prestarted_job_waits_for_the_stops_deadline(tmp_path):
    """During a stop the stop's own deadline for the jobs decides their SIGKILL (tasks/stops.py), not the launcher's
    grace: a discarded job still there after that grace is left to it, tracked."""
    pids = tmp_path / "pids.json"
    spec = write_spec(tmp_path / "spec.json", pid_file=str(pids), sleep_s=600, ignore_term=True)
    SubprocessLauncher(kill_grace_s=0.2).prestart(standin(spec))
    job = wait_for(pids)["job"]
    PROCESSES.stopping.set()
    try:
        assert SubprocessLauncher(kill_grace_s=0.2).discard_prestarted() == 1
        time.sleep(1.0)
        assert alive(job) and job in PROCESSES.groups()  # past the launcher's grace, still there: the stop decides
        os.killpg(job, 9)  # the stop's SIGKILL at its deadline
        assert wait_gone([job], timeout_s=30) == []
        wait_untracked(job)
    finally:
        PROCESSES.stopping.clear()


@pytest.mark.skipif(not can_raise_priority(), reason="needs CAP_SYS_NICE to raise the priority back")
def test_a_waiting_job_runs_at_a_lower_priority_until_followed(start, tmp_path):
    gate, pids = tmp_path / "gate", tmp_path / "pids.json"
    spec = write_spec(tmp_path / "spec.json", pid_file=str(pids), gate_file=str(gate), print_env=["X"])
    request = standin(spec)
    launcher(start).prestart(request)
    job = wait_for(pids)["job"]
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert proc_nice(job) == base + 10
    # Where the kernel shares the CPU between sessions first (autogroups), the job's own new session is lowered
    # too: a new session's autogroup starts at nice 0. A process in a cpu cgroup of its own shows no autogroup.
    if autogroup_nice(job) is not None:
        assert autogroup_nice(job) == 10
    niceness: list[int] = []

    def on_line(line: str) -> None:
        if line == "attempt 1":
            niceness.append(proc_nice(job))
            gate.touch()

    launch_job(request, launcher(start), on_line=on_line)
    assert niceness == [base]


def test_a_forked_job_is_its_own_process_with_its_own_threads(tmp_path):
    """Two jobs forked from one server: each a child of it, in its own session, showing its own command line;
    each with the torch thread count of its own OMP_NUM_THREADS (the server imported torch under another)."""
    env = {**FORK_ENV, "MUGRPO_FORKSERVER_PRELOAD": "torch"}
    seen: dict[str, dict] = {}
    for threads in ("1", "2"):
        gate, pids = tmp_path / f"gate{threads}", tmp_path / f"pids{threads}.json"
        spec = write_spec(tmp_path / f"spec{threads}.json", pid_file=str(pids), gate_file=str(gate), print_threads=True)
        info: dict = {"lines": []}

        def on_line(line: str, info=info, gate=gate, pids=pids) -> None:
            info["lines"].append(line)
            if line == "attempt 1":
                pid = json.loads(pids.read_text())["job"]
                info["pid"] = pid
                info["cmdline"] = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split()
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                info["ppid"], info["sid"] = int(stat[1]), int(stat[3])
                gate.touch()

        launch_job(standin(spec, env={**env, "OMP_NUM_THREADS": threads}), SubprocessLauncher(fork=True), on_line)
        seen[threads] = info
    one, two = seen["1"], seen["2"]
    assert "torch threads 1" in one["lines"] and "torch threads 2" in two["lines"]
    assert one["ppid"] == two["ppid"] != os.getpid()  # both forked by the same server
    server = Path(f"/proc/{one['ppid']}/cmdline").read_bytes()
    assert b"mugrpo.jobs.forkserver" in server
    for info in (one, two):
        assert info["sid"] == info["pid"]  # its own session and process group
        assert info["cmdline"][1:3] == [b"-m", b"jobs_fixture"]  # its own command line, not the server's
    assert JOB_ENV["PYTHONPATH"]


def test_jobs_die_with_their_fork_server(tmp_path):
    """A dead fork server leaves no job behind (its children's parent-death signal); the next job starts a new
    server."""
    from tasks import forkserver

    pids = tmp_path / "pids.json"
    spec = write_spec(tmp_path / "spec.json", pid_file=str(pids), sleep_s=600)
    result: dict = {}

    def run() -> None:
        try:
            launch_job(standin(spec), SubprocessLauncher(fork=True))
        except JobFailedError as e:
            result["error"] = e

    runner = threading.Thread(target=run)
    runner.start()
    job = wait_for(pids)["job"]
    server_pid = int(Path(f"/proc/{job}/stat").read_text().rsplit(")", 1)[1].split()[1])
    forkserver.close_servers()
    assert wait_gone([job, server_pid]) == []
    runner.join(timeout=30)
    assert "error" in result and result["error"].exit_code == -9
    spec2 = write_spec(tmp_path / "spec2.json", before=["again"])
    assert "again" in launch_job(standin(spec2), SubprocessLauncher(fork=True)).last_lines


def test_a_killed_launchers_fork_server_folder_is_swept(tmp_path):
    """A launcher SIGKILLed while its fork server runs can clean nothing up: the server dies with it (its
    parent-death signal) and its socket folder stays behind, until the next scratch folder made on this machine
    (any trainer's or server's, mugrpo.common.scratch) sweeps the folders of dead processes."""
    from mugrpo.common.scratch import sweep_orphans

    driver = (
        "import os, sys, time\n"
        "from tasks.forkserver import ForkServer\n"
        "from tasks.launchers.processes import parent_death_signal\n"
        "server = ForkServer(sys.executable, dict(os.environ), parent_death_signal())\n"
        "print(server.dir, server.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {**os.environ, **FORK_ENV, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    launcher_proc = subprocess.Popen([sys.executable, "-c", driver], env=env, stdout=subprocess.PIPE, text=True)
    try:
        folder, server = launcher_proc.stdout.readline().split()
    finally:
        launcher_proc.kill()
        launcher_proc.wait()
    assert wait_gone([int(server)]) == []  # the server died with its launcher
    assert (Path(folder) / "jobs.sock").exists()  # and nobody removed its folder
    assert Path(folder) in sweep_orphans()
    assert not Path(folder).exists()
