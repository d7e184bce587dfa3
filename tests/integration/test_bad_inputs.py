"""Bad inputs: each one gets a clear error naming the file, row or field, or follows a stated policy
(the "Bad inputs" table in docs/reliability.md names the test of each row). Real files, a real tokenizer, real
reward worker processes, real job subprocesses; nothing is mocked.

Disk full is simulated with ``RLIMIT_FSIZE`` in a job subprocess: a write past the limit fails with EFBIG ("File
too large") through the same ``write()`` path and the same ``OSError`` handling as ENOSPC, without root, a tmpfs
or a fault-injecting filesystem.

Permission denied: the tests run as root, for whom ``chmod 0555`` denies nothing (CAP_DAC_OVERRIDE). Under root
the ``mugrpo run`` child drops that capability (and CAP_DAC_READ_SEARCH) from its bounding set before exec and is
then held to the folder's mode like any user; under a non-root user the mode alone denies it. (Running the child
as ``nobody`` was tried: it cannot execute an interpreter installed under /root.)
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import _tiny
import pytest
from safetensors.torch import load_file, save_file

from bench.support.synthetic import commit_synthetic_stage
from mugrpo.commits.manifest import latest_checkpoint, read_job_manifest
from mugrpo.config import ConfigError, load_config
from mugrpo.data.datasets import DatasetConfig, DatasetError, Problem, load_problems
from mugrpo.generation import GenerateSpec, GenerationError, prepare_prompts
from mugrpo.rewards import REWARD_FUNCTIONS, RewardConfig, RewardInput, RewardScorer
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.commit import nonfinite_report_path
from mugrpo.trainer.loop import run_training
from mugrpo.trainer.spec import TrainSpec

RUN = "bad-inputs"

# ------------------------------------------------------------------------------------------------ configs


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["run.num_stages=0"], "override 'run.num_stages=0': run.num_stages = 0: Input should be greater than or"),
        (["generation.sampling.n=0"], "generation.sampling.n = 0: Input should be greater than or equal to 1"),
        (["generation.sampling.n=-4"], "generation.sampling.n = -4: Input should be greater than or equal to 1"),
        (["train.lrr=1e-5"], "override 'train.lrr=1e-5': unknown key 'train.lrr'; did you mean 'train.lr'?"),
        (["generation.samplng.n=4"], "unknown key 'generation.samplng'; did you mean 'generation.sampling'?"),
    ],
)
def test_bad_config_values_and_unknown_keys_name_the_key(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config("configs/gsm8k-smollm2-quick.yaml", overrides)
    assert expected in str(err.value)


def test_an_unknown_key_in_a_yaml_file_names_the_file(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("run: {num_stages: 2}\ntrain: {updates_per_stage: 4, checkpoint_evry: 2}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"{path}: unknown key 'train.checkpoint_evry'; did you mean 'train.checkpoint_every'?" in str(err.value)


# --------------------------------------------------------------------------------------------------- data

GOOD = json.dumps({"question": "What is 2+2?", "answer": "#### 4"}).encode()
BAD_LINES = {
    "malformed JSON": (b'{"question": "What is 3+3?", "answer": "#### 6"', "invalid JSON"),
    "missing field": (json.dumps({"question": "What is 3+3?"}).encode(), "missing field 'answer'"),
    "empty question": (
        json.dumps({"question": "  ", "answer": "#### 6"}).encode(),
        "field 'question' is empty or not text",
    ),
    "non-UTF-8": (b'{"question": "What is 3\xff3?", "answer": "#### 6"}', "not UTF-8 (byte 0xff at column 24)"),
}


@pytest.mark.parametrize("kind", list(BAD_LINES))
def test_a_bad_dataset_line_names_the_file_and_line(tmp_path, kind):
    line, reason = BAD_LINES[kind]
    path = tmp_path / "train.jsonl"
    path.write_bytes(GOOD + b"\n" + line + b"\n")
    with pytest.raises(DatasetError) as err:
        load_problems(DatasetConfig(name="t", path=str(path)))
    assert f"dataset 't', {path}:2: {reason}" in str(err.value)


def test_bad_dataset_lines_are_skipped_and_counted_with_on_bad_row_skip(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"\n".join([GOOD, *(line for line, _ in BAD_LINES.values())]) + b"\n")
    problems, report = load_problems(DatasetConfig(name="t", path=str(path), on_bad_row="skip"))
    assert [p.question for p in problems] == ["What is 2+2?"]
    assert report.rows == 5 and report.loaded == 1 and sum(report.skipped.values()) == 4
    assert {"invalid JSON", "missing field 'answer'", "field 'question' is empty or not text"} <= set(report.skipped)


def test_a_prompt_longer_than_the_context_is_skipped_and_counted_or_refused(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    short = Problem("a" * 16, "What is 2+2?", "4", "train.jsonl:1")
    long = Problem("b" * 16, "Add these numbers: " + " + ".join(map(str, range(400))), "1", "train.jsonl:2")
    spec = GenerateSpec(
        root="unused", run_id=RUN, stage=0, policy_dir="policies/stage=0",
        dataset=DatasetConfig(name="t", path="unused.jsonl"), num_prompts=2, sampling={"max_new_tokens": 32},
    )  # fmt: skip
    prepared, skipped = prepare_prompts(spec, tokenizer, [short, long], max_context=256)
    assert prepared[0] is not None and prepared[1] is None and skipped == {"too_long": 1}
    with pytest.raises(GenerationError) as err:
        prepare_prompts(spec.model_copy(update={"on_bad_prompt": "error"}), tokenizer, [short, long], 256)
    assert f"prompt {'b' * 16} (train.jsonl:2) is too_long" in str(err.value)
    assert "context 256, max_new_tokens 32" in str(err.value)


# ------------------------------------------------------------------------------------------------ rewards


@REWARD_FUNCTIONS.register("test_bad_reward")
def _bad_reward(item: RewardInput, answer: str | None) -> float:
    """Test-only (runs in the scorer's real workers): NaN on "NAN", inf on "INF", raises on "RAISE", hangs on
    "HANG", else 1."""
    if "NAN" in item.response_text:
        return math.nan
    if "INF" in item.response_text:
        return math.inf
    if "RAISE" in item.response_text:
        raise ZeroDivisionError("deliberate")
    if "HANG" in item.response_text:
        time.sleep(600)
    return 1.0


def test_a_reward_that_is_nan_raises_or_hangs_scores_zero_with_its_status():
    config = RewardConfig(components={"test_bad_reward": 1.0, "format": 0.5}, num_workers=1, verify_timeout_s=2.0)
    with RewardScorer(config) as scorer:
        scorer.wait_ready()
        nan, inf, raised, hung, fine = scorer.score(
            [RewardInput(f"{word} \\boxed{{1}}", "1") for word in ("NAN", "INF", "RAISE", "HANG", "fine")]
        )
    assert nan.status == "error: NonFiniteReward: component test_bad_reward returned nan"
    assert inf.status == "error: NonFiniteReward: component test_bad_reward returned inf"
    assert raised.status == "error: ZeroDivisionError: deliberate"
    assert hung.status == "timeout"
    for bad in (nan, inf, raised, hung):  # a finite 0, never NaN: the group's advantages stay finite
        assert bad.reward == 0.0 and bad.components == {"test_bad_reward": 0.0, "format": 0.0}
    assert (fine.status, fine.reward) == ("ok", 1.5)


# ------------------------------------------------------------------------------------------------ training


def train_spec(root: Path, **train) -> TrainSpec:
    settings = {"updates_per_stage": 2, "rollouts_per_update": 4, "micro_batch_size": 2, "checkpoint_every": 1}
    return _tiny.train_spec(root, RUN, train={**settings, "lr": _tiny.DEFAULT, **train})


def test_a_stage_whose_groups_are_all_zero_variance_publishes_the_policy_unchanged(tmp_path, tiny_model_dir):
    store, layout = Store(str(tmp_path)), RunLayout(RUN)
    commit_synthetic_stage(store, RUN, tiny_model_dir, num_prompts=3, group_size=2, zero_variance_prompts=3)
    manifest = run_training(train_spec(tmp_path))
    assert manifest.counts["updates"] == 0 and manifest.counts["zero_variance_groups_dropped"] == 3
    assert manifest.counts["rows"] == 0 and latest_checkpoint(store, layout, 0) is None
    before = load_file(str(tmp_path / RUN / "policies/stage=0/model.safetensors"))
    after = load_file(str(tmp_path / RUN / "policies/stage=1/model.safetensors"))
    assert before.keys() == after.keys() and all(before[k].equal(after[k]) for k in before)


def test_a_nan_loss_stops_the_job_before_any_checkpoint_naming_the_prompts(tmp_path, tiny_model_dir, capsys):
    store, layout = Store(str(tmp_path)), RunLayout(RUN)
    commit_synthetic_stage(store, RUN, tiny_model_dir, num_prompts=4, group_size=2, seed=3)
    # The behavior policy turns bad after sampling: a NaN in its final norm makes every logit, and the loss, NaN.
    poisoned = tmp_path / "poisoned"
    shutil.copytree(tiny_model_dir, poisoned)
    weights = load_file(str(poisoned / "model.safetensors"))
    weights["model.norm.weight"][0] = math.nan
    save_file(weights, str(poisoned / "model.safetensors"), metadata={"format": "pt"})
    store.delete(layout.policy_dir(0), recursive=True)
    store.upload_dir(poisoned, layout.policy_dir(0))
    spec_path = tmp_path / "train.spec.json"
    spec_path.write_text(train_spec(tmp_path).model_dump_json())

    from mugrpo.jobs.train import main

    with pytest.raises(SystemExit) as exc:
        main([str(spec_path)])
    assert exc.value.code == 3  # not a usage error (2), not retried blindly into the same NaN
    err = " ".join(capsys.readouterr().err.split())
    assert "non-finite loss" in err and "no checkpoint written for this update" in err
    report = store.read_json(nonfinite_report_path(layout, 0))
    assert report["what"] == "loss" and report["stage_update"] == 1 and report["prompt_ids"]
    assert latest_checkpoint(store, layout, 0) is None and read_job_manifest(store, RUN, 0, "train") is None


# ------------------------------------------------------------------------------------------------ storage


def _file_size_limit(limit_bytes: int):
    """preexec_fn: writes past ``limit_bytes`` fail with EFBIG (Python ignores SIGXFSZ, so no signal kills it)."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return apply


def test_a_full_disk_during_a_shard_write_leaves_no_partial_file(tmp_path):
    script = (
        "import sys; from mugrpo.storage.store import Store, StorageError\n"
        "try:\n    Store(sys.argv[1]).write_bytes('run/rollouts/stage=0/shard=00000.parquet', b'x' * 1_000_000)\n"
        "except StorageError as e:\n    print(e); sys.exit(1)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True, text=True, timeout=120, preexec_fn=_file_size_limit(64 * 1024), cwd=_tiny.REPO_ROOT,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"could not write {tmp_path}/run/rollouts/stage=0/shard=00000.parquet" in out.stdout
    assert "File too large" in out.stdout
    assert list((tmp_path / "run/rollouts/stage=0").iterdir()) == []  # no shard, no temporary file left behind


def test_a_full_disk_during_a_checkpoint_write_fails_the_job_and_a_rerun_resumes(tmp_path, tiny_model_dir):
    store, layout = Store(str(tmp_path)), RunLayout(RUN)
    commit_synthetic_stage(store, RUN, tiny_model_dir, num_prompts=4, group_size=2, seed=3)
    spec_path = _tiny.write_spec(train_spec(tmp_path), tmp_path / "train.spec.json")
    env = _tiny.job_env()
    command = [sys.executable, "-m", "mugrpo.jobs.train", str(spec_path)]
    # 1 MB: the rollouts are read and update 1 runs; its checkpoint (the tiny policy is ~13 MB) cannot be written.
    full = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, preexec_fn=_file_size_limit(1 << 20)
    )
    assert full.returncode == 1, full.stdout + full.stderr  # retryable: the launcher retries once space is freed
    assert "File too large" in full.stderr
    assert latest_checkpoint(store, layout, 0) is None and read_job_manifest(store, RUN, 0, "train") is None
    assert not store.exists(layout.policy_dir(1))
    # (the lease's lock file stays: a flock target, never a partial write)
    leftovers = [p for p in (tmp_path / RUN).rglob("*") if ".tmp-" in p.name and not p.name.endswith(".tmp-lock")]
    assert leftovers == []
    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    manifest = read_job_manifest(store, RUN, 0, "train")
    assert manifest is not None and manifest.counts["updates"] == 2
    assert latest_checkpoint(store, layout, 0) == 2


def _drop_file_permission_override() -> None:
    """preexec_fn: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set (prctl PR_CAPBSET_DROP), so
    root, after exec, is held to file modes like any user (as ``setpriv --bounding-set -dac_override`` does)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH (linux/capability.h)
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def test_permission_denied_on_the_run_root_is_one_line_before_anything_starts(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(0o555)  # read and list, no write
    out = subprocess.run(
        [sys.executable, "-m", "mugrpo", "run", "configs/gsm8k-smollm2-quick.yaml",
         f"run.root={root}", "run.id=denied", "tracking.sinks=[]"],
        cwd=_tiny.REPO_ROOT, capture_output=True, text=True, timeout=300,
        preexec_fn=_drop_file_permission_override if os.geteuid() == 0 else None,
    )  # fmt: skip
    message = " ".join(out.stderr.split())
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"cannot write to {root}/denied: Permission denied" in message and "choose another run.root" in message
    assert "Traceback" not in out.stderr and "Prefect" not in out.stdout  # refused before the flow started
    assert list(root.iterdir()) == []


def test_yaml_no_is_taken_as_the_mixed_precision_setting_no():
    # YAML 1.1 reads an unquoted `no` as false: `train.mixed_precision=no` must still mean 'no', not a type error.
    assert load_config(None, ["train.mixed_precision=no"]).train.mixed_precision == "no"
    with pytest.raises(ConfigError, match="train.mixed_precision = True"):
        load_config(None, ["train.mixed_precision=yes"])


def test_a_duplicate_yaml_key_is_refused_naming_the_file_line_and_key_and_merge_keys_still_work(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("run: {num_stages: 2}\ntrain:\n  lr: 0.001\n  checkpoint_every: 2\n  lr: 0.5\n")
    with pytest.raises(ConfigError) as err:
        load_config(dup)
    assert f"{dup}:5: duplicate key 'train.lr' (first set at line 3)" in str(err.value)
    dup.write_text("train: {lr: 0.001, lr: 0.5}\n")  # flow style
    with pytest.raises(ConfigError, match=r"dup.yaml:1: duplicate key 'train.lr'"):
        load_config(dup)
    from mugrpo.config.loading import load_yaml_unique

    text = "base: &b\n  lr: 0.001\n  checkpoint_every: 2\ntrain:\n  <<: *b\n  lr: 0.5\n"
    assert load_yaml_unique("m.yaml", text)["train"] == {"lr": 0.5, "checkpoint_every": 2}
