"""Acceptance: SIGKILL the training job mid-run, re-run it, and get final weights bitwise equal to an
uninterrupted run with the same seed, with exactly one train_steps row per update. Tiny policy on CPU, real
subprocesses, real files. Marked slow (three real job processes, ~25 s on an idle 2-core machine): `make test`
runs it, the quick `-m "not slow"` selection skips it.

Weights written once: the stage's final checkpoint shares the published policy's weight file (it holds
a reference, no copy); the resumed run's policy and final AdamW state equal the uninterrupted run's, also when the
kill falls between the policy's commit and the final checkpoint's."""

from __future__ import annotations

import shutil
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
from mugrpo.commits.manifest import checkpoint_steps, latest_checkpoint, read_job_manifest
from mugrpo.commits.policies import read_policy_ref
from mugrpo.storage.layout import POLICY_REF_FILE, RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.checkpoint import read_optimizer_state

RUN = "resume-test"
UPDATES = 8


#: LoRA adapters of rank 4 on every linear layer (train.lora)
LORA = {"rank": 4, "alpha": 8.0}


def _launch(
    root: Path, tmp: Path, name: str, mixed_precision: str, checkpoint_dtype: str = "float32", lora: bool = False
) -> subprocess.Popen:
    train = {
        "updates_per_stage": UPDATES,
        "warmup_updates": 2,
        "lr_schedule": "cosine",
        "mixed_precision": mixed_precision,
        "checkpoint_dtype": checkpoint_dtype,
        "lora": LORA if lora else None,
    }
    # two kept checkpoints: what a kill between the policy's marker and the final checkpoint's leaves (the final
    # one prunes the one before only after its own commit)
    spec = write_spec(train_spec(root, RUN, train=train, keep_checkpoints=2), tmp / f"{name}.spec.json")
    return start_job("train", spec, tmp / f"{name}.log")


def _wait(proc: subprocess.Popen, tmp: Path, name: str) -> None:
    assert proc.wait(timeout=300) == 0, (tmp / f"{name}.log").read_text()[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mixed_precision", "checkpoint_dtype", "lora"),
    [("no", "float32", False), ("bf16", "float32", False), ("no", "bfloat16", False), ("no", "float32", True)],
)
def test_sigkill_mid_run_then_resume_is_bitwise_equal(
    tiny_model_dir, tmp_path, mixed_precision, checkpoint_dtype, lora
):
    """fp32, bf16 autocast over fp32 master weights, checkpoints holding bf16 weights and AdamW moments
    (train.checkpoint_dtype: the live state is rounded to them at each checkpoint), and LoRA adapters (train.lora:
    only the adapters and their moments are checkpointed and published): all resume bitwise on CPU."""
    layout = RunLayout(RUN)
    roots = {name: tmp_path / name for name in ("straight", "killed")}
    for root in roots.values():
        commit_synthetic_stage(Store(str(root)), RUN, tiny_model_dir, num_prompts=8, group_size=4, seed=11)
    straight = _launch(roots["straight"], tmp_path, "straight", mixed_precision, checkpoint_dtype, lora)
    killed = _launch(roots["killed"], tmp_path, "killed", mixed_precision, checkpoint_dtype, lora)
    store = Store(str(roots["killed"]))

    deadline = time.monotonic() + 240
    while not store.is_complete_dir(layout.checkpoint_dir(0, 2)):
        assert killed.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    assert read_job_manifest(store, RUN, 0, "train") is None and not store.exists(layout.policy_dir(1))
    last = latest_checkpoint(store, layout, 0)
    assert last is not None and last < UPDATES  # killed mid-run

    # What a kill between a part and its checkpoint's marker leaves: rows of uncommitted updates in a part.
    orphan = store.local_path(layout.train_steps_part(0, last + 2))
    if not orphan.exists():
        shutil.copy(store.local_path(layout.train_steps_part(0, last)), orphan)

    resumed = _launch(roots["killed"], tmp_path, "killed", mixed_precision, checkpoint_dtype, lora)
    _wait(resumed, tmp_path, "killed")
    _wait(straight, tmp_path, "straight")
    assert read_job_manifest(store, RUN, 0, "train").counts["resumed_from"] == last

    weights = "adapter_model.safetensors" if lora else "model.safetensors"  # LoRA: only the adapters published
    a = load_file(str(Store(str(roots["straight"])).local_path(layout.policy_dir(1)) / weights))
    b = load_file(str(store.local_path(layout.policy_dir(1)) / weights))
    if lora:
        assert a and all("lora_" in name for name in a)
        assert not store.exists(f"{layout.policy_dir(1)}/model.safetensors")
    assert a.keys() == b.keys()
    unequal = [name for name in a if not torch.equal(a[name], b[name])]
    assert not unequal, f"weights differ after resume: {unequal}"

    rows = {
        name: pq.read_table(Store(str(root)).local_path(layout.train_steps_dir(0))).sort_by("stage_update")
        for name, root in roots.items()
    }
    assert rows["killed"].column("stage_update").to_pylist() == list(range(1, UPDATES + 1))  # no duplicates
    for column in ("loss", "grad_norm", "lr", "ratio_mean", "num_tokens"):
        assert rows["killed"].column(column).to_pylist() == rows["straight"].column(column).to_pylist(), column

    # One copy of the weights: the final checkpoint references the published policy's files (path and sha256).
    final = {name: layout.checkpoint_dir(0, UPDATES) for name in roots}
    for name, root in roots.items():
        s = Store(str(root))
        ref = read_policy_ref(s, final[name])
        assert ref is not None and ref.policy_dir == layout.policy_dir(1), name
        assert ref.files == s.read_json(f"{layout.policy_dir(1)}/_COMPLETE")["files"]
        assert not s.exists(f"{final[name]}/model"), name
    assert_optimizer_equal(Store(str(roots["straight"])), store, final["straight"])
    stored = getattr(torch, checkpoint_dtype)
    assert {t.dtype for t in a.values()} == {stored}  # the published weights, which the final checkpoint shares
    moments = read_optimizer_state(store, final["killed"])["state"]
    assert {m[k].dtype for m in moments.values() for k in ("exp_avg", "exp_avg_sq")} == {stored}
    assert all(m["step"].dtype == torch.float32 for m in moments.values())

    if mixed_precision == "no" and not lora:  # the kill between the policy's commit and the final checkpoint's
        _killed_between_policy_and_final_checkpoint(store, tmp_path, a, checkpoint_dtype)


