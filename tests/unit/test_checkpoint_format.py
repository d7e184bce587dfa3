"""Checkpoint formats (weights written once): a checkpoint that references the published policy's files
instead of holding a copy reads back the policy's weights, verified against the reference; a checkpoint of format 1
(every checkpoint with its own ``model/``, as written before) still restores; a reference that no longer matches
the policy is refused naming the file. Real files: the tiny policy, a local store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mugrpo.commits.policies import PolicyRef, committed_policy_ref, local_policy_dir
from mugrpo.storage.layout import POLICY_REF_FILE, RunLayout
from mugrpo.storage.store import ChecksumError, Store
from mugrpo.trainer.checkpoint import capture_rng_state, read_checkpoint, write_checkpoint

RUN = "ckpt-format"
LAYOUT = RunLayout(RUN)


def _optimizer_state() -> dict:
    """A small AdamW-shaped state dict (what get_optimizer_state_dict gives, keyed by parameter name)."""
    g = torch.Generator().manual_seed(3)
    return {
        "state": {
            "w": {
                "step": torch.tensor(4.0),
                "exp_avg": torch.randn(3, 2, generator=g),
                "exp_avg_sq": torch.rand(3, 2, generator=g),
            }
        },
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": ["w"]}],
    }


def _trainer_state(step: int) -> dict:
    return {"stage": 0, "stage_update": step, "global_update": step, "data_fingerprint": "f", "lr_schedule": {}}


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


def _publish(store: Store, tiny_model_dir: Path) -> str:
    rel = LAYOUT.policy_dir(1)
    store.upload_dir(tiny_model_dir, rel, meta={"stage": 1})
    return rel


def _write_shared_checkpoint(store: Store, rel: str, policy: str) -> dict:
    """A checkpoint at ``rel`` (update 2) referencing the committed ``policy``; returns its RNG state."""
    rng = capture_rng_state()
    write_checkpoint(
        store,
        rel,
        policy_ref=committed_policy_ref(store, policy),
        optimizer_state=_optimizer_state(),
        trainer_state=_trainer_state(2),
        rng_states=[rng],
    )
    return rng


def test_a_shared_checkpoint_holds_a_reference_and_reads_the_policys_weights(tmp_path, tiny_model_dir):
    store = Store(str(tmp_path / "runs"))
    policy = _publish(store, tiny_model_dir)
    rel = LAYOUT.checkpoint_dir(0, 2)
    rng = _write_shared_checkpoint(store, rel, policy)
    folder = store.local_path(rel)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["_COMPLETE", POLICY_REF_FILE, "optimizer.pt", "rng.safetensors", "trainer_state.json"]
    )
    ref = json.loads((folder / POLICY_REF_FILE).read_text())
    assert ref["policy"] == "policies/stage=1"  # run-relative, as manifests record paths
    assert ref["files"] == store.read_json(f"{policy}/_COMPLETE")["files"]

    ckpt = read_checkpoint(store, rel, tmp_path / "resume")
    assert ckpt.model_dir == store.local_path(policy)  # verified in place on a local store: no copy
    expected = _weights(tiny_model_dir)
    got = _weights(ckpt.model_dir)
    assert all(torch.equal(got[n], expected[n]) for n in expected)
    assert torch.equal(ckpt.optimizer_state["state"]["w"]["exp_avg"], _optimizer_state()["state"]["w"]["exp_avg"])
    assert torch.equal(ckpt.rng_states[0]["torch"], rng["torch"])
    assert ckpt.trainer_state["format"] == 2
    assert local_policy_dir(store, rel) == store.local_path(policy)  # as a behavior policy: the policy's folder


def test_a_corrupted_shared_weight_file_or_a_stale_reference_is_refused_naming_the_file(tmp_path, tiny_model_dir):
    store = Store(str(tmp_path / "runs"))
    policy = _publish(store, tiny_model_dir)
    rel = LAYOUT.checkpoint_dir(0, 2)
    _write_shared_checkpoint(store, rel, policy)
    weights = store.local_path(policy) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="policies/stage=1/model.safetensors"):
        read_checkpoint(store, rel, tmp_path / "resume")
    # The policy re-committed with other bytes (its marker now agrees with them): the reference no longer does.
    shutil.rmtree(store.local_path(policy))
    changed = tmp_path / "changed"
    shutil.copytree(tiny_model_dir, changed)
    tensors = _weights(changed)
    first = sorted(tensors)[0]
    tensors[first] = tensors[first] + 1
    save_file(tensors, str(changed / "model.safetensors"), metadata={"format": "pt"})
    _publish(store, changed)
    with pytest.raises(ChecksumError, match=r"policies/stage=1/model.safetensors.*checkpoints/stage=0/step=000002"):
        local_policy_dir(store, rel)
    shutil.rmtree(store.local_path(policy))  # the policy deleted: the checkpoint says where its weights were
    with pytest.raises(FileNotFoundError, match=r"step=000002 holds its weights in the policy .*policies/stage=1"):
        read_checkpoint(store, rel, tmp_path / "resume2")


def test_write_checkpoint_takes_exactly_one_source_of_weights(tmp_path, tiny_model_dir):
    store = Store(str(tmp_path / "runs"))
    ref = PolicyRef(LAYOUT.policy_dir(1), {})
    common = {"optimizer_state": {}, "trainer_state": _trainer_state(1), "rng_states": [capture_rng_state()]}
    with pytest.raises(ValueError, match="exactly one of save_model and policy_ref"):
        write_checkpoint(store, LAYOUT.checkpoint_dir(0, 1), **common)
    with pytest.raises(ValueError, match="exactly one of save_model and policy_ref"):
        write_checkpoint(store, LAYOUT.checkpoint_dir(0, 1), save_model=print, policy_ref=ref, **common)


def _write_format1_checkpoint(store: Store, rel: str, model_dir: Path, optimizer_state: dict, rng: dict, tmp: Path):
    """A checkpoint as the format-1 writer laid it out: model/ (the HF dir), optimizer.pt, rng.safetensors,
    trainer_state.json with "format": 1, uploaded with its marker last."""
    folder = tmp / "format1"
    shutil.copytree(model_dir, folder / "model")
    torch.save(optimizer_state, folder / "optimizer.pt")
    save_file({"rank0.torch": rng["torch"]}, str(folder / "rng.safetensors"))
    json_rng = [{"numpy": rng["numpy"], "python": rng["python"], "cuda_devices": 0}]
    payload = {"format": 1, **_trainer_state(4), "rng": json_rng}
    (folder / "trainer_state.json").write_text(json.dumps(payload, indent=2, sort_keys=True))
    store.upload_dir(folder, rel, meta={"step": 4})


def test_a_format1_checkpoint_still_restores(tmp_path, tiny_model_dir):
    """Written before weights were shared: its own model/ is read, optimizer and RNG states as before, and it
    still serves as a behavior policy (an unpublished stage's final checkpoint)."""
    store = Store(str(tmp_path / "runs"))
    rel = LAYOUT.checkpoint_dir(0, 4)
    rng = capture_rng_state()
    _write_format1_checkpoint(store, rel, tiny_model_dir, _optimizer_state(), rng, tmp_path)
    ckpt = read_checkpoint(store, rel, tmp_path / "resume")
    assert ckpt.step == 4 and ckpt.trainer_state["format"] == 1
    assert ckpt.model_dir == tmp_path / "resume" / "model"
    expected = _weights(tiny_model_dir)
    got = _weights(ckpt.model_dir)
    assert expected.keys() == got.keys() and all(torch.equal(got[n], expected[n]) for n in expected)
    assert torch.equal(ckpt.optimizer_state["state"]["w"]["exp_avg_sq"], _optimizer_state()["state"]["w"]["exp_avg_sq"])
    assert torch.equal(ckpt.rng_states[0]["torch"], rng["torch"]) and ckpt.rng_states[0]["cuda"] == []
    assert local_policy_dir(store, rel) == store.local_path(rel) / "model"


def test_an_unknown_checkpoint_format_is_refused(tmp_path, tiny_model_dir):
    store = Store(str(tmp_path / "runs"))
    rel = LAYOUT.checkpoint_dir(0, 4)
    _write_format1_checkpoint(store, rel, tiny_model_dir, _optimizer_state(), capture_rng_state(), tmp_path)
    state = store.local_path(rel) / "trainer_state.json"
    doc = json.loads(state.read_text())
    doc["format"] = 99
    state.write_text(json.dumps(doc))
    marker = store.read_json(f"{rel}/_COMPLETE")
    marker["files"]["trainer_state.json"] = store.hash_file(f"{rel}/trainer_state.json")[0]
    store.write_json(f"{rel}/_COMPLETE", marker)
    with pytest.raises(ValueError, match="checkpoint format 99 is not one of"):
        read_checkpoint(store, rel, tmp_path / "resume")
