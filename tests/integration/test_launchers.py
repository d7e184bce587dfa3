"""Launchers and the run_job task, with real processes: a stand-in job (tests/jobs_fixture.py) run as a subprocess,
and Prefect flows against a real local Prefect server (tests/_prefect.py). The kubernetes launcher is
tested against a scripted fake Kubernetes API in test_kubernetes_launcher.py, its manifests in test_infra.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from _prefect import flow_run_logs, prefect_api, prefect_server  # noqa: F401  (fixtures)

from bench.support.chaos.procs import alive, wait_gone
from tasks.launchers.errors import JobFailedError, JobTimeoutError
from tasks.launchers.protocol import LAUNCHERS, TAIL_LINES, Launcher, launch_job, register_launcher
from tasks.launchers.request import JobRequest
from tasks.launchers.subprocess_launcher import SubprocessLauncher

pytestmark = pytest.mark.waits  # run first, it mostly waits: a job runs out its time limit before the kill

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent
#: The stand-in job module is found through PYTHONPATH, as a job's package would be in its environment.
JOB_ENV = {"PYTHONPATH": str(TESTS_DIR)}


#: The job fork server of a stand-in job imports nothing heavy (mugrpo.jobs.forkserver's preload list replaced).
FORK_ENV = {"MUGRPO_FORKSERVER_PRELOAD": "json"}


@pytest.fixture(params=["spawn", "fork"])
def start(request) -> str:
    """How the subprocess launcher starts a job: a new interpreter, or a fork of the job fork server."""
    return request.param


def launcher(start: str, **options) -> SubprocessLauncher:
    return SubprocessLauncher(fork=start == "fork", **options)


def write_spec(path: Path, **spec) -> str:
    path.write_text(json.dumps(spec))
    return str(path)


def standin(spec_url: str, timeout_s: float = 60.0, env: dict[str, str] | None = None) -> JobRequest:
    return JobRequest(
        kind="standin",
        spec_url=spec_url,
        timeout_s=timeout_s,
        module="jobs_fixture",
        env={**JOB_ENV, **FORK_ENV, **(env or {})},
    )


# ------------------------------------------------------------------------------------------- request and registry
def test_job_command_and_request_validation():
    req = JobRequest(kind="generate", spec_url="s3://bucket/run/specs/gen.json", timeout_s=10)
    assert req.command("/venv/bin/python") == [
        "/venv/bin/python",
        "-m",
        "mugrpo.jobs.generate",
        "s3://bucket/run/specs/gen.json",
    ]
    vllm = JobRequest(kind="generate", spec_url="spec.json", timeout_s=10, python="/opt/vllm/bin/python")
    assert vllm.command(sys.executable)[0] == "/opt/vllm/bin/python"
    for bad in (
        {"kind": "Generate"},
        {"kind": "../x"},
        {"module": "a..b"},
        {"timeout_s": 0},
        {"env": {"AWS_REGION": 1}},
    ):
        with pytest.raises(ValueError):
            JobRequest(**{"kind": "train", "spec_url": "s.json", "timeout_s": 1.0, **bad})


def test_launcher_registry():
    assert {"subprocess", "kubernetes"} <= set(LAUNCHERS)
    assert isinstance(LAUNCHERS["subprocess"](kill_grace_s=1), SubprocessLauncher)
    with pytest.raises(ValueError, match="registered: .*subprocess"):
        LAUNCHERS["slurm"]
    with pytest.raises(ValueError, match="already registered"):
        register_launcher("subprocess")(type("Other", (Launcher,), {"run": lambda self, r, f: None}))
    assert LAUNCHERS["subprocess"] is SubprocessLauncher and SubprocessLauncher.name == "subprocess"


# ------------------------------------------------------------------------------------------ subprocess launcher
def test_lines_stream_as_they_arrive_with_parent_env_and_extra_env(start, tmp_path, monkeypatch):
    monkeypatch.setenv("MUGRPO_TEST_PARENT", "from-parent")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # the launcher must set it: the job never flushes
    gate = tmp_path / "gate"
    spec = write_spec(
        tmp_path / "spec.json",
        before=["first"],
        stderr=["to stderr"],
        print_env=["MUGRPO_TEST_PARENT", "MUGRPO_TEST_EXTRA"],
        gate_file=str(gate),
        after=["last"],
    )
    seen: list[str] = []

    def on_line(line: str) -> None:
        seen.append(line)
        if line == "attempt 1":  # the job now waits for the gate: only a streamed line can open it
            gate.touch()

    result = launch_job(standin(spec, env={"MUGRPO_TEST_EXTRA": "extra"}), launcher(start), on_line=on_line)
    # Had the output been buffered until exit, the job would have waited for the gate in vain ("gate never
    # opened", exit 4): "last" proves the lines before it reached us while the job was still running.
    assert seen == [
        "first",
        "to stderr",
        "MUGRPO_TEST_PARENT=from-parent",
        "MUGRPO_TEST_EXTRA=extra",
        "attempt 1",
        "last",
    ]
    assert result.exit_code == 0 and result.seconds > 0 and result.launcher == "subprocess"
    assert result.last_lines == tuple(seen)


def test_a_forked_job_leaves_the_servers_imports_out_of_its_collections(start, tmp_path):
    """The fork server freezes what it imported (gc.freeze): a forked job's collections skip those objects, a new
    interpreter's have nothing frozen, and either collects the job's own garbage."""
    seen: list[str] = []
    spec = write_spec(tmp_path / "spec.json", print_gc=True)
    launch_job(standin(spec), launcher(start), on_line=seen.append)
    (line,) = [s for s in seen if s.startswith("gc frozen")]
    frozen, collected = int(line.split()[2]), int(line.split()[4])
    assert collected >= 1, line
    assert frozen > 1000 if start == "fork" else frozen == 0, line


def test_nonzero_exit_raises_with_the_last_lines(start, tmp_path):
    out = [f"line {i}" for i in range(30)]
    spec = write_spec(tmp_path / "spec.json", before=out, exit_code=3)
    with pytest.raises(JobFailedError) as info:
        launch_job(standin(spec), launcher(start))
    err = info.value
    assert err.exit_code == 3 and err.transient
    assert err.last_lines == (*out[-(TAIL_LINES - 1) :], "attempt 1")
    assert "exit code 3" in str(err) and "line 29" in str(err) and "line 10" not in str(err)
    # Exit code 2 (usage error, invalid spec) is not worth a retry.
    spec2 = write_spec(tmp_path / "spec2.json", exit_code=2)
    with pytest.raises(JobFailedError) as info2:
        launch_job(standin(spec2), launcher(start))
    assert info2.value.exit_code == 2 and not info2.value.transient


def test_timeout_kills_the_whole_process_group(start, tmp_path):
    pid_file = tmp_path / "pids.json"
    # Job and grandchild both ignore SIGTERM: only the SIGKILL to the group after the grace period ends them.
    spec = write_spec(
        tmp_path / "spec.json",
        before=["started"],
        grandchild=True,
        ignore_term=True,
        pid_file=str(pid_file),
        sleep_s=600,
    )
    with pytest.raises(JobTimeoutError) as info:
        launch_job(standin(spec, timeout_s=3.0), launcher(start, kill_grace_s=1.0))
    pids = json.loads(pid_file.read_text())
    assert set(pids) == {"job", "grandchild"}
    # Both ignore SIGTERM, so their being gone proves the SIGKILL to the group after the grace period.
    assert wait_gone(pids.values()) == [], f"survivors of the timeout kill: {pids}"
    assert info.value.timeout_s == 3.0 and "started" in info.value.last_lines and info.value.transient
    assert "exceeded its timeout of 3 s" in str(info.value)


def test_processes_left_behind_by_a_finished_job_are_killed(start, tmp_path):
    pid_file = tmp_path / "pids.json"
    spec = write_spec(tmp_path / "spec.json", grandchild=True, pid_file=str(pid_file))
    result = launch_job(standin(spec), launcher(start))
    grandchild = json.loads(pid_file.read_text())["grandchild"]
    assert result.exit_code == 0
    assert wait_gone([grandchild]) == []


def test_job_dies_with_a_sigkilled_flow_process(start, tmp_path):
    """A flow process killed with SIGKILL cannot clean up: the kernel kills its job (PR_SET_PDEATHSIG; a forked job
    dies with its fork server, which dies with the flow), so a re-run never races a stale job writing the same
    files."""
    pid_file = tmp_path / "pids.json"
    spec = write_spec(tmp_path / "spec.json", pid_file=str(pid_file), sleep_s=600)
    driver = (
        "import sys; from tasks.launchers.protocol import launch_job; from tasks.launchers.request import JobRequest; "
        "from tasks.launchers.subprocess_launcher import SubprocessLauncher; "
        f"launch_job(JobRequest(kind='standin', spec_url={spec!r}, timeout_s=600, module='jobs_fixture', "
        f"env={ {**JOB_ENV, **FORK_ENV}!r}), SubprocessLauncher(fork={start == 'fork'}))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)])}
    flow_proc = subprocess.Popen([sys.executable, "-c", driver], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            assert flow_proc.poll() is None, "the driver exited early"
            time.sleep(0.05)
        job_pid = json.loads(pid_file.read_text())["job"]
        assert alive(job_pid)
        os.kill(flow_proc.pid, signal.SIGKILL)
        flow_proc.wait()
        assert wait_gone([job_pid]) == [], "the job survived its flow process"
    finally:
        if flow_proc.poll() is None:
            flow_proc.kill()
            flow_proc.wait()


# -------------------------------------------------------------------------------------------- Prefect task
def test_task_defaults_follow_the_config():
    from mugrpo.config import OrchestrationSection
    from tasks.jobs import DEFAULT_RETRIES, DEFAULT_RETRY_DELAY_S, job_options, run_job

    defaults = OrchestrationSection()
    assert (run_job.retries, run_job.retry_delay_seconds) == (defaults.retries, defaults.retry_delay_s)
    assert (DEFAULT_RETRIES, DEFAULT_RETRY_DELAY_S) == (defaults.retries, defaults.retry_delay_s)
    task = run_job.with_options(
        **job_options(OrchestrationSection(retries=3, retry_delay_s=0.5), tags=["run:r1", "stage:0"])
    )
    assert (task.retries, task.retry_delay_seconds, task.tags) == (3, 0.5, {"run:r1", "stage:0"})
    assert task.retry_condition_fn is run_job.retry_condition_fn is not None


def test_run_job_logs_lines_retries_transient_failures_not_usage_errors(tmp_path, prefect_api):
    from prefect import flow

    from tasks.jobs import run_job

    ok = write_spec(tmp_path / "ok.json", before=["hello from the job"], stderr=["a warning on stderr"])
    flaky_counter, usage_counter = tmp_path / "flaky.count", tmp_path / "usage.count"
    flaky = write_spec(
        tmp_path / "flaky.json",
        counter_file=str(flaky_counter),
        fail_attempts=1,
        exit_code=1,
        before=["flaky job running"],
    )
    usage = write_spec(tmp_path / "usage.json", counter_file=str(usage_counter), exit_code=2)
    retrying = run_job.with_options(retries=2, retry_delay_seconds=0)

    @flow(name="launcher-test")
    def jobs_flow():
        first = run_job("standin", ok, module="jobs_fixture", env=JOB_ENV, timeout_s=60)
        second = retrying("standin", flaky, module="jobs_fixture", env=JOB_ENV, timeout_s=60)
        third = retrying("standin", usage, module="jobs_fixture", env=JOB_ENV, timeout_s=60, return_state=True)
        return first, second, third

    state = jobs_flow(return_state=True)
    first, second, third = state.result()
    assert first.exit_code == 0 and "hello from the job" in first.last_lines
    assert second.exit_code == 0 and flaky_counter.read_text() == "2"  # failed once, retried, succeeded
    assert third.is_failed() and usage_counter.read_text() == "1"  # exit code 2: no retry
    with pytest.raises(JobFailedError) as info:
        third.result()
    assert info.value.exit_code == 2

    logs = flow_run_logs(state.state_details.flow_run_id, wait_for="launching standin job (attempt 2")
    text = "\n".join(logs)
    assert "[standin] hello from the job" in text and "[standin] a warning on stderr" in text
    assert "launching standin job (attempt 2, subprocess launcher" in text
    assert "attempt 3" not in text
