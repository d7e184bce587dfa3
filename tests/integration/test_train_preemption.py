"""Preemption that loses at most the update in flight: SIGTERM to the train job at update u of a stage,
then a re-run, gives the uninterrupted run's final weights bitwise (CPU), with no update redone beyond the one in
flight; a grace too short for a checkpoint falls back to the last one and says so.

The signal lands at a named pause point (``MUGRPO_FAULT_PAUSE``, :mod:`mugrpo.common.faults`): update u composed,
before its first micro-batch. Tiny policy on CPU, real job processes, real files. Marked slow (~40 s)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from _tiny import job_env, policy_weights, start_job, train_spec, write_spec

from bench.support.synthetic import commit_synthetic_stage
from mugrpo.commits.manifest import checkpoint_steps, latest_checkpoint, read_job_manifest, read_preemption_record
from mugrpo.common.faults import FAULT_ENV
from mugrpo.common.preemption import GRACE_ENV, PREEMPTED_EXIT_CODE
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.preemption import checkpoint_times_path

pytestmark = pytest.mark.slow

RUN = "preempt"
UPDATES = 6
LAYOUT = RunLayout(RUN)


def _spec(root: Path, tmp: Path, name: str, every: int) -> Path:
    train = {"updates_per_stage": UPDATES, "checkpoint_every": every, "warmup_updates": 1, "lr_schedule": "cosine"}
    return write_spec(train_spec(root, RUN, train=train), tmp / f"{name}.spec.json")


def _run(root: Path, tmp: Path, name: str, every: int, env: dict | None = None) -> tuple[int, str]:
    log = tmp / f"{name}.log"
    proc = start_job("train", _spec(root, tmp, name, every), log, env={**job_env(), **(env or {})})
    return proc.wait(timeout=300), log.read_text()


def _preempt_at(root: Path, tmp: Path, name: str, every: int, update: int, grace_s: float) -> tuple[int, str, float]:
    """Start the job, SIGTERM it while update ``update`` waits at its pause point; (exit code, log, seconds from
    the signal to the exit)."""
    log = tmp / f"{name}.log"
    env = {**job_env(), FAULT_ENV: f"train/stage=0/update={update}:2", GRACE_ENV: str(grace_s)}
    proc = start_job("train", _spec(root, tmp, name, every), log, env=env)
    deadline = time.monotonic() + 240
    while f"{FAULT_ENV} train/stage=0/update={update}" not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the job never reached the pause point"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    code = proc.wait(timeout=120)
    return code, log.read_text(), time.monotonic() - t0


@pytest.fixture(scope="module")
def straight(tiny_model_dir, tmp_path_factory) -> Store:
    """The uninterrupted run (one checkpoint per two updates)."""
    tmp = tmp_path_factory.mktemp("straight")
    commit_synthetic_stage(Store(str(tmp / "root")), RUN, tiny_model_dir, num_prompts=8, group_size=4, seed=11)
    code, log = _run(tmp / "root", tmp, "straight", every=2)
    assert code == 0, log[-3000:]
    return Store(str(tmp / "root"))


def _assert_same_result(store: Store, straight: Store) -> None:
    a, b = policy_weights(straight, LAYOUT.policy_dir(1)), policy_weights(store, LAYOUT.policy_dir(1))
    assert a.keys() == b.keys()
    assert not [n for n in a if not torch.equal(a[n], b[n])], "weights differ from the uninterrupted run"
    rows = pq.read_table(store.local_path(LAYOUT.train_steps_dir(0))).sort_by("stage_update")
    ref = pq.read_table(straight.local_path(LAYOUT.train_steps_dir(0))).sort_by("stage_update")
    assert rows.column("stage_update").to_pylist() == list(range(1, UPDATES + 1))  # each update recorded once
    for column in ("loss", "grad_norm", "lr", "num_tokens"):
        assert rows.column(column).to_pylist() == ref.column(column).to_pylist(), column


def test_sigterm_saves_the_update_in_flight_and_the_rerun_redoes_nothing(tiny_model_dir, tmp_path, straight):
    """SIGTERM during update 3 (between checkpoints 2 and 4): the job finishes update 3, checkpoints it, exits 75
    and says so; the re-run resumes after update 3 (0 updates redone) and ends bitwise on the straight run."""
    root = tmp_path / "root"
    commit_synthetic_stage(Store(str(root)), RUN, tiny_model_dir, num_prompts=8, group_size=4, seed=11)
    code, log, seconds = _preempt_at(root, tmp_path, "preempted", every=2, update=3, grace_s=20.0)
    assert code == PREEMPTED_EXIT_CODE, log[-3000:]
    said = (
        "preempted: train stage 0: stopped by SIGTERM after update 3 of 6; saved at update 3 of 6, 0 update(s) to redo"
    )
    assert said in log
    assert seconds < 20.0  # within the grace
    store = Store(str(root))
    assert latest_checkpoint(store, LAYOUT, 0) == 3 and read_job_manifest(store, RUN, 0, "train") is None
    record = read_preemption_record(store, LAYOUT, 0)
    assert record["done"] == 3 and record["saved"] == 3 and record["lost"] == 0 and not record["dropped"]
    times = store.read_json(checkpoint_times_path(LAYOUT, 0))["seconds"]  # what a re-run predicts from
    assert len(times) == 2 and all(t > 0 for t in times)  # the checkpoints of updates 2 and 3

    code, log = _run(root, tmp_path, "rerun", every=2)
    assert code == 0, log[-3000:]
    assert read_job_manifest(store, RUN, 0, "train").counts["resumed_from"] == 3
    _assert_same_result(store, straight)


def test_a_grace_too_short_for_a_checkpoint_falls_back_to_the_last_one(tiny_model_dir, tmp_path, straight):
    """A grace of 0.2 s: the update in flight (4) is dropped and no checkpoint of update 3 fits, so the job says it
    falls back to the checkpoint of update 2 and exits 75; the re-run redoes updates 3-4 and ends bitwise on the
    straight run."""
    root = tmp_path / "root"
    commit_synthetic_stage(Store(str(root)), RUN, tiny_model_dir, num_prompts=8, group_size=4, seed=11)
    code, log, _ = _preempt_at(root, tmp_path, "short", every=2, update=4, grace_s=0.2)
    assert code == PREEMPTED_EXIT_CODE, log[-3000:]
    assert "update 4 dropped" in log and "the grace was too short for a checkpoint" in log, log[-2000:]
    assert "saved at update 2 (the last checkpoint), 2 update(s) to redo" in log
    store = Store(str(root))
    assert checkpoint_steps(store, LAYOUT, 0) == [2]
    record = read_preemption_record(store, LAYOUT, 0)
    assert record["dropped"] and record["checkpoint_fit"] is False and record["lost"] == 2

    code, log = _run(root, tmp_path, "rerun", every=2)
    assert code == 0, log[-3000:]
    assert read_job_manifest(store, RUN, 0, "train").counts["resumed_from"] == 2
    _assert_same_result(store, straight)


def test_a_train_job_waiting_at_its_start_gate_stops_at_once(tiny_model_dir, tmp_path):
    """A pre-started train job waiting for its inputs has nothing to save: SIGTERM ends it within seconds, exit 75,
    nothing written (it does not sit out its grace)."""
    root = tmp_path / "root"
    spec = train_spec(root, RUN, start_after=[f"{RUN}/jobs/stage=0/generate.manifest.json"], start_timeout_s=600)
    log = tmp_path / "gate.log"
    proc = start_job("train", write_spec(spec, tmp_path / "gate.spec.json"), log, env={**job_env(), GRACE_ENV: "20"})
    deadline = time.monotonic() + 120
    while "waiting for 1 input(s)" not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == PREEMPTED_EXIT_CODE, log.read_text()[-3000:]
    assert time.monotonic() - t0 < 5
    assert "stopped by SIGTERM before its update loop; nothing to save" in log.read_text()
    assert not (root / RUN / "checkpoints").exists()
