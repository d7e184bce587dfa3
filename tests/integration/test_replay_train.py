"""Replay-buffer GRPO in the trainer (arXiv 2606.04560): a tiny 3-stage run checked with SQL, and a SIGKILL in the
middle of a stage with a non-empty buffer, resumed to bitwise-equal weights and the same draws.

Tiny random policy with the real SmolLM2 tokenizer, synthetic rollout stages committed like a generation job's
(rewards 0/1, one zero-variance group per stage), real Parquet files, real job subprocesses for the kill test.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from _tiny import start_job, train_spec, write_spec
from safetensors.torch import load_file

from bench.support.synthetic import commit_synthetic_stage
from mugrpo.algorithms.replay.state import read_stage_buffer
from mugrpo.commits.manifest import latest_checkpoint, read_job_manifest
from mugrpo.sql import connect
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.loop import Trainer
from mugrpo.trainer.spec import TrainSpec

RUN = "replay"
UPDATES, STAGES = 4, 3
REPLAY = {"enabled": True, "ratio": 0.5, "alpha": 0.5, "tau_max": 5, "warmup_updates": 2, "capacity": 20}


def _spec(root: Path, stage: int) -> TrainSpec:
    return train_spec(
        root,
        RUN,
        seed=5,
        stage=stage,
        policy_version=stage * UPDATES,
        total_updates=STAGES * UPDATES,
        train={
            "updates_per_stage": UPDATES,
            "rollouts_per_update": 4,
            "micro_batch_size": 2,
            "skip_zero_variance_groups": False,  # trained on as fresh rows, but never inserted into the buffer
        },
        loss={"name": "grpo", "eps_low": 0.2, "eps_high": 0.28, "dual_clip_c": 10.0},
        replay=REPLAY,
    )


def _commit_stage(store: Store, model_dir: Path, stage: int) -> None:
    commit_synthetic_stage(
        store,
        RUN,
        model_dir,
        stage=stage,
        upload_policy=stage == 0,
        policy_version=stage * UPDATES,
        num_prompts=5,
        group_size=4,
        seed=100 + stage,
        zero_variance_prompts=1,
    )


def _train_in_process(root: Path, model_dir: Path, stages: range) -> None:
    store, trainer = Store(str(root)), Trainer()
    for k in stages:
        _commit_stage(store, model_dir, k)
        trainer.run_stage(_spec(root, k))


@pytest.mark.slow
def test_replay_run_checked_with_sql(tiny_model_dir, tmp_path):
    root = tmp_path / "runs"
    _train_in_process(root, tiny_model_dir, range(STAGES))
    with connect(str(root / RUN)) as cat:
        q = lambda sql: cat.arrow(sql).to_pylist()  # noqa: E731
        # replayed rows appear only after the warmup
        assert q("SELECT min(update) AS first FROM replay WHERE replayed")[0]["first"] == REPLAY["warmup_updates"] + 1
        assert q(f"SELECT count(*) AS n FROM replay WHERE replayed AND update <= {REPLAY['warmup_updates']}") == [
            {"n": 0}
        ]
        # no rollout older than tau_max is ever used
        assert q("SELECT max(age) AS a FROM replay WHERE replayed")[0]["a"] <= REPLAY["tau_max"]
        # ... though older ones were in the buffer and got evicted
        assert q("SELECT sum(replay_evicted_age) AS n FROM train_steps")[0]["n"] > 0
        # every update after the warmup: fresh-anchored, k = round(0.5 x 4) = 2 replayed, never a fresh one
        steps = q("SELECT update, num_fresh, num_replayed, num_sequences FROM train_steps ORDER BY update")
        assert [s["update"] for s in steps] == list(range(1, STAGES * UPDATES + 1))
        assert all(s["num_fresh"] == 4 and s["num_sequences"] == 4 + s["num_replayed"] for s in steps)
        assert [s["num_replayed"] for s in steps] == [0, 0] + [2] * (STAGES * UPDATES - 2)
        assert q(
            "SELECT count(*) AS n FROM replay r JOIN replay f ON r.update = f.update AND r.replayed AND NOT f.replayed "
            "AND (r.rollout_stage, r.prompt_id, r.sample_idx) = (f.rollout_stage, f.prompt_id, f.sample_idx)"
        ) == [{"n": 0}]
        # replayed rollouts were fresh in an earlier update, never from a zero-variance group, and keep their
        # row's frozen advantage
        assert q(
            "SELECT count(*) AS n FROM replay r WHERE r.replayed AND NOT EXISTS (SELECT 1 FROM replay f WHERE "
            "NOT f.replayed AND f.update < r.update AND (f.rollout_stage, f.prompt_id, f.sample_idx) = "
            "(r.rollout_stage, r.prompt_id, r.sample_idx))"
        ) == [{"n": 0}]
        assert q(
            "SELECT count(*) AS n FROM replay r JOIN rollouts o ON (o.stage, o.prompt_id, o.sample_idx) = "
            "(r.rollout_stage, r.prompt_id, r.sample_idx) WHERE r.replayed AND (o.zero_variance OR "
            "o.advantage <> r.advantage)"
        ) == [{"n": 0}]
        # replay crosses stages (stage 1 replays stage 0's rollouts)
        assert q("SELECT count(*) AS n FROM replay WHERE replayed AND rollout_stage < stage")[0]["n"] > 0
    # the buffer committed with each stage is listed in its train manifest and loads
    store, layout = Store(str(root)), RunLayout(RUN)
    buffer = read_stage_buffer(store, layout, STAGES - 1, _spec(root, 0).replay)
    assert 0 < len(buffer) <= REPLAY["capacity"]
    assert all(e.age(STAGES * UPDATES) <= REPLAY["tau_max"] + 1 for e in buffer.entries)


def _launch(root: Path, tmp: Path, name: str) -> subprocess.Popen:
    return start_job("train", write_spec(_spec(root, 1), tmp / f"{name}.spec.json"), tmp / f"{name}.log")


@pytest.mark.slow
def test_sigkill_mid_stage_with_a_full_buffer_then_resume(tiny_model_dir, tmp_path):
    """Stage 0 fills the buffer; stage 1's job is killed after its checkpoint at update 2 (buffer non-empty, draws
    under way) and re-run: same draws, same train_steps replay columns, bitwise-equal weights."""
    layout = RunLayout(RUN)
    roots = {name: tmp_path / name for name in ("straight", "killed")}
    for root in roots.values():
        _train_in_process(root, tiny_model_dir, range(1))
        _commit_stage(Store(str(root)), tiny_model_dir, 1)
    assert len(read_stage_buffer(Store(str(roots["killed"])), layout, 0, _spec(roots["killed"], 0).replay)) > 0

    straight = _launch(roots["straight"], tmp_path, "straight")
    killed = _launch(roots["killed"], tmp_path, "killed")
    store = Store(str(roots["killed"]))
    deadline = time.monotonic() + 240
    while not store.is_complete_dir(layout.checkpoint_dir(1, 2)):
        assert killed.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert read_job_manifest(store, RUN, 1, "train") is None
    last = latest_checkpoint(store, layout, 1)
    assert last is not None and last < UPDATES
    resumed = _launch(roots["killed"], tmp_path, "killed")
    for proc, name in ((resumed, "killed"), (straight, "straight")):
        assert proc.wait(timeout=300) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    assert read_job_manifest(store, RUN, 1, "train").counts["resumed_from"] == last

    a = load_file(str(Store(str(roots["straight"])).local_path(layout.policy_dir(2)) / "model.safetensors"))
    b = load_file(str(store.local_path(layout.policy_dir(2)) / "model.safetensors"))
    assert [n for n in a if not torch.equal(a[n], b[n])] == []

    def table(root: Path, folder: str, cols: list[str]):
        return (
            pq.read_table(Store(str(root)).local_path(f"{RUN}/{folder}/stage=1"))
            .select(cols)
            .sort_by([(c, "ascending") for c in cols[:2]])
        )

    audit = ["update", "replayed", "rollout_stage", "prompt_id", "sample_idx", "age"]
    steps = ["stage_update", "loss", "num_replayed", "replay_age_max", "replay_buffer_size", "replay_evicted_age"]
    for folder, cols in (("replay", audit), ("train_steps", steps)):
        assert table(roots["killed"], folder, cols).to_pylist() == table(roots["straight"], folder, cols).to_pylist()
    assert table(roots["killed"], "train_steps", steps).column("num_replayed").to_pylist() == [2] * UPDATES
