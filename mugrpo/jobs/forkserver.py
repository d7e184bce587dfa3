"""The job fork server: one process per run and interpreter that has imported what every job imports, and forks
a fresh job process from itself on request.

    python -m mugrpo.jobs.forkserver SOCKET      # started by the subprocess launcher (tasks/forkserver.py)

A cold job spends its first seconds importing torch, transformers, accelerate and the mugrpo libraries (6-7 s of
CPU on a 2-core machine, three jobs per stage). The server pays that once: it imports them at start (nothing
else: no torch operation, no thread, so a fork is safe), then serves requests on a Unix socket. Each request forks
a child that becomes exactly the job ``python -m MODULE ARGS`` would have started: its own session (process
group), the request's environment, working directory and command line (``/proc/PID/cmdline`` shows the job's
command, setproctitle), stdout and stderr on the pipe the launcher passed (``SCM_RIGHTS``), torch's thread count
from ``OMP_NUM_THREADS`` as a fresh interpreter would read it, and ``runpy.run_module(MODULE, run_name="__main__")``.
It exits as an interpreter does (non-daemon threads joined, atexit handlers run). A job is still a separate
process that talks to the others only through files: nothing it computes survives it, and the modules it
imports were imported, not used, before the fork.

Protocol (one connection per job): the launcher sends a 4-byte big-endian length and a JSON request
``{"argv": [MODULE, ARG...], "env": {...}, "cwd": PATH, "nice": N, "title": CMD}`` with the pipe's write end as
ancillary data; the server answers one line ``{"pid": PID}``, and one line ``{"exit": CODE}`` when the child is
gone (CODE < 0: killed by signal -CODE), then closes the connection. The server's own death kills its children
(``PR_SET_PDEATHSIG``), and it dies with the process that started it.
"""

from __future__ import annotations

import array
import ctypes
import gc
import json
import os
import select
import signal
import socket
import struct
import sys

#: What every job imports before its first useful work; imported once, here (``MUGRPO_FORKSERVER_PRELOAD``, a
#: comma-separated list, replaces it: an interpreter without these packages, e.g. a vLLM one, names its own).
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "accelerate",
    "mugrpo.trainer.loop",
    "mugrpo.generation",
    "mugrpo.evaluation.worker",
    "mugrpo.engines.transformers_engine",
)
PRELOAD_ENV = "MUGRPO_FORKSERVER_PRELOAD"
#: Seconds between two looks for exited children when no request arrives.
REAP_S = 0.05
_PR_SET_PDEATHSIG = 1


def _die_with_parent(libc) -> None:
    """SIGKILL this process when its parent dies (Linux); exit at once if the parent is already gone."""
    parent = os.getppid()
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent or parent == 1:
        os._exit(137)


def _receive(conn: socket.socket) -> tuple[dict, int]:
    """One request: (its JSON, the output fd passed with it).

    Raises:
        ValueError: a malformed request or no fd.
    """
    fds = array.array("i")
    header, ancdata, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if len(header) != 4 or len(fds) != 1:
        raise ValueError("a request is a 4-byte length with one file descriptor, then JSON")
    (size,) = struct.unpack(">I", header)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("connection closed inside a request")
        body += chunk
    return json.loads(body), fds[0]


def _lower_priority(nice: int) -> None:
    """Run this new session ``nice`` lower: the process (its threads and children inherit it) and, where the kernel
    shares the CPU between sessions first (autogroups), the session's group."""
    os.nice(nice)
    try:
        with open("/proc/self/autogroup") as f:
            base = int(f.read().split("nice")[1])
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(base + nice))
    except (OSError, IndexError, ValueError):
        pass


