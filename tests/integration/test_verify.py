"""Corruption and verification: flipped bytes in a rollout shard, a checkpoint (weights and optimizer
state) and a manifest are found by `mugrpo verify` (per stage intact / corrupted / missing, exit code), refused by
the consuming job (exit 2, the file named) and by a resume (the file named and how to recover).

Real files: a committed synthetic stage (tiny policy, real Parquet shards) and a real train job subprocess that
writes real checkpoints."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _tiny import DEFAULT, REPO_ROOT, job_env, train_spec, write_spec

from bench.support.synthetic import commit_synthetic_stage
from mugrpo.commits.verify import CorruptedRunError, refuse_corrupted, verify_run
from mugrpo.config import config_from_dict
from mugrpo.orchestration.runs import init_run
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store

RUN = "verify-test"


def flip_byte(path: Path, offset: int | None = None) -> None:
    """Flip every bit of one byte of ``path`` (the middle one by default)."""
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def train_job(root: Path, tmp: Path, name: str, updates: int = 2) -> subprocess.CompletedProcess:
    train = {"updates_per_stage": updates, "checkpoint_every": 1, "lr": DEFAULT}
    path = write_spec(train_spec(root, RUN, train=train), tmp / f"{name}.spec.json")
    return subprocess.run(
        [sys.executable, "-m", "mugrpo.jobs.train", str(path)],
        cwd=REPO_ROOT,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir) -> Path:
    """A run root whose stage 0 has committed rollouts, two checkpoints and a train job manifest."""
    root = tmp_path_factory.mktemp("verify") / "runs"
    commit_synthetic_stage(Store(str(root)), RUN, tiny_model_dir, num_prompts=8, group_size=4, seed=3)
    out = train_job(root, root.parent, "train")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return root


@pytest.fixture
def run_copy(trained, tmp_path) -> tuple[Store, Path]:
    root = tmp_path / "runs"
    shutil.copytree(trained, root)
    return Store(str(root)), root / RUN


def test_intact_run_verifies_every_committed_file(run_copy):
    store, run = run_copy
    report = verify_run(store, RUN, num_stages=1)
    assert report.ok and report.problems() == []
    stage0 = report.stages[0]
    names = set(stage0.intact)
    assert any(n.startswith("rollouts/stage=0/shard=") for n in names)
    assert "checkpoints/stage=0/step=000002/optimizer.pt" in names
    # The final checkpoint holds no weights of its own: it references the published policy's files.
    assert "checkpoints/stage=0/step=000002/policy.ref.json" in names
    assert not (run / "checkpoints/stage=0/step=000002/model").exists()
    assert "policies/stage=1/model.safetensors" in names  # checked through the train manifest and the reference
    assert "policies/stage=0/model.safetensors" in names
    assert report.stages[1].label == "final" and "policies/stage=1/model.safetensors" in report.stages[1].intact
    assert report.total_bytes == sum((run / n).stat().st_size for n in {n for s in report.stages for n in s.intact})


@pytest.mark.parametrize(
    "victim",
    [
        "rollouts/stage=0/shard=00000.parquet",
        "checkpoints/stage=0/step=000002/optimizer.pt",
    ],
)
def test_a_flipped_byte_is_reported_corrupted_and_resume_refuses_it(run_copy, victim):
    store, run = run_copy
    flip_byte(run / victim)
    report = verify_run(store, RUN, num_stages=1)
    assert not report.ok
    assert list(report.stages[0].corrupted) == [victim]
    assert "differs from the manifest" in report.stages[0].corrupted[victim]
    with pytest.raises(CorruptedRunError, match=rf"corrupted .*{victim}.*\n.*recover: restore"):
        refuse_corrupted(store, RUN, 1)


SHARED = "policies/stage=1/model.safetensors"


def test_a_corrupted_shared_weight_file_is_reported_from_the_policy_and_the_checkpoint(run_copy):
    """The stage's weights are stored once (policies/stage=1, referenced by the final checkpoint of stage 0): a
    flipped byte is reported under the policy's stage ("final") and under the checkpoint's (stage 0), each naming
    the file; resume refuses it."""
    store, run = run_copy
    flip_byte(run / SHARED)
    report = verify_run(store, RUN, num_stages=1)
    assert list(report.stages[1].corrupted) == [SHARED]  # the policy's view: its marker
    assert list(report.stages[0].corrupted) == [SHARED]  # the checkpoint's stage (its train manifest lists it too)
    with pytest.raises(CorruptedRunError, match=rf"stage 0: corrupted .*{SHARED}"):
        refuse_corrupted(store, RUN, 1)


def test_a_file_two_stages_reach_is_read_once(run_copy, monkeypatch):
    """The published policy is reached from stage 0 (its train manifest, its final checkpoint's reference) and from
    "final" (the policy's own marker): one check lists it under both, reads it once and counts its bytes once."""
    store, run = run_copy
    reads = []
    hash_file = Store.hash_file
    monkeypatch.setattr(Store, "hash_file", lambda self, rel: reads.append(rel) or hash_file(self, rel))
    report = verify_run(store, RUN, num_stages=1)
    assert report.ok
    assert SHARED in report.stages[0].intact and SHARED in report.stages[1].intact
    assert sum(r.endswith(SHARED) for r in reads) == 1 and len(reads) == len(set(reads))
    files = {n for s in report.stages for n in s.intact}
    assert report.total_files == len(files) < sum(s.files for s in report.stages)
    assert report.total_bytes == sum((run / n).stat().st_size for n in files)


def test_the_checkpoint_alone_detects_a_corrupted_shared_weight_file(run_copy):
    """Killed after the final checkpoint, before the train manifest: only the checkpoint's reference covers the
    policy's weights within stage 0. verify names the file and the referencing checkpoint; reading the checkpoint
    (what a resume does) raises a ChecksumError naming the file."""
    from mugrpo.storage.store import ChecksumError
    from mugrpo.trainer.checkpoint import read_checkpoint

    store, run = run_copy
    layout = RunLayout(RUN)
    store.delete(layout.job_manifest(0, "train"))
    assert verify_run(store, RUN, num_stages=1).ok
    flip_byte(run / SHARED)
    stage0 = verify_run(store, RUN, num_stages=1).stages[0]
    assert list(stage0.corrupted) == [SHARED]
    assert "checkpoints/stage=0/step=000002 references" in stage0.corrupted[SHARED]
    with pytest.raises(ChecksumError, match="policies/stage=1/model.safetensors"):
        read_checkpoint(store, layout.checkpoint_dir(0, 2), run.parent / "resume")
    (run / SHARED).unlink()
    stage0 = verify_run(store, RUN, num_stages=1).stages[0]
    assert stage0.missing == [f"{SHARED} (referenced by checkpoints/stage=0/step=000002)"]


def test_a_flipped_byte_in_a_manifest_and_a_missing_file_are_reported(run_copy):
    store, run = run_copy
    manifest = run / "jobs/stage=0/train.manifest.json"
    text = manifest.read_text()
    manifest.write_text(text.replace('"job"', '"jo\x00"', 1))  # one byte changed: no longer a valid manifest
    (run / "rollouts/stage=0/shard=00001.parquet").unlink()
    report = verify_run(store, RUN, num_stages=1)
    stage0 = report.stages[0]
    assert "jobs/stage=0/train.manifest.json" in stage0.corrupted
    assert "manifest does not parse" in stage0.corrupted["jobs/stage=0/train.manifest.json"]
    assert stage0.missing == ["rollouts/stage=0/shard=00001.parquet"]

    # A flipped hex digit of a recorded sha256 (the manifest still parses): the file it names "differs".
    manifest.write_text(text)
    gen = run / "jobs/stage=0/generate.manifest.json"
    gtext = gen.read_text()
    i = gtext.index('"sha256": "') + len('"sha256": "')
    gen.write_text(gtext[:i] + ("0" if gtext[i] != "0" else "1") + gtext[i + 1 :])
    report = verify_run(store, RUN, num_stages=1)
    assert any("differs from the manifest" in why for why in report.stages[0].corrupted.values())


def test_verify_cli_prints_per_stage_counts_and_exit_code(run_copy):
    store, run = run_copy
    cmd = [sys.executable, "-m", "mugrpo.cli", "verify", str(run)]
    # run.json is needed by the CLI (it reads num_stages from it): write one as a run would.
    cfg = config_from_dict({"run": {"id": RUN, "root": str(run.parent), "num_stages": 1}}, source="test")
    store.write_json(RunLayout(RUN).run_json, {"run_id": RUN, "config": cfg.to_json_dict()})
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "intact:" in ok.stdout and "corrupted" in ok.stdout  # the table's header
    flip_byte(run / "checkpoints/stage=0/step=000002/optimizer.pt")
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert bad.returncode == 1
    assert "stage 0: corrupted" in bad.stderr and "step=000002/optimizer.pt" in bad.stderr
    assert "recover:" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "victim",
    [
        "rollouts/stage=0/shard=00001.parquet",
        SHARED,  # the final checkpoint's weights, stored once in the published policy
        "checkpoints/stage=0/step=000002/optimizer.pt",
    ],
)
def test_the_consuming_train_job_refuses_a_tampered_input_naming_it(run_copy, tmp_path, victim):
    """The train job of a stage resumes from its latest checkpoint (as after a kill before its commit) and reads
    the rollouts: a flipped byte in either fails it with exit 2 (not retried) and the file's URL."""
    store, run = run_copy
    layout = RunLayout(RUN)
    store.delete(layout.job_manifest(0, "train"))  # as if killed after the last checkpoint (policy published before)
    flip_byte(run / victim)
    out = train_job(run.parent, tmp_path, "tampered", updates=3)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout + out.stderr
    assert "refusing a tampered input" in text and victim.rsplit("/", 1)[-1] in text
    assert not store.is_complete_dir(layout.checkpoint_dir(0, 3))  # nothing built on it


def test_init_run_then_resume_check_on_a_config_run(tmp_path, tiny_model_dir):
    """The initial policy written by init_run is covered: a flipped byte in it is refused before any stage."""
    cfg = config_from_dict(
        {"run": {"id": RUN, "root": str(tmp_path), "num_stages": 1}, "model": {"source": str(tiny_model_dir)}},
        source="test",
    )
    store = init_run(cfg)
    assert refuse_corrupted(store, RUN, 1).ok
    flip_byte(tmp_path / RUN / "policies/stage=0/model.safetensors")
    with pytest.raises(CorruptedRunError, match="policies/stage=0/model.safetensors"):
        refuse_corrupted(store, RUN, 1)


def test_carried_optimizer_state_is_checked_where_it_lies(run_copy):
    """The next stage's AdamW moments (``read_optimizer_state``) are hashed and loaded in place on a local store:
    the loaded state is the file's, and a flipped byte is a ChecksumError naming the file, not a bad load."""
    import torch

    from mugrpo.storage.store import ChecksumError
    from mugrpo.trainer.checkpoint import read_optimizer_state

    store, run = run_copy
    rel = RunLayout(RUN).checkpoint_dir(0, 2)
    path = run / "checkpoints/stage=0/step=000002/optimizer.pt"
    state = read_optimizer_state(store, rel)
    on_disk = torch.load(path, map_location="cpu", weights_only=True)
    assert state["state"] and state["state"].keys() == on_disk["state"].keys()
    for key, moments in on_disk["state"].items():
        assert all(torch.equal(state["state"][key][m], moments[m]) for m in ("exp_avg", "exp_avg_sq"))
    flip_byte(path)
    with pytest.raises(ChecksumError, match="step=000002/optimizer.pt"):
        read_optimizer_state(store, rel)
