"""Prefect test fixtures: a real local ``prefect server`` (SQLite in a temporary PREFECT_HOME), the API pointed at
it, and a ``process`` work pool served by a real ``prefect worker``. No mocks, no network beyond 127.0.0.1.

Each is started once per pytest process, however many test modules import it, and stopped when pytest ends: the
server start (~25 s on this loaded 2-core machine, up to 120 s allowed) is paid once. Import the fixtures you use
(with everything they depend on):

    from _prefect import prefect_api, prefect_server, process_worker  # noqa: F401  (fixtures)

    def test_flow(prefect_api):            # flows/tasks in this process talk to the test server
        my_flow()

    def test_deployment(process_worker):   # end to end: deployment -> worker -> flow-run subprocess
        deployment_id = deploy_local_flow("flows/run.py:run_flow", name="e2e", pool=process_worker.pool)
        run = run_deployment_and_wait(deployment_id, parameters={"config": cfg.to_json_dict()}, timeout_s=600)
        assert run.state.is_completed(), run.state.message

``deploy_local_flow`` registers a deployment whose code is this checkout (pull step: set the working directory),
the same shape as infra/prefect.yaml without an image. The worker runs each flow run as a subprocess with the
worker's environment (PREFECT_API_URL of the test server, PYTHONPATH of this checkout); kill it, or its children,
to test preemption. ``process_worker.log_path`` holds the worker's output (flow-run output included) for
assertion messages.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tasks.launchers.processes import stop_group

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Seconds allowed for `prefect server start` to answer /api/health (2 shared cores: starts take 20-60 s).
SERVER_START_TIMEOUT_S = 120.0
#: Seconds allowed for a worker to register with the server.
WORKER_START_TIMEOUT_S = 90.0


def prefect_cli() -> str:
    """The ``prefect`` console script of this interpreter's environment."""
    return str(Path(sys.executable).with_name("prefect"))


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (free when returned; the caller binds it right away)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "<no output>"


def _stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the process group of ``proc`` (started with start_new_session), then SIGKILL after ``grace_s``."""
    stop_group(proc, grace_s, kill_wait_s=10.0)


#: The reaper: blocks on its stdin (a pipe whose only writer is this pytest process) and, at EOF (pytest exited by
#: any means: a clean end, an internal error, SIGTERM, SIGKILL, a lost xdist worker), kills the process group
#: given as argument. Runs in its own session, so a signal to pytest's group does not end it first.
_REAPER = (
    "import os, signal, sys\n"
    "sys.stdin.buffer.read()\n"
    "for sig in (signal.SIGTERM, signal.SIGKILL):\n"
    "    try:\n"
    "        os.killpg(int(sys.argv[1]), sig)\n"
    "    except ProcessLookupError:\n"
    "        break\n"
    "    if sig == signal.SIGTERM:\n"
    "        import time; time.sleep(5)\n"
)


def _reap_at_exit(stack: ExitStack | None, proc: subprocess.Popen) -> None:
    """Kill the process group (session) of ``proc`` when this pytest process ends, even abnormally: the
    fixtures' cleanup (:func:`_stop`) does not run when pytest is killed, and a server left behind holds its port
    and its SQLite database (the orphaned ``prefect server`` processes seen after test runs)."""
    read, write = os.pipe()  # non-inheritable: only the reaper (its stdin) holds the read end
    try:
        subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(proc.pid)],
            stdin=read,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        os.close(read)
    if stack is not None:
        stack.callback(os.close, write)  # after _stop: the reaper finds nothing left and exits
    # (else the write end closes when this process exits, whatever way it does)


def _base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
    )
    return env


@dataclass(frozen=True)
class PrefectServer:
    """A running test server: its API URL (``http://127.0.0.1:PORT/api``), home folder and log file."""

    api_url: str
    home: Path
    log_path: Path


@dataclass(frozen=True)
class ProcessWorker:
    """A running ``prefect worker`` serving ``pool`` (type ``process``); its output goes to ``log_path``."""

    pool: str
    name: str
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, n: int = 60) -> str:
        """The last ``n`` lines of the worker's output (flow-run subprocess output included)."""
        return _tail(self.log_path, n)


#: One server, API setting and worker per pytest process. Test modules import these fixtures, and pytest keeps one
#: fixture definition per importing module, so "session scope" alone would start one server per module.
_SHARED: dict[str, Any] = {}


def _shared(request: pytest.FixtureRequest, key: str, start: Callable[[ExitStack], Any]) -> Any:
    """``start(stack)`` once per pytest process; ``stack`` is closed when pytest ends (last started, first closed)."""
    if key not in _SHARED:
        stack = ExitStack()
        try:
            _SHARED[key] = start(stack)
        except BaseException:
            stack.close()
            raise
        request.config.add_cleanup(stack.close)
    return _SHARED[key]


def _start_server(stack: ExitStack, home: Path) -> PrefectServer:
    port = free_port()
    env = _base_env(home)
    env["PREFECT_API_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{home / 'prefect.db'}"
    log_path = home / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                prefect_cli(),
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-ui",
                "--analytics-off",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _reap_at_exit(None, proc)
    # Stopped at interpreter exit, after Prefect's own exit handlers (registered later, run earlier) have shipped
    # this process's queued logs and events to it: stopped with the fixtures, it left them retrying a dead server.
    atexit.register(_stop, proc)
    api_url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"prefect server exited with {proc.returncode} before answering:\n{_tail(log_path)}")
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=5) as r:
                if r.status == 200 and json.loads(r.read()) is True:
                    return PrefectServer(api_url=api_url, home=home, log_path=log_path)
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"prefect server did not answer within {SERVER_START_TIMEOUT_S:.0f} s:\n{_tail(log_path)}")
        time.sleep(0.5)