def assert_optimizer_equal(a: Store, b: Store, rel: str) -> None:
    """The AdamW states of checkpoint ``rel`` in two run roots are bitwise equal."""
    sa, sb = read_optimizer_state(a, rel), read_optimizer_state(b, rel)
    assert sa["state"].keys() == sb["state"].keys() and sa["state"]
    for key, moments in sa["state"].items():
        for m, value in moments.items():
            assert torch.equal(value, sb["state"][key][m]), f"AdamW {m} of {key} differs after resume"


def _killed_between_policy_and_final_checkpoint(
    store: Store, tmp: Path, straight_weights: dict, checkpoint_dtype: str
) -> None:
    """What a kill after policies/stage=1's marker and before the final checkpoint's leaves: no final checkpoint,
    no train manifest, the policy committed. The re-run resumes from the checkpoint before, re-trains the last
    updates and references the committed policy; the policy stays bitwise the uninterrupted run's weights, and the
    new final AdamW state equals the one it replaced."""
    layout = RunLayout(RUN)
    final = layout.checkpoint_dir(0, UPDATES)
    before = Store(str(tmp / "before"))
    before.write_bytes("optimizer.pt", store.read_bytes(f"{final}/optimizer.pt"))
    policy_marker = store.read_bytes(f"{layout.policy_dir(1)}/_COMPLETE")
    store.delete(f"{final}/_COMPLETE")
    store.delete(final, recursive=True)
    store.delete(layout.job_manifest(0, "train"))
    assert checkpoint_steps(store, layout, 0) == [UPDATES - 2]
    rerun = _launch(store.local_path(""), tmp, "between", "no", checkpoint_dtype)
    _wait(rerun, tmp, "between")
    assert read_job_manifest(store, RUN, 0, "train").counts["resumed_from"] == UPDATES - 2
    assert store.read_bytes(f"{layout.policy_dir(1)}/_COMPLETE") == policy_marker  # not re-published
    assert store.exists(f"{final}/{POLICY_REF_FILE}") and not store.exists(f"{final}/model")
    weights = load_file(str(store.local_path(layout.policy_dir(1)) / "model.safetensors"))
    assert all(torch.equal(weights[n], straight_weights[n]) for n in straight_weights)
    old = torch.load(before.local_path("optimizer.pt"), map_location="cpu", weights_only=True)
    new = read_optimizer_state(store, final)
    for key, moments in old["state"].items():
        for m, value in moments.items():
            assert torch.equal(value, new["state"][key][m]), f"AdamW {m} of {key} differs after the re-run"
