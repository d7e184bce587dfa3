"""Training checkpoints: written atomically, loaded without unpickling anything from storage.

A checkpoint of stage k after stage update n lives at ``checkpoints/stage=k/step=n`` (:class:`RunLayout`)::

    model/               HF dir of the policy (config, model.safetensors, generation config, tokenizer), or
    policy.ref.json      instead, in the final checkpoint of a stage that publishes its policy: the run-relative
                         path and sha256 of each file of policies/stage=k+1, which holds the same weights
    optimizer.pt         AdamW state dict keyed by parameter name; read with torch.load(weights_only=True); pruned
                         from older stages' checkpoints by train.keep_optimizer_state (mugrpo.commits.retention:
                         the marker then records it under "pruned", and reading the checkpoint raises
                         OptimizerStatePruned)
    rng.safetensors      torch CPU (and CUDA) generator states, one set per data-parallel rank
    trainer_state.json   update counters, data cursor, LR schedule, Python and NumPy RNG states (JSON, no pickle)
    _COMPLETE            written last by Store.upload_dir: a folder without it is ignored and replaced

The files are first written to a local temporary folder, then uploaded file by file (each atomic) with the marker
last, so a SIGKILL at any moment leaves either a complete checkpoint or one that resume ignores.

Weights written once (:mod:`mugrpo.commits.policies`): the stage's final checkpoint is written after the policy is
published and references it, so each stage writes its fp32 weights once. The checkpoint references the policy (not
the reverse) because the policy is what every other job reads and must stay a plain HF dir, and it is committed
first. Under FSDP the weights are still gathered into one full state dict (``full_state_options``), so a
multi-process checkpoint shares them the same way. Format 1 (every checkpoint with its own ``model/``, written
before this) still reads.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from mugrpo.commits.manifest import checkpoint_steps
from mugrpo.commits.policies import PolicyRef, parse_policy_ref
from mugrpo.commits.retention import OPTIMIZER_FILE as OPTIMIZER_FILE
from mugrpo.commits.retention import refuse_pruned
from mugrpo.common.scratch import scratch, scratch_dir
from mugrpo.storage.layout import POLICY_REF_FILE, RunLayout
from mugrpo.storage.store import COMPLETE_MARKER, Store

MODEL_DIR = "model"
RNG_FILE = "rng.safetensors"
STATE_FILE = "trainer_state.json"
#: 2: the weights may be a reference to the published policy (POLICY_REF_FILE). 1: always ``model/``; still read.
CHECKPOINT_FORMAT = 2
READABLE_FORMATS = (1, 2)


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states: torch CPU/CUDA generators (tensors), NumPy and Python ``random`` (JSON-able)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


@dataclass
class LoadedCheckpoint:
    """A checkpoint read back from storage.

    Attributes:
        step: the stage update it was taken after.
        model_dir: local HF dir of the policy weights (load it with :func:`mugrpo.policy.models.load_policy`): the
            checkpoint's ``model/``, or the referenced policy's folder (verified against the reference's sha256).
        optimizer_state: the optimizer state dict (tensors and plain Python values only).
        trainer_state: the JSON state (counters, data cursor, LR schedule).
        rng_states: one :func:`capture_rng_state` dict per data-parallel rank.
    """

    step: int
    model_dir: Path
    optimizer_state: dict[str, Any]
    trainer_state: dict[str, Any]
    rng_states: list[dict[str, Any]]
    local_dir: Path | None = None  # the downloaded checkpoint folder (default: model_dir's parent)

    def extra_file(self, name: str) -> bytes | None:
        """A file written through ``write_checkpoint(extra_files=...)`` (verified on download), or None."""
        path = (self.local_dir or self.model_dir.parent) / name
        return path.read_bytes() if path.exists() else None


def write_checkpoint(
    store: Store,
    rel: str,
    *,
    save_model: Any = None,
    policy_ref: PolicyRef | None = None,
    optimizer_state: dict[str, Any],
    trainer_state: dict[str, Any],
    rng_states: list[dict[str, Any]],
    tmp_root: str | None = None,
    extra_files: dict[str, bytes] | None = None,
) -> dict[str, str]:
    """Write a checkpoint folder at ``rel`` atomically (local temp folder, upload, ``_COMPLETE`` last).

    Args:
        save_model: ``fn(local_dir)`` writing the policy as an HF dir (safetensors) into ``local_dir``.
        policy_ref: instead of ``save_model``: the committed published policy holding these very weights; the
            checkpoint then stores only this reference (:data:`~mugrpo.storage.layout.POLICY_REF_FILE`).
        optimizer_state: state dict of tensors and plain values (saved with torch.save, read with weights_only).
        trainer_state: JSON-able dict.
        rng_states: per-rank :func:`capture_rng_state` dicts (rank order).
        tmp_root: parent of the local temporary folder (default: the system temp dir).
        extra_files: more files of the checkpoint, {name: bytes} (e.g. an algorithm's state), covered by the
            marker like the others.

    Returns:
        {file name: sha256} of the uploaded files.

    Raises:
        mugrpo.coordination.lease.LeaseFenced: this writer does not hold the run lease.
        ValueError: not exactly one of ``save_model`` and ``policy_ref``.
    """
    if (save_model is None) == (policy_ref is None):
        raise ValueError("write_checkpoint: give exactly one of save_model and policy_ref")
    if store.exists(rel):  # an uncommitted leftover of a killed run: replace it whole
        store.delete(rel, recursive=True)
    tmp = scratch_dir("ckpt", parent=tmp_root)
    try:
        if policy_ref is not None:
            (tmp / POLICY_REF_FILE).write_bytes(policy_ref.to_bytes())
        else:
            save_model(tmp / MODEL_DIR)
        torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
        tensors: dict[str, torch.Tensor] = {}
        json_rng = []
        for rank, state in enumerate(rng_states):
            tensors[f"rank{rank}.torch"] = state["torch"]
            for device, cuda_state in enumerate(state["cuda"]):
                tensors[f"rank{rank}.cuda{device}"] = cuda_state
            json_rng.append({"numpy": state["numpy"], "python": state["python"], "cuda_devices": len(state["cuda"])})
        save_file(tensors, str(tmp / RNG_FILE))
        payload = {"format": CHECKPOINT_FORMAT, **trainer_state, "rng": json_rng}
        (tmp / STATE_FILE).write_text(json.dumps(payload, indent=2, sort_keys=True))
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
        return store.upload_dir(tmp, rel, meta={"step": trainer_state.get("stage_update")})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_checkpoint(store: Store, rel: str, local_dir: Path) -> LoadedCheckpoint:
    """Download a committed checkpoint into ``local_dir`` (verifying every sha256) and read it.

    Nothing is unpickled: tensors come from safetensors or ``torch.load(weights_only=True)``, the rest from JSON.
    A checkpoint that references its published policy (:data:`~mugrpo.storage.layout.POLICY_REF_FILE`) gets the policy's
    files verified against the reference's sha256: in place on a local store (no copy), else downloaded.

    Raises:
        FileNotFoundError: ``rel`` is not a committed checkpoint, or a referenced policy file is missing.
        mugrpo.storage.store.ChecksumError: a file (of the checkpoint or of the referenced policy) differs from its
            recorded checksum (names it).
        mugrpo.commits.retention.OptimizerStatePruned: its optimizer state was pruned (``train.keep_optimizer_state``).
        ValueError: an unknown checkpoint format.
    """
    refuse_pruned(store, rel, "the stage's training resumes from this checkpoint")
    store.download_dir(rel, local_dir)
    state = json.loads((local_dir / STATE_FILE).read_text())
    if state.get("format") not in READABLE_FORMATS:
        fmt = state.get("format")
        raise ValueError(f"{store.uri(rel)}: checkpoint format {fmt!r} is not one of {READABLE_FORMATS}")
    model_dir = local_dir / MODEL_DIR
    if (local_dir / POLICY_REF_FILE).exists():
        ref = parse_policy_ref((local_dir / POLICY_REF_FILE).read_bytes(), rel, store.uri(f"{rel}/{POLICY_REF_FILE}"))
        model_dir = _referenced_policy(store, rel, ref, model_dir)
    tensors = load_file(str(local_dir / RNG_FILE))
    rng_states = []
    for rank, extra in enumerate(state.pop("rng")):
        rng_states.append(
            {
                "torch": tensors[f"rank{rank}.torch"],
                "cuda": [tensors[f"rank{rank}.cuda{d}"] for d in range(extra["cuda_devices"])],
                "numpy": extra["numpy"],
                "python": extra["python"],
            }
        )
    optimizer_state = torch.load(local_dir / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
    return LoadedCheckpoint(
        step=int(state["stage_update"]),
        model_dir=model_dir,
        optimizer_state=optimizer_state,
        trainer_state=state,
        rng_states=rng_states,
        local_dir=local_dir,
    )


def _referenced_policy(store: Store, rel: str, ref: PolicyRef, download_to: Path) -> Path:
    """A local HF dir of the policy files the checkpoint ``rel`` references, each verified against the reference's
    sha256: the policy folder itself on a local store, else a download into ``download_to``.

    Raises:
        FileNotFoundError: the policy is not committed (names it and the checkpoint).
        mugrpo.storage.store.ChecksumError: a file differs from the reference's sha256.
    """
    if not store.is_complete_dir(ref.policy_dir):
        raise FileNotFoundError(
            f"checkpoint {store.uri(rel)} holds its weights in the policy {store.uri(ref.policy_dir)}, which is not "
            "committed: restore that policy, or delete the checkpoint to resume from the one before"
        )
    local = store.local_path(ref.policy_dir)
    for name, digest in ref.files.items():
        path = f"{ref.policy_dir}/{name}"
        if local is not None:
            store.verify_file(path, digest)
        else:
            store.read_to_file(path, download_to / name, expected_sha256=digest)
    return local if local is not None else download_to


def prune_checkpoints(store: Store, layout: RunLayout, stage: int, keep: int) -> list[int]:
    """Delete all but the ``keep`` latest committed checkpoints of ``stage``; returns the deleted steps.

    The marker goes first, so a folder whose deletion is interrupted is an uncommitted one, never a torn
    committed one.
    """
    doomed = checkpoint_steps(store, layout, stage)[:-keep] if keep > 0 else []
    for step in doomed:
        rel = layout.checkpoint_dir(stage, step)
        store.delete(f"{rel}/{COMPLETE_MARKER}")
        store.delete(rel, recursive=True)
    return doomed


def read_optimizer_state(store: Store, rel: str) -> dict[str, Any]:
    """Only the optimizer state of the committed checkpoint ``rel``, verified against the marker's sha256.

    Raises:
        FileNotFoundError: ``rel`` is not a committed checkpoint.
        mugrpo.storage.store.ChecksumError: ``optimizer.pt`` differs from the marker's checksum.
        mugrpo.commits.retention.OptimizerStatePruned: it was pruned (``train.keep_optimizer_state``).
    """
    if not store.is_complete_dir(rel):
        raise FileNotFoundError(f"{store.uri(rel)} is not a committed checkpoint")
    refuse_pruned(store, rel, "the next stage's training starts from them")
    marker = store.read_json(f"{rel}/{COMPLETE_MARKER}")
    path, expected = f"{rel}/{OPTIMIZER_FILE}", marker["files"][OPTIMIZER_FILE]
    local = store.local_path(path)
    if local is not None:  # a local store: hash and load the committed file in place, no 1 GB-scale copy
        store.verify_file(path, expected)
        return torch.load(local, map_location="cpu", weights_only=True)
    with scratch("optim") as tmp:  # streamed and hashed on the fly
        copy = tmp / OPTIMIZER_FILE
        store.read_to_file(path, copy, expected_sha256=expected)
        return torch.load(copy, map_location="cpu", weights_only=True)