def _point_api(stack: ExitStack, api_url: str) -> str:
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings

    mp = stack.enter_context(pytest.MonkeyPatch.context())
    mp.setenv("PREFECT_API_URL", api_url)
    mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    stack.enter_context(temporary_settings(updates={PREFECT_API_URL: api_url, PREFECT_SERVER_ANALYTICS_ENABLED: False}))
    return api_url


def _start_worker(stack: ExitStack, api_url: str, home: Path) -> ProcessWorker:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker as PrefectProcessWorker

    pool = f"test-process-{uuid.uuid4().hex[:8]}"
    name = f"{pool}-worker"
    with get_client(sync_client=True) as client:
        client.create_work_pool(
            WorkPoolCreate(
                name=pool, type="process", base_job_template=PrefectProcessWorker.get_default_base_job_template()
            )
        )
    env = _base_env(home)
    env.update(
        PREFECT_API_URL=api_url,
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_WORKER_HEARTBEAT_SECONDS="5",
        PREFECT_LOGGING_LEVEL="INFO",
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
    )
    log_path = home / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [prefect_cli(), "worker", "start", "--pool", pool, "--type", "process", "--name", name],
            env=env,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _reap_at_exit(stack, proc)
    stack.callback(_stop, proc)
    worker = ProcessWorker(pool=pool, name=name, process=proc, log_path=log_path)
    deadline = time.monotonic() + WORKER_START_TIMEOUT_S
    with get_client(sync_client=True) as client:
        while not any(w.name == name for w in client.read_workers_for_work_pool(pool)):
            if proc.poll() is not None:
                pytest.fail(f"prefect worker exited with {proc.returncode}:\n{worker.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"prefect worker did not register in {WORKER_START_TIMEOUT_S:.0f} s:\n{worker.log_tail()}")
            time.sleep(0.5)
    return worker


@pytest.fixture(scope="session")
def prefect_server(request, tmp_path_factory) -> PrefectServer:
    """A ``prefect server start`` on a free 127.0.0.1 port with SQLite in a temporary PREFECT_HOME, answering
    ``/api/health``; stopped (its whole process group) when pytest ends. One per pytest process."""
    return _shared(request, "server", lambda stack: _start_server(stack, tmp_path_factory.mktemp("prefect-home")))


@pytest.fixture(scope="session")
def prefect_api(request, prefect_server: PrefectServer) -> str:
    """Point this process (Prefect settings) and its children (``PREFECT_API_URL`` in the environment) at the test
    server until pytest ends; returns the API URL."""
    return _shared(request, "api", lambda stack: _point_api(stack, prefect_server.api_url))


@pytest.fixture(scope="session")
def process_worker(request, prefect_api: str, tmp_path_factory) -> ProcessWorker:
    """A ``process`` work pool on the test server served by ``prefect worker start --pool NAME --type process``
    (registered before this returns); the worker (its process group) is stopped when pytest ends."""
    return _shared(
        request, "worker", lambda stack: _start_worker(stack, prefect_api, tmp_path_factory.mktemp("prefect-worker"))
    )


def deploy_local_flow(
    entrypoint: str,
    *,
    name: str,
    pool: str,
    source: Path = REPO_ROOT,
    parameters: dict[str, Any] | None = None,
    job_variables: dict[str, Any] | None = None,
) -> uuid.UUID:
    """Register a deployment of ``entrypoint`` (``path/to/file.py:flow_fn``, relative to ``source``) on ``pool``,
    whose code is the local folder ``source``; returns the deployment id. Loads the flow once in this process."""
    from prefect import flow

    return flow.from_source(source=str(source), entrypoint=entrypoint).deploy(
        name=name,
        work_pool_name=pool,
        parameters=parameters or {},
        job_variables=job_variables or {},
        build=False,
        push=False,
        print_next_steps=False,
        ignore_warnings=True,
    )


def run_deployment_and_wait(
    deployment_id: uuid.UUID, *, parameters: dict[str, Any] | None = None, timeout_s: float = 300.0
) -> Any:
    """Create a flow run of the deployment, wait until it reaches a final state (or ``timeout_s``); returns the
    flow run (check ``.state``)."""
    from prefect.deployments import run_deployment

    return run_deployment(deployment_id, parameters=parameters or {}, timeout=timeout_s, poll_interval=1)


def flow_run_logs(flow_run_id: uuid.UUID, *, wait_for: str | None = None, timeout_s: float = 30.0) -> list[str]:
    """Messages of the flow run's logs (its task runs included), oldest first, at most 200. Flushes this process's
    API log handler; with ``wait_for``, polls until a message contains it (logs are shipped in batches)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    deadline = time.monotonic() + timeout_s
    while True:
        with get_client(sync_client=True) as client:
            logs = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                sort=LogSort.TIMESTAMP_ASC,
                limit=200,
            )
        messages = [log.message for log in logs]
        if wait_for is None or any(wait_for in m for m in messages) or time.monotonic() > deadline:
            return messages
        time.sleep(0.5)
