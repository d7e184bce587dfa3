"""Storage layer: atomic writes (SIGKILL mid-write leaves no visible file), checksums, local and S3."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _s3 import moto_server, s3_root  # noqa: F401  (fixtures)

from mugrpo.commits.manifest import new_manifest, read_manifest, verify_manifest, write_manifest
from mugrpo.storage.layout import RunLayout, parse_checkpoint_step, parse_shard, validate_run_id
from mugrpo.storage.store import ChecksumError, Store

WRITER = r"""
import sys, time
from mugrpo.storage.store import Store
store = Store(sys.argv[1])
# Write a large file slowly through the same atomic path the jobs use: patch os.fsync to stall mid-write.
import os
real_fsync = os.fsync
def stall(fd):
    print("WRITING", flush=True)
    time.sleep(60)
os.fsync = stall
store.write_bytes("run/rollouts/stage=0/shard=00000.parquet", b"x" * 50_000_000)
"""


def test_sigkill_mid_write_leaves_no_visible_partial_file(tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "WRITING"  # the bytes are in the temp file, not yet renamed
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    store = Store(str(tmp_path))
    folder = "run/rollouts/stage=0"
    assert not store.exists(f"{folder}/shard=00000.parquet")
    assert store.listdir(folder) == []  # the orphan temp file is hidden from listings
    leftovers = os.listdir(tmp_path / folder)
    assert len(leftovers) == 1 and ".tmp-" in leftovers[0]
    # A re-run writes the file whole.
    store.write_bytes(f"{folder}/shard=00000.parquet", b"ok")
    assert store.read_bytes(f"{folder}/shard=00000.parquet") == b"ok"


def test_checksum_mismatch_is_detected_with_a_clear_error(tmp_path: Path):
    store = Store(str(tmp_path))
    layout = RunLayout("r1")
    rel = layout.rollout_shard(0, 0)
    digest = store.write_bytes(rel, b"payload")
    from schemas import FileRecord

    manifest = new_manifest("r1", 0, [FileRecord(path=layout.rel(rel), sha256=digest, bytes=7)])
    write_manifest(store, manifest)
    verify_manifest(store, read_manifest(store, "r1", 0))  # intact: passes
    (tmp_path / rel).write_bytes(b"tampered")
    with pytest.raises(ChecksumError, match=r"checksum mismatch for .*shard=00000\.parquet.*manifest says sha256"):
        verify_manifest(store, read_manifest(store, "r1", 0))


def test_folders_commit_with_a_marker_and_verify_on_download(tmp_path: Path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"a")
    (src / "sub" / "b.bin").write_bytes(b"b")
    store = Store(str(tmp_path / "root"))
    assert not store.is_complete_dir("run/policies/stage=0")
    store.upload_dir(src, "run/policies/stage=0")
    assert store.is_complete_dir("run/policies/stage=0")
    out = store.download_dir("run/policies/stage=0", tmp_path / "out")
    assert (out / "sub" / "b.bin").read_bytes() == b"b"
    (tmp_path / "root/run/policies/stage=0/a.bin").write_bytes(b"changed")
    with pytest.raises(ChecksumError):
        store.download_dir("run/policies/stage=0", tmp_path / "out2")


def test_s3_store_round_trip_and_atomic_put(s3_root):
    url, opts = s3_root
    store = Store(url, opts)
    assert store.uri("x/y.json").startswith("s3://")
    store.write_json("r/run.json", {"a": 1})
    assert store.read_json("r/run.json") == {"a": 1}
    assert store.listdir("r") == ["run.json"]
    assert store.read_bytes("r/run.json", expected_sha256=None)
    with pytest.raises(ChecksumError):
        store.read_bytes("r/run.json", expected_sha256="0" * 64)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        store.read_bytes("r/missing.json")


def test_layout_is_hive_partitioned_and_rejects_unsafe_ids():
    lay = RunLayout("exp-1")
    assert lay.rollout_shard(2, 3) == "exp-1/rollouts/stage=2/shard=00003.parquet"
    assert lay.train_steps_part(0, 1) == "exp-1/train_steps/stage=0/part-00001.parquet"
    assert lay.checkpoint_dir(1, 12) == "exp-1/checkpoints/stage=1/step=000012"
    assert lay.eval_file(4, "gsm8k") == "exp-1/evals/stage=4/gsm8k.parquet"
    assert lay.stage_manifest(0) == "exp-1/stages/stage=0.json"
    assert lay.policy_dir(1) == "exp-1/policies/stage=1"
    assert parse_checkpoint_step("step=000012") == 12 and parse_checkpoint_step(".step=1.tmp") is None
    assert parse_shard("shard=00003.parquet") == 3 and parse_shard("x.parquet") is None
    for bad in ["", "../x", "a/b", ".hidden", "a b"]:
        with pytest.raises(ValueError, match="run_id"):
            validate_run_id(bad)