def _set_title(title: str | None) -> None:
    """Show ``title`` as this process's command line (``/proc/PID/cmdline``, ``ps``); ``None``: set it up only (the
    server does, at start, while its environment is its own). Without setproctitle the server's line stays."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(setproctitle.getproctitle() if title is None else title)


def _apply_threads(env: dict[str, str]) -> None:
    """torch's intra-op thread count as a fresh interpreter started with ``env`` would set it: torch read the
    server's ``OMP_NUM_THREADS`` when it was imported, not the job's."""
    import torch

    value = env.get("OMP_NUM_THREADS") or env.get("MKL_NUM_THREADS")
    if value and value.isdigit() and int(value) > 0:
        torch.set_num_threads(int(value))


def _become_job(request: dict, out_fd: int, sockets: list[socket.socket], libc) -> None:
    """In the forked child: turn into the job of ``request`` and run it; never returns. ``sockets``: the
    server's own (listener, connections), closed first."""
    code = 1
    try:
        for sock in sockets:
            sock.close()
        os.setsid()  # its own session and process group: the launcher kills the group
        _die_with_parent(libc)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if request.get("nice"):
            _lower_priority(int(request["nice"]))
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # the server's stdin is the launcher's pipe; a job reads nothing
        os.close(devnull)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        _set_title(request["title"])  # before the environment changes: setproctitle finds argv through it
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _apply_threads(request["env"])
        module, *args = request["argv"]
        sys.argv = [module, *args]
        import runpy

        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        _finalize()
    except BaseException:  # noqa: BLE001  the job's own uncaught error, as an interpreter would print it
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _finalize() -> None:
    """What an interpreter does at exit before it tears down: join non-daemon threads, run atexit handlers."""
    import atexit
    import threading

    threading._shutdown()  # noqa: SLF001  (the interpreter's own exit step)
    atexit._run_exitfuncs()  # noqa: SLF001


def _status(code: int) -> int:
    """Exit code as subprocess reports it: the code, or -SIGNAL."""
    if os.WIFSIGNALED(code):
        return -os.WTERMSIG(code)
    return os.WEXITSTATUS(code)


def serve(path: str) -> None:
    """Import :data:`PRELOAD`, listen on the Unix socket ``path``, print ``ready``, fork jobs until stdin closes
    (the launcher is gone) or the server is killed."""
    import importlib

    libc = ctypes.CDLL(None, use_errno=True)
    for name in os.environ.get(PRELOAD_ENV, ",".join(PRELOAD)).split(","):
        if name.strip():
            importlib.import_module(name.strip())
    # The imports leave ~420,000 objects the garbage collector tracks (torch, transformers, sympy): each full
    # collection in a job (an engine's close collects, to free its model at once) walked them all, ~0.2 s of CPU, and
    # wrote to each one's header, copying the server's pages into the job. Frozen here, they stay out of every
    # collection of every job forked from now on (they live as long as the process anyway); the job's own objects
    # are collected as before.
    gc.collect()
    gc.freeze()
    _set_title(None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], REAP_S)
        if sys.stdin in readable and not sys.stdin.buffer.read1(1):
            break  # the launcher closed our stdin: it is gone
        if listener in readable:
            conn, _ = listener.accept()
            try:
                request, out_fd = _receive(conn)
            except (OSError, ValueError) as e:
                print(f"forkserver: bad request: {e}", file=sys.stderr, flush=True)
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                _become_job(request, out_fd, [listener, conn, *children.values()], libc)
            os.close(out_fd)
            children[pid] = conn
            conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall((json.dumps({"exit": _status(status)}) + "\n").encode())
                except OSError:
                    pass
                conn.close()
    for pid in list(children):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: ``python -m mugrpo.jobs.forkserver SOCKET``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        from mugrpo.common.exit_codes import ExitCode

        print("usage: python -m mugrpo.jobs.forkserver SOCKET", file=sys.stderr)
        raise SystemExit(ExitCode.ASKED_WRONG)
    _die_with_parent(ctypes.CDLL(None, use_errno=True))
    serve(args[0])


if __name__ == "__main__":
    main()
