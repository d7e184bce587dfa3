"""A writer frozen past its lease never changes what another writer committed: every write and delete of a
run goes through the run lease's fence (mugrpo.coordination.lease.LeaseFence, the store's commit guard).

Writer A (`mugrpo run`) is frozen with SIGSTOP, its whole process tree (flow, job fork server, jobs, verifier
workers), right after its first training checkpoint; its lease expires; writer B (`mugrpo run` of the same config)
takes the run over and completes it; every committed file is hashed and `mugrpo verify` is clean. A is then resumed
(SIGCONT): its train job's next write (a train_steps part, a checkpoint) is fenced, its waiting pre-started jobs find
the lease gone, and it stops. Every committed file keeps its hash and `mugrpo verify` is still clean. On the local
store and on S3 (moto server). Real CLI processes, real Prefect server, tiny policy.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _s3 import moto_server  # noqa: F401  (fixture)
from _tiny import REPO_ROOT, RUN, descendants, run_cli, run_env, tiny_config, write_config

from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import COMPLETE_MARKER, TMP_TAG, Store

pytestmark = pytest.mark.slow
TTL_S = 2.0


def committed_hashes(store: Store) -> dict[str, str]:
    """sha256 of every file of the run but the lease and hidden temporary or lock files."""
    out = {}
    stack = [RUN]
    while stack:
        rel = stack.pop()
        for name in store.listdir(rel):
            child = f"{rel}/{name}"
            if store.fs.isdir(store.full(child)):
                stack.append(child)
            elif name != "_lease.json" and TMP_TAG not in name and not name.startswith("."):
                out[child] = hashlib.sha256(store.read_bytes(child)).hexdigest()
    return out


def signal_tree(pid: int, sig: int) -> None:
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def freeze_between_commits(pid: int, store: Store, lease: str) -> None:
    """SIGSTOP ``pid``'s tree at a moment none of it holds the local lease lock (each commit holds it for a compare
    and a rename). A writer frozen inside that section keeps its ``flock``: no other writer may commit until it is
    resumed or killed, and one that tries fails naming it (tests/integration/test_lease.py); that is not the case
    under test here, a writer frozen *between* commits past its lease."""
    import fcntl

    if not store.is_local:
        signal_tree(pid, signal.SIGSTOP)
        return
    lock = store.local_lock_path(lease)
    for _ in range(200):
        signal_tree(pid, signal.SIGSTOP)
        with open(lock, "a") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
                return
            except BlockingIOError:
                pass
        signal_tree(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"writer A held {lock} at each of 200 tries")


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_frozen_writer_changes_nothing_the_next_one_committed(
    where,
    tmp_path,
    tiny_model_dir,
    prefect_api,
    request,  # noqa: F811
):
    if where == "s3":
        import s3fs

        endpoint = request.getfixturevalue("moto_server")
        bucket = f"writers-{uuid.uuid4().hex[:8]}"
        s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).mkdir(bucket)
        root, options = f"s3://{bucket}/runs", {"endpoint_url": endpoint}
    else:
        root, options = str(tmp_path / "runs"), {}
    cfg = tiny_config(
        root,
        tiny_model_dir,
        run={"storage_options": options},
        train={"updates_per_stage": 4, "checkpoint_every": 1},
        orchestration={"lease_ttl_s": TTL_S},
    )
    config = write_config(tmp_path / "run.yaml", cfg)
    env = {**run_env(prefect_api), "MUGRPO_RUN_SLOT": "off"}
    store, layout = Store(root, options), RunLayout(RUN)
    log_a = tmp_path / "a.log"
    a = subprocess.Popen(
        [sys.executable, "-m", "mugrpo.cli", "run", str(config)],
        cwd=REPO_ROOT,
        env=env,
        stdout=log_a.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        first = f"{layout.checkpoint_dir(0, 1)}/{COMPLETE_MARKER}"
        while not store.exists(first):
            assert a.poll() is None, log_a.read_text()[-3000:]
            assert time.monotonic() < deadline, "writer A wrote no checkpoint"
            time.sleep(0.05)
            store.invalidate_cache()
        freeze_between_commits(a.pid, store, layout.lease)  # frozen mid-stage: no heartbeat, its train job stopped
        time.sleep(TTL_S * 2)

        b = run_cli(["run", str(config)], env, tmp_path / "b.log")
        assert b.returncode == 0, (tmp_path / "b.log").read_text()[-3000:]
        store.invalidate_cache()
        before = committed_hashes(store)
        assert any("/train_steps/" in k for k in before) and any("/checkpoints/" in k for k in before)
        assert run_cli(["verify", f"{root}/{RUN}", *_opts(options)], env).returncode == 0

        signal_tree(a.pid, signal.SIGCONT)
        assert a.wait(timeout=600) == 3, log_a.read_text()[-3000:]  # A stops: its commits are refused
        text = log_a.read_text()
        # one block: taken over, by whom, and that the run is already complete; no resume advice
        assert "Traceback" not in text and sum(line.startswith("Error:") for line in text.splitlines()) == 1, text
        assert "was taken over by" in text and "the run is complete" in text, text[-3000:]
        assert "mugrpo resume" not in text, text[-3000:]
        store.invalidate_cache()
        assert committed_hashes(store) == before  # not one committed byte changed
        out = run_cli(["verify", f"{root}/{RUN}", *_opts(options)], env)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    finally:
        if a.poll() is None:
            signal_tree(a.pid, signal.SIGCONT)
            signal_tree(a.pid, signal.SIGKILL)
            a.wait()


def _opts(options: dict) -> list[str]:
    return [f"--storage-option={k}={v}" for k, v in options.items()]
