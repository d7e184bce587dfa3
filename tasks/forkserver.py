"""The subprocess launcher's side of the job fork server (:mod:`mugrpo.jobs.forkserver`): start one server per
interpreter and base environment, ask it for job processes, and watch them like ``subprocess.Popen`` objects.

A server imports torch, transformers and the mugrpo libraries once (6-7 s of CPU on a 2-core machine); each job
is then a fork of it (tens of milliseconds) that becomes ``python -m mugrpo.jobs.KIND SPEC`` in its own session.
Servers are keyed by the job's interpreter and its environment less :data:`PER_JOB_ENV` (what the child sets
itself), so a job never runs in a process whose interpreter start saw another ``PYTHONPATH`` or other settings.
A server that cannot start (another OS, an interpreter without the preloaded packages) is remembered as such:
its jobs are started as plain processes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO

from mugrpo.common.processes import process_alive
from mugrpo.common.scratch import scratch_dir

logger = logging.getLogger(__name__)

#: Environment variables a forked job sets itself (they are read after start-up): jobs differing only in them
#: share a server.
PER_JOB_ENV = frozenset(
    {"MUGRPO_LEASE_TOKEN", "MUGRPO_STORAGE_OPTIONS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONUNBUFFERED"}
)
#: Seconds a server may take to import its modules and answer ``ready``.
START_TIMEOUT_S = 300.0

_LOCK = threading.Lock()
_SERVERS: dict[tuple, ForkServer | None] = {}  # None: this key's server failed to start; spawn instead


def supported() -> bool:
    """Whether jobs can be forked from a server here (Linux: Unix sockets with fd passing, ``PR_SET_PDEATHSIG``)."""
    return sys.platform.startswith("linux")


class ForkedProcess:
    """A job forked by a :class:`ForkServer`, with the ``subprocess.Popen`` surface the launcher uses: ``pid``
    (also its process group), ``stdout`` (text, its merged output), ``poll()``, ``wait()``, ``returncode``.

    The exit status comes from the server over the request's connection (the server is the parent that reaps
    it); a server that dies first kills the job (its parent-death signal) and the status reads as None.
    """

    def __init__(self, conn: socket.socket, pid: int, stdout: IO[str]) -> None:
        self.pid, self.stdout, self._conn = pid, stdout, conn
        self.returncode: int | None = None
        self._buf = b""
        self._lost = False

    def _read_status(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None and not self._lost:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, _, _ = select.select([self._conn], [], [], left)
            if not ready:
                return
            chunk = self._conn.recv(4096)
            if not chunk:  # the server died: its children died with it
                self._lost = True
                self._conn.close()
                if not process_alive(self.pid):
                    self.returncode = -int(signal.SIGKILL)
                return
            self._buf += chunk
            if b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                self.returncode = int(json.loads(line)["exit"])
                self._conn.close()

    def poll(self) -> int | None:
        """The exit code if the job has ended, else None (negative: killed by that signal)."""
        if self.returncode is None and self._lost:
            if not process_alive(self.pid):
                self.returncode = -int(signal.SIGKILL)
        else:
            self._read_status(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Block until the job ends; returns its exit code.

        Raises:
            subprocess.TimeoutExpired: ``timeout`` passed first.
        """
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            if self._lost:
                time.sleep(0.05)
            else:
                self._read_status(0.2 if end is None else max(min(0.2, end - time.monotonic()), 0.0))
        return self.returncode


class ForkServer:
    """One ``python -m mugrpo.jobs.forkserver`` process (module docstring), started with ``env``.

    Args:
        python: the interpreter.
        env: its environment.
        preexec: run in the server's process before exec (the launcher's parent-death signal).

    Raises:
        RuntimeError: the server did not report ready within :data:`START_TIMEOUT_S` (its last lines in the message).
    """

    def __init__(self, python: str, env: Mapping[str, str], preexec: Callable[[], None] | None = None) -> None:
        # a scratch folder named for this process: one left by a SIGKILLed launcher is swept by the next scratch_dir
        self.dir = str(scratch_dir("forkserver"))
        self.path = os.path.join(self.dir, "jobs.sock")
        self.proc = subprocess.Popen(
            [python, "-m", "mugrpo.jobs.forkserver", self.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
            preexec_fn=preexec,
        )
        ready, lines = False, []
        end = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < end:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if r:
                line = self.proc.stdout.readline()
                if not line:
                    break
                text = line.decode(errors="replace").rstrip()
                if text == "ready":
                    ready = True
                    break
                lines.append(text)
            elif self.proc.poll() is not None:
                break
        if not ready:
            self.close()
            raise RuntimeError("the job fork server did not start:\n" + "\n".join(lines[-20:]))
        threading.Thread(target=self._relay, name="forkserver-output", daemon=True).start()

    def _relay(self) -> None:
        """Pass the server's own lines (not its jobs': those have their own pipe) to the log."""
        for line in self.proc.stdout:
            logger.warning("job fork server: %s", line.decode(errors="replace").rstrip())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, argv: list[str], env: Mapping[str, str], *, nice: int = 0, title: str = "") -> ForkedProcess:
        """Fork a job ``python -m argv[0] argv[1:]`` with environment ``env`` (whole, not added to the server's).

        Raises:
            OSError: the server is unreachable.
        """
        read_fd, write_fd = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            body = json.dumps(
                {"argv": argv, "env": dict(env), "cwd": os.getcwd(), "nice": nice, "title": title}
            ).encode()
            conn.sendmsg([struct.pack(">I", len(body))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(
                memoryview(struct.pack("i", write_fd))))])  # fmt: skip
            conn.sendall(body)
            os.close(write_fd)
            write_fd = -1
            line = b""
            while not line.endswith(b"\n"):
                chunk = conn.recv(1)
                if not chunk:
                    raise OSError("the job fork server closed the connection before answering")
                line += chunk
            pid = int(json.loads(line)["pid"])
        except BaseException:
            conn.close()
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)
            raise
        stdout = open(read_fd, encoding="utf-8", errors="replace")  # noqa: SIM115  (closed by the launcher)
        return ForkedProcess(conn, pid, stdout)

    def close(self) -> None:
        """Stop the server (its jobs die with it) and remove its socket folder. Idempotent."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def server_key(python: str, env: Mapping[str, str]) -> tuple:
    """Which server a job of ``python`` with environment ``env`` may be forked from."""
    return python, tuple(sorted((k, v) for k, v in env.items() if k not in PER_JOB_ENV))


def server_for(python: str, env: Mapping[str, str], start: Callable[[], ForkServer]) -> ForkServer | None:
    """The live server of (``python``, ``env``), started with ``start()`` when there is none; None when one failed
    to start for that key before (its jobs are started as plain processes)."""
    key = server_key(python, env)
    with _LOCK:
        if key in _SERVERS and (_SERVERS[key] is None or _SERVERS[key].alive()):
            return _SERVERS[key]
        try:
            server: ForkServer | None = start()
        except (OSError, RuntimeError) as e:
            logger.warning("jobs of %s start as plain processes: %s", python, e)
            server = None
        _SERVERS[key] = server
        return server


def close_servers() -> None:
    """Stop every fork server of this process."""
    with _LOCK:
        servers = [s for s in _SERVERS.values() if s is not None]
        _SERVERS.clear()
    for server in servers:
        server.close()
