"""The training job's refusal paths: bad rollout rows, an uncommitted generation job and a checkpoint
made for other rollouts each stop the job with exit code 2 (a refusal, not retried) and a message naming the file
and the rollout, before any update, checkpoint or policy is written. Real committed files, the real job entry
point (``mugrpo.jobs.train.main``) on a tiny random policy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from _tiny import DEFAULT, train_spec, write_spec

from bench.support.synthetic import commit_rollouts, commit_synthetic_stage, synthetic_rollout_rows
from mugrpo.commits.manifest import read_job_manifest
from mugrpo.jobs.train import main
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.loop import run_training
from mugrpo.trainer.spec import TrainSpec

RUN = "refusals"
SETTINGS = {
    "updates_per_stage": 2,
    "rollouts_per_update": 4,
    "micro_batch_size": 2,
    "checkpoint_every": 1,
    "lr": DEFAULT,
}


def make_spec(root: Path, **train) -> TrainSpec:
    return train_spec(root, RUN, train={**SETTINGS, **train})


def spec_file(root: Path, tmp: Path, **train) -> str:
    return str(write_spec(make_spec(root, **train), tmp / "train.spec.json"))


def run_job(spec: str, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main([spec])
    return exc.value.code, " ".join(capsys.readouterr().err.split())


def assert_nothing_trained(store: Store) -> None:
    layout = RunLayout(RUN)
    assert not store.exists(layout.checkpoints_dir(0)) and not store.exists(layout.policy_dir(1))
    assert read_job_manifest(store, RUN, 0, "train") is None


def _shorten_logprobs(row: dict) -> str:
    row["behavior_logprobs"] = row["behavior_logprobs"][:-1]
    return "response tokens"


def _nan_logprob(row: dict) -> str:
    row["behavior_logprobs"] = [*row["behavior_logprobs"][:-1], math.nan]
    return "behavior_logprobs must be finite; not at token positions"


def _inf_advantage(row: dict) -> str:
    row["advantage"] = math.inf
    return "advantage is inf"


def _nan_advantage(row: dict) -> str:
    row["advantage"] = math.nan
    return "advantage is nan"


@pytest.mark.parametrize("corrupt", [_shorten_logprobs, _nan_logprob, _inf_advantage, _nan_advantage])
def test_a_bad_rollout_row_is_refused_naming_the_file_and_the_rollout(tmp_path, tiny_model_dir, capsys, corrupt):
    root = tmp_path / "store"
    store = Store(str(root))
    store.upload_dir(tiny_model_dir, RunLayout(RUN).policy_dir(0))
    rows = synthetic_rollout_rows(tiny_model_dir, run_id=RUN, num_prompts=4, group_size=2, seed=1)
    victim = rows[5]  # second shard (2 groups x 2 responses per shard)
    expected = corrupt(victim)
    commit_rollouts(store, RUN, 0, rows, shard_size=2)
    code, err = run_job(spec_file(root, tmp_path), capsys)
    assert code == 2
    assert "bad rollouts" in err and expected in err
    assert f"prompt_id={victim['prompt_id']!r} sample_idx={victim['sample_idx']}" in err
    assert "rollouts/stage=0/shard=00001.parquet" in err
    assert_nothing_trained(store)


def test_an_uncommitted_generation_job_is_refused(tmp_path, tiny_model_dir, capsys):
    root = tmp_path / "store"
    store, layout = Store(str(root)), RunLayout(RUN)
    commit_synthetic_stage(store, RUN, tiny_model_dir, num_prompts=4, group_size=2, seed=1)
    store.delete(layout.job_manifest(0, "generate"))  # shards on disk, but the job never committed
    code, err = run_job(spec_file(root, tmp_path), capsys)
    assert code == 2
    assert "stage 0: the generation job has not committed" in err and "generate.manifest.json does not exist" in err
    assert_nothing_trained(store)


def test_resuming_on_other_rollouts_is_refused_naming_the_checkpoint(tmp_path, tiny_model_dir, capsys):
    root = tmp_path / "store"
    store, layout = Store(str(root)), RunLayout(RUN)
    commit_synthetic_stage(store, RUN, tiny_model_dir, num_prompts=4, group_size=2, seed=1)
    # A first attempt that got as far as its checkpoint at update 1 (run here as a 1-update job whose commit is
    # then removed): checkpoints exist, the train job has not committed. The policy its final checkpoint
    # references stays, as a kill after that checkpoint leaves it.
    run_training(make_spec(root, updates_per_stage=1))
    store.delete(layout.job_manifest(0, "train"))
    assert store.is_complete_dir(layout.checkpoint_dir(0, 1))
    # The stage's rollouts are then generated again, differently (another sampling seed).
    commit_synthetic_stage(store, RUN, tiny_model_dir, num_prompts=4, group_size=2, seed=2, upload_policy=False)
    code, err = run_job(spec_file(root, tmp_path, updates_per_stage=3), capsys)
    assert code == 2
    assert "checkpoints/stage=0/step=000001" in err and "was made for other rollouts (data fingerprint differs)" in err
    assert not store.exists(layout.checkpoint_dir(0, 2)) and read_job_manifest(store, RUN, 0, "train") is None
