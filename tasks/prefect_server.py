"""The temporary Prefect server of a local ``mugrpo run`` (no ``PREFECT_API_URL``), started by the CLI itself.

Prefect's own temporary server (``SubprocessASGIServer``) is a child in the caller's process group: a Ctrl-C in
the terminal (SIGINT to the foreground group) or a SIGTERM to the group (``timeout``, ``docker stop``) killed it at
once, while the flow still needed it to report its state and drain its events, so the flow hung in the client's
retries. This one runs the same ASGI app (``prefect.server.api.server:create_app`` under uvicorn, UI off) in a
session of its own, so a signal to the CLI's group never reaches it; the CLI stops it explicitly (its whole
session: SIGTERM, then SIGKILL) after the flow is done with it, at a clean exit or a stop (:mod:`tasks.stops`);
a CLI killed hard takes it along (the kernel's parent-death signal, Linux).

Prefect is not imported here: the API URL has to be in the environment before Prefect reads its settings.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tasks.launchers.processes import parent_death_signal, stop_group

#: Set (to the API URL) in the CLI's environment while it runs on a server it started: the flow holds no
#: Prefect global-concurrency slot there (flows/exclusive.py; the run lease in storage still fences writers).
TEMPORARY_SERVER_ENV = "MUGRPO_TEMPORARY_PREFECT_SERVER"
#: Seconds to wait for ``/api/health`` (Prefect's own ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` if set).
DEFAULT_START_TIMEOUT_S = 180.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TemporaryPrefectServer:
    """A Prefect API server on a free 127.0.0.1 port, in its own session; :meth:`stop` kills the session."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self, *, timeout_s: float | None = None, stopping: Callable[[], bool] = lambda: False) -> str:
        """Start the server and wait until it answers ``/api/health``; returns the API URL.

        Raises:
            RuntimeError: it exited or did not answer within ``timeout_s``.
            KeyboardInterrupt: ``stopping()`` turned true while it started.
        """
        spec = importlib.util.find_spec("prefect")
        assert spec is not None and spec.submodule_search_locations, "prefect is not installed"
        app_dir = str(Path(list(spec.submodule_search_locations)[0]).parent)
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        env.pop("PREFECT_API_URL", None)
        with self._lock:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--app-dir", app_dir, "--factory",
                 "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                 "--log-level", "error", "--lifespan", "on"],
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a signal to the CLI's process group does not reach it
                preexec_fn=parent_death_signal(),  # a CLI killed hard (SIGKILL) leaves no server behind
            )  # fmt: skip
        atexit.register(self.stop)  # registered before Prefect's own exit handlers: runs after their event drain
        timeout_s = timeout_s or float(
            os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or DEFAULT_START_TIMEOUT_S
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if stopping():
                raise KeyboardInterrupt("stopping while the temporary Prefect server started")
            if self.proc.poll() is not None:
                raise RuntimeError(f"the temporary Prefect server exited with {self.proc.returncode} before answering")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as r:
                    if r.status == 200 and json.loads(r.read()) is True:
                        return self.api_url
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the temporary Prefect server did not answer within {timeout_s:.0f} s")
            time.sleep(0.2)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the server's session, SIGKILL it after ``grace_s``. Idempotent; safe from any thread."""
        with self._lock:
            proc, self.proc = self.proc, None
        if proc is None:
            return
        stop_group(proc, grace_s)
