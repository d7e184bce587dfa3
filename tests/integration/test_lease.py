"""Two writers: the run lease in object storage, on the local store and on S3 (moto server).

A second writer is refused naming the holder; a stale lease (expired heartbeat, or a dead process on this host) is
taken over; of writers racing for a lease exactly one wins; a superseded writer's jobs are fenced (their commits
refused); a real job process launched with a superseded token exits 2 without committing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

import pytest
from _s3 import moto_server, s3_root  # noqa: F401  (fixtures)
from _tiny import REPO_ROOT, job_env, tiny_config

from mugrpo.commits.manifest import read_job_manifest, write_job_manifest
from mugrpo.coordination.lease import (
    TOKEN_ENV,
    LeaseFence,
    LeaseFenced,
    LeaseRecord,
    RunLease,
    RunLeaseHeld,
    check_fence,
)
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import JobManifest

RUN = "lease-run"


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> Store:
    if request.param == "local":
        return Store(str(tmp_path / "runs"))
    url, opts = request.getfixturevalue("s3_root")
    return Store(url, opts)


def job_manifest() -> JobManifest:
    return JobManifest(run_id=RUN, stage=0, job="generate", created_at=datetime.now(UTC), files=[])


def foreign_lease(store: Store, *, expires_in: float, host: str = "other-host", pid: int = 1) -> LeaseRecord:
    """A lease written by a writer on another host (as a preempted pod would have left it)."""
    now = time.time()
    record = LeaseRecord(
        owner=f"{host}:{pid}",
        token="f" * 32,
        host=host,
        pid=pid,
        pid_start="1",
        acquired_at=now - 100,
        heartbeat_at=now - 10,
        expires_at=now + expires_in,
    )
    store.create_exclusive(RunLayout(RUN).lease, record.to_bytes())
    return record


@pytest.fixture(autouse=True)
def no_token(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def test_second_writer_is_refused_naming_the_holder(store):
    with RunLease(store, RUN, ttl_s=30) as first:
        assert os.environ[TOKEN_ENV] == first.token  # what the flow's jobs inherit
        with pytest.raises(RunLeaseHeld, match=rf"is being written by {first.record.owner} .*lease expires in"):
            RunLease(store, RUN, ttl_s=30).acquire()
        check_fence(store, RUN, "x")  # the holder's token passes
    assert TOKEN_ENV not in os.environ
    record = json.loads(store.read_bytes(RunLayout(RUN).lease))
    assert record["released"] is True
    with RunLease(store, RUN, ttl_s=30) as again:  # a released lease is free
        assert again.record.token != first.token


def test_a_copied_run_folder_is_refused_naming_the_folder_the_live_writer_writes(tmp_path):
    """``cp -r`` of a run folder while its writer runs copies its live lease: the copy is refused, and the refusal
    says which folder the writer is writing and how to run the copy."""
    import shutil

    original = Store(str(tmp_path / "runs"))
    with RunLease(original, RUN, ttl_s=30):
        shutil.copytree(tmp_path / "runs", tmp_path / "copy")
        copy = Store(str(tmp_path / "copy"))
        with pytest.raises(RunLeaseHeld) as refused:
            RunLease(copy, RUN, ttl_s=30).acquire()
        said = str(refused.value)
        assert f"which is writing {original.uri(RUN)}: this folder is a copy of that run" in said
        assert "delete _lease.json in the copy" in said
        with pytest.raises(RunLeaseHeld) as again:  # the run's own folder: no copy to speak of
            RunLease(original, RUN, ttl_s=30).acquire()
        assert "copy" not in str(again.value)


def test_a_live_lease_of_another_host_is_refused_then_taken_over_once_expired(store):
    foreign_lease(store, expires_in=1.5)
    with pytest.raises(RunLeaseHeld, match="other-host:1"):
        RunLease(store, RUN, ttl_s=30).acquire()
    waiting = RunLease(store, RUN, ttl_s=30, wait_s=20)
    t0 = time.monotonic()
    with waiting:  # waits for the expiry, then takes over
        assert time.monotonic() - t0 >= 1.0
        assert json.loads(store.read_bytes(RunLayout(RUN).lease))["token"] == waiting.token


def test_a_dead_process_on_this_host_is_taken_over_at_once(store, tmp_path):
    import socket

    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(proc.stdout)
    foreign_lease(store, expires_in=3600, host=socket.gethostname(), pid=dead_pid)
    with RunLease(store, RUN, ttl_s=30) as lease:
        assert lease.record.pid == os.getpid()


def test_racing_writers_for_a_stale_lease_exactly_one_wins(store):
    foreign_lease(store, expires_in=-5)  # expired
    leases = [RunLease(store, RUN, ttl_s=30) for _ in range(4)]
    outcomes: list[str | None] = [None] * len(leases)
    barrier = threading.Barrier(len(leases))

    def take(i: int) -> None:
        barrier.wait()
        outcomes[i] = leases[i].try_acquire()

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(leases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, o in enumerate(outcomes) if o is None]
    assert len(winners) == 1, outcomes
    assert json.loads(store.read_bytes(RunLayout(RUN).lease))["token"] == leases[winners[0]].token


def test_heartbeat_renews_and_a_superseded_writer_is_fenced(store, monkeypatch):
    old = RunLease(store, RUN, ttl_s=0.6).acquire()
    try:
        first_expiry = old.record.expires_at
        deadline = time.monotonic() + 10
        while old.heartbeats < 2:  # beats every ttl/3
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.05)
        assert old.record.expires_at > first_expiry
        old._stop.set()  # the old writer hangs (a preempted pod that is not dead yet): no more heartbeats
        old._thread.join()
        time.sleep(0.7)  # its lease expires
        new = RunLease(store, RUN, ttl_s=30).acquire()
        try:
            old.heartbeat()  # a late heartbeat finds it lost
            assert old.lost and new.record.owner in old.lost
            with pytest.raises(LeaseFenced, match="taken over"):
                old.ensure_held()
            # A late job of the old writer (its token in the environment) cannot commit through a run writer's store
            # (mugrpo.orchestration.runs.open_store, JobSpec.store: the lease's commit guard).
            store = Store(store.url, store.storage_options, guard=LeaseFence())
            monkeypatch.setenv(TOKEN_ENV, old.token)
            with pytest.raises(
                LeaseFenced, match=rf"refusing to commit .*generate\.manifest\.json.*{new.record.owner}"
            ):
                write_job_manifest(store, job_manifest())
            assert read_job_manifest(store, RUN, 0, "generate") is None
            # A job run by hand (no token) while a live writer holds the run is refused too.
            monkeypatch.delenv(TOKEN_ENV)
            with pytest.raises(LeaseFenced, match="is being written by"):
                write_job_manifest(store, job_manifest())
            monkeypatch.setenv(TOKEN_ENV, new.token)
            write_job_manifest(store, job_manifest())  # the holder's job commits
            assert read_job_manifest(store, RUN, 0, "generate") is not None
        finally:
            new.release()
    finally:
        old.release()  # leaves the new holder's lease alone
    assert json.loads(store.read_bytes(RunLayout(RUN).lease))["token"] == new.token


@pytest.mark.slow
def test_a_real_job_of_a_superseded_writer_exits_2_without_committing(tmp_path, tiny_model_dir):
    """A generate job launched with the token of a writer that lost the lease: exit 2, no shard, no manifest."""
    from mugrpo.config import config_from_dict
    from mugrpo.orchestration.job_specs import write_job_specs
    from mugrpo.orchestration.runs import attach_run, start_run

    # A tiny run config; only its stage 0 generate job runs here.
    cfg = config_from_dict(tiny_config(tmp_path, tiny_model_dir, run_id=RUN, run={"num_stages": 1}), source="test")
    run = start_run(cfg)
    store = run.store
    spec = write_job_specs(attach_run(cfg), 0)["generate"]
    holder = RunLease(store, RUN, ttl_s=60).acquire()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "mugrpo.jobs.generate", spec],
            env=job_env(**{TOKEN_ENV: "0" * 32}),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        holder.release()
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "refusing to commit" in out.stderr and holder.record.owner in out.stderr
    assert store.listdir(RunLayout(RUN).rollouts_dir(0)) == []
    assert read_job_manifest(store, RUN, 0, "generate") is None


def test_a_second_mugrpo_run_is_refused_at_once_naming_the_holder(store, tmp_path):
    """`mugrpo run` of a run another live writer holds exits 3 before starting Prefect, naming the holder."""
    import yaml

    foreign_lease(store, expires_in=600, host="preempted-pod-7", pid=42)
    cfg = {"run": {"id": RUN, "root": store.url, "storage_options": store.storage_options}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run(
        [sys.executable, "-m", "mugrpo.cli", "run", str(path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 3, out.stdout + out.stderr
    assert "is being written by preempted-pod-7:42" in out.stderr and "lease expires in" in out.stderr
    assert not store.exists(RunLayout(RUN).run_json)  # nothing written


def test_a_writer_frozen_inside_a_local_commit_is_named_instead_of_waited_on_forever(tmp_path, monkeypatch):
    """A process frozen while it holds the local lease lock (inside a commit's compare-and-rename) keeps its flock:
    a takeover may not commit past it, and it no longer hangs either. It fails after the lock's wait, naming the
    holder's pid and state, and writes nothing: in the library, and as `mugrpo run`'s one-block refusal (exit 3)."""
    import signal

    import yaml

    import mugrpo.storage.locks as locks_module
    from mugrpo.storage.locks import LOCAL_LOCK_WAIT_ENV, LocalLockTimeout

    root = str(tmp_path / "runs")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, signal, sys\n"
            "from mugrpo.storage.store import Store\n"
            f"with Store({root!r}).local_lock({RunLayout(RUN).lease!r}):\n"
            "    print('held', flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGSTOP)\n",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(locks_module, "LOCAL_LOCK_WAIT_S", 1.0)
        store = Store(root)
        t0 = time.monotonic()
        with pytest.raises(
            LocalLockTimeout, match=rf"held for 1 s by pid {holder.pid} \(stopped\).*nothing was written"
        ):
            RunLease(store, RUN, ttl_s=30).acquire()
        assert 1.0 <= time.monotonic() - t0 < 10
        assert not store.exists(RunLayout(RUN).lease)

        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump({"run": {"id": RUN, "root": root}}))
        env = {**os.environ, LOCAL_LOCK_WAIT_ENV: "1"}
        out = subprocess.run(
            [sys.executable, "-m", "mugrpo.cli", "run", str(path)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 3, out.stdout + out.stderr
        assert f"pid {holder.pid} (stopped)" in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert sum(line.startswith("Error:") for line in out.stderr.splitlines()) == 1, out.stderr
        assert not store.exists(RunLayout(RUN).lease) and not store.exists(RunLayout(RUN).run_json)
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    with RunLease(Store(root), RUN, ttl_s=30):  # the holder gone, its flock went with it
        pass
