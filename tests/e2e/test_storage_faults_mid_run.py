"""A run root whose storage fails mid-run, replayed through the real ``mugrpo`` command line, flows and jobs
on the tiny policy, the root on a small tmpfs (docs/reliability.md, "Refusals"):

- the root turns read-only after stage 0 committed: the run ends with one block, no traceback, and one line saying
  that the run lease could not be released; once the root is writable again ``mugrpo resume`` takes the run over
  and completes it;
- the disk fills inside a job (the train job's first checkpoint): the job's error (its traceback, naming the file)
  appears once on the console, then the run's block with ``mugrpo resume URL``; after freeing space the resume
  completes.

And, without Prefect: a lease whose release failed on a read-only root is taken over by the next writer once it
expired (its holder still alive, so only the TTL frees it), through the lock file the failed holder left.

Mounting needs root (and a kernel that allows it): without it each test skips.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _tiny import REPO_ROOT, RUN, run_cli, run_env, tiny_config, write_config

from mugrpo.storage.layout import RunLayout

#: What ``mugrpo run`` prints when the run lease cannot be marked released (mugrpo.coordination.lease).
NOT_RELEASED = "could not be released"


@contextlib.contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """``folder`` on a tmpfs of ``size`` (``mount -o size=...``); skips the test where mounting is not allowed."""
    folder.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"no tmpfs (mount not allowed: {mounted.stderr.decode(errors='replace').strip()})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def remount(folder: Path, options: str, timeout_s: float = 60.0) -> None:
    """``mount -o remount,OPTIONS folder``, retried while the kernel refuses it as busy (a read-only remount waits
    for the files open for writing to close: a run writes in short bursts)."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(["mount", "-o", f"remount,{options}", str(folder)], capture_output=True, text=True)
        if out.returncode == 0:
            return
        assert time.monotonic() < deadline, f"remount,{options} of {folder} failed: {out.stderr}"
        time.sleep(0.02)


def start(config: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mugrpo.cli", "run", str(config)],
        cwd=REPO_ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path} appeared:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"{path} did not appear:\n{log.read_text()[-4000:]}"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_root_that_turns_read_only_mid_run_is_one_block_and_the_resume_takes_the_run_over(
    tiny_model_dir,
    tmp_path,
    prefect_api,  # noqa: F811
):
    with tmpfs(tmp_path / "disk", "256m") as disk:
        run = disk / "runs" / RUN
        config = write_config(tmp_path / "run.yaml", tiny_config(disk / "runs", tiny_model_dir))
        log = tmp_path / "run.log"
        proc = start(config, run_env(prefect_api), log)
        try:
            wait_for(disk / "runs" / RunLayout(RUN).stage_manifest(0), proc, log)
            remount(disk, "ro")
            code = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        text = log.read_text()
        assert code == 1, text[-4000:]
        assert "Traceback" not in text, text[-6000:]
        assert "Read-only file system" in text, text[-4000:]
        assert text.count(NOT_RELEASED) == 1, text[-4000:]
        assert f"the run lease of {run}/_lease.json {NOT_RELEASED} (read-only file system)" in text, text[-4000:]
        assert text.count(f"mugrpo resume {run}") == 1, text[-4000:]
        assert not (disk / "runs" / RunLayout(RUN).stage_manifest(1)).exists()

        remount(disk, "rw")
        out = run_cli(["resume", str(run)], run_env(prefect_api), tmp_path / "resume.log")
        assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
        assert f"run {RUN} complete" in out.stdout, out.stdout[-4000:]
        assert (disk / "runs" / RunLayout(RUN).stage_manifest(1)).exists()


@pytest.mark.slow
def test_a_disk_that_fills_inside_a_job_shows_the_jobs_error_once_and_the_resume_completes(
    tiny_model_dir,
    tmp_path,
    prefect_api,  # noqa: F811
):
    """24 MiB: room for the probe, run.json, the initial policy (16 MB) and stage 0's rollouts, not for the train job's
    first checkpoint (its AdamW moments alone are 26 MB)."""
    with tmpfs(tmp_path / "disk", "24m") as disk:
        run = disk / "runs" / RUN
        config = write_config(tmp_path / "run.yaml", tiny_config(disk / "runs", tiny_model_dir, run={"num_stages": 1}))
        log = tmp_path / "run.log"
        out = run_cli(["run", str(config)], run_env(prefect_api), log)
        text = out.stdout + out.stderr
        assert out.returncode == 1, text[-4000:]
        assert f"could not write {run}/checkpoints/stage=0/" in text, text[-6000:]
        assert "No space left on device" in text, text[-4000:]
        failed = f"could not write {run}/checkpoints/stage=0/"
        # The job's traceback once, as the job printed it (a chained one: two "Traceback" headers); no other.
        tracebacks = [line for line in text.splitlines() if "Traceback" in line]
        assert tracebacks and all("[train] Traceback" in line for line in tracebacks), text
        assert text.count('raise self._failed("write", rel, e) from e') == 1, text
        # Named by the traceback's last line and by the run's block, which follows it.
        assert text.count(failed) == 2, text
        block = text[text.index(f"Error: run {RUN} stopped") :]
        assert failed in block and "Traceback" not in block, block
        assert "committed work is kept" in block and "(free space)" in block, block
        assert text.count(f"mugrpo resume {run}") == 1, text[-4000:]
        assert NOT_RELEASED not in text, text[-4000:]

        remount(disk, "size=512m")
        out = run_cli(["resume", str(run)], run_env(prefect_api), tmp_path / "resume.log")
        assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
        assert f"run {RUN} complete" in out.stdout, out.stdout[-4000:]


def test_a_lease_whose_release_failed_is_taken_over_once_it_expires(tmp_path):
    """The holder (this process: alive, so only the TTL frees its lease) cannot release on a read-only root: one
    line, no exception. Writable again, the next writer is refused while the lease lives and takes it once it
    expired, through the lock file the holder left beside it."""
    from mugrpo.coordination.lease import RunLease, RunLeaseHeld
    from mugrpo.storage.store import Store

    with tmpfs(tmp_path / "disk", "1m") as disk:
        (disk / "runs" / RUN).mkdir(parents=True)
        store = Store(str(disk / "runs"))
        holder = RunLease(store, RUN, ttl_s=2.0).acquire()
        lease = disk / "runs" / RUN / "_lease.json"
        assert (lease.parent / "._lease.json.tmp-lock").exists()
        remount(disk, "ro")
        line = holder.release()
        assert line is not None and line.startswith(f"the run lease of {lease} {NOT_RELEASED} (read-only file system)")
        assert "orchestration.lease_ttl_s" in line
        remount(disk, "rw")
        with pytest.raises(RunLeaseHeld):
            RunLease(store, RUN, ttl_s=2.0).acquire()
        time.sleep(2.2)
        taker = RunLease(store, RUN, ttl_s=2.0).acquire()
        try:
            assert taker.token in lease.read_text()
        finally:
            assert taker.release() is None
        assert '"released": true' in lease.read_text()
