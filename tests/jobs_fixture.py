"""A stand-in job for the launcher tests: ``python -m jobs_fixture SPEC.json`` (with ``tests/`` on PYTHONPATH).

It never flushes stdout by hand: lines arrive as printed only because the launcher sets PYTHONUNBUFFERED=1.

Like a real job it imports neither mugrpo nor Prefect and reads one JSON spec; the spec scripts its behavior:

    before: [str]       lines printed to stdout first
    stderr: [str]       lines printed to stderr next
    print_env: [str]    names of environment variables printed as NAME=value
    env_dir: str        with print_env: also write those lines to env_dir/rank-$RANK.txt (a launcher of several ranks
                        may relay its workers' stdout through log tailers that can lose the last lines at exit)
    gate_file: str      then wait (up to 120 s) until this file exists; if it never does, print "gate never opened"
                        and exit 4 (lets a test prove a line was streamed: it opens the gate on seeing the line)
    sleep_s: float      then sleep this long
    after: [str]        lines printed after the sleep
    exit_code: int      exit code (default 0)
    counter_file: str   with fail_attempts: count attempts in this file ...
    fail_attempts: int  ... and exit with exit_code only on the first fail_attempts attempts, then 0
    grandchild: bool    spawn a grandchild that ignores SIGTERM and sleeps (same process group)
    ignore_term: bool   ignore SIGTERM in the job itself (only SIGKILL ends it)
    term_file: str      on SIGTERM, write this file and exit 75 (a job that saved its work: only a SIGTERM, not a
                        SIGKILL, leaves the file)
    pid_file: str       write {"job": pid, "grandchild": pid} here once started
    print_threads: bool print "torch threads N" (imports torch: the fork server's preload may hold it)
    print_gc: bool      print "gc frozen N collected M": the objects kept out of collections (gc.freeze) and what a
                        collection finds of a reference cycle the job made
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if spec.get("term_file"):

        def saved(signum: int, frame: object) -> None:
            Path(spec["term_file"]).write_text("SIGTERM")
            os._exit(75)

        signal.signal(signal.SIGTERM, saved)
    attempt = 1
    if spec.get("counter_file"):
        counter = Path(spec["counter_file"])
        attempt = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(attempt))
    pids = {"job": os.getpid()}
    if spec.get("grandchild"):
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
        pids["grandchild"] = subprocess.Popen([sys.executable, "-c", code]).pid
    if spec.get("pid_file"):
        Path(spec["pid_file"]).write_text(json.dumps(pids))
    for line in spec.get("before", []):
        print(line)
    for line in spec.get("stderr", []):
        print(line, file=sys.stderr)
    env_lines = [f"{name}={os.environ.get(name)}" for name in spec.get("print_env", [])]
    for line in env_lines:
        print(line)
    if spec.get("env_dir"):
        out = Path(spec["env_dir"]) / f"rank-{os.environ.get('RANK')}.txt"
        out.write_text("".join(f"{line}\n" for line in env_lines))
    if spec.get("print_threads"):
        import torch

        print(f"torch threads {torch.get_num_threads()}")
    if spec.get("print_gc"):
        import gc

        cycle: list = []
        cycle.append(cycle)
        del cycle
        print(f"gc frozen {gc.get_freeze_count()} collected {gc.collect()}")
    print(f"attempt {attempt}")
    if spec.get("gate_file"):
        gate, deadline = Path(spec["gate_file"]), time.monotonic() + 120
        while not gate.exists():
            if time.monotonic() > deadline:
                print("gate never opened")
                return 4
            time.sleep(0.02)
    time.sleep(float(spec.get("sleep_s", 0)))
    for line in spec.get("after", []):
        print(line)
    if attempt <= int(spec.get("fail_attempts", 1 << 30)):
        return int(spec.get("exit_code", 0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
