"""A job stopped in its first moments still stops as a preempted job: each job installs its preemption notice before
it reads its spec, so a SIGTERM that lands while it starts (the flow or Kubernetes stopping it as it comes up) ends
it with its ``preempted:`` line and exit 75, the answer a launcher retries, instead of the signal's default death with
no word (a fork server's child starts with SIGTERM's default action).

Each job is started on a spec path that is a named pipe nobody writes: its spec read blocks there, so the SIGTERM is
sent at a known point, once ``/proc/PID/status`` shows the job catching SIGTERM, and before the spec is read.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from _tiny import job_env, start_job

from mugrpo.common.preemption import GRACE_ENV, PREEMPTED_EXIT_CODE


def catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler installed for ``sig`` (the ``SigCgt`` mask of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.parametrize("job", ["generate", "train", "eval", "segment"])
def test_a_sigterm_before_the_spec_is_read_gives_the_preemption_line_and_exit_75(job, tmp_path):
    spec = tmp_path / f"{job}.spec.json"
    os.mkfifo(spec)  # opening it for reading blocks until a writer comes: none does
    log = tmp_path / f"{job}.log"
    proc = start_job(job, spec, log, env=job_env(**{GRACE_ENV: "20"}))
    try:
        deadline = time.monotonic() + 120  # the train job imports torch and transformers first
        while not catches(proc.pid, signal.SIGTERM):
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, f"{job} never installed its SIGTERM handler"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == PREEMPTED_EXIT_CODE, log.read_text(errors="replace")[-3000:]
    finally:  # a job that failed the check still waits on the pipe: never leave it behind
        proc.kill()
        proc.wait()
    assert f"preempted: {job}: stopped by SIGTERM" in log.read_text(errors="replace")
