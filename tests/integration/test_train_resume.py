"""Acceptance (issue 4): SIGKILL the training job mid-run, re-run it, and get final weights bitwise equal to an
uninterrupted run with the same seed, with exactly one train_steps row per update. Tiny policy on CPU, real
subprocesses, real files. Marked slow (three real job processes, ~25 s on an idle 2-core machine): `make test`
runs it, the quick `-m "not slow"` selection skips it."""

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
from mugrpo.layout import RunLayout
from mugrpo.manifest import latest_checkpoint, read_job_manifest
from mugrpo.storage import Store

RUN = "resume-test"
UPDATES = 8


def _launch(root: Path, tmp: Path, name: str, mixed_precision: str) -> subprocess.Popen:
    train = {
        "updates_per_stage": UPDATES,
        "warmup_updates": 2,
        "lr_schedule": "cosine",
        "mixed_precision": mixed_precision,
    }
    spec = write_spec(train_spec(root, RUN, train=train), tmp / f"{name}.spec.json")
    return start_job("train", spec, tmp / f"{name}.log")


def _wait(proc: subprocess.Popen, tmp: Path, name: str) -> None:
    assert proc.wait(timeout=300) == 0, (tmp / f"{name}.log").read_text()[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_sigkill_mid_run_then_resume_is_bitwise_equal(tiny_model_dir, tmp_path, mixed_precision):
    """fp32, and bf16 autocast over fp32 master weights (issue 11): both resume bitwise on CPU."""
    layout = RunLayout(RUN)
    roots = {name: tmp_path / name for name in ("straight", "killed")}
    for root in roots.values():
        commit_synthetic_stage(Store(str(root)), RUN, tiny_model_dir, num_prompts=8, group_size=4, seed=11)
    straight = _launch(roots["straight"], tmp_path, "straight", mixed_precision)
    killed = _launch(roots["killed"], tmp_path, "killed", mixed_precision)
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

    resumed = _launch(roots["killed"], tmp_path, "killed", mixed_precision)
    _wait(resumed, tmp_path, "killed")
    _wait(straight, tmp_path, "straight")
    assert read_job_manifest(store, RUN, 0, "train").counts["resumed_from"] == last

    a = load_file(str(Store(str(roots["straight"])).local_path(layout.policy_dir(1)) / "model.safetensors"))
    b = load_file(str(store.local_path(layout.policy_dir(1)) / "model.safetensors"))
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
