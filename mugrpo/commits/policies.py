"""Committed policy folders on local disk: the folder itself on a local store, else a verified cached download.

Weights written once: the final checkpoint of a stage that publishes its policy (``checkpoints/stage=k/step=N``)
holds no copy of the weights. Its :data:`~mugrpo.storage.layout.POLICY_REF_FILE` references the files of the published
policy ``policies/stage=k+1`` by run-relative path and sha256 (:class:`PolicyRef`). The checkpoint references the
policy, not the reverse, because the policy is the product (generation, evaluation, the next stage and the user
read it, and it must stay a plain HF dir) and is committed first, so a checkpoint never points at an uncommitted
folder; checkpoints are pruned, the policies they reference are not. Every other checkpoint (an intermediate one,
or the final one of a stage whose policy is not published, ``orchestration.publish_policy_every``) keeps its own
``model/``.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from pathlib import Path

from mugrpo.storage.cache import cached
from mugrpo.storage.layout import POLICY_REF_FILE, RunLayout
from mugrpo.storage.store import COMPLETE_MARKER, ChecksumError, Store


@dataclass(frozen=True)
class PolicyRef:
    """The weights of a checkpoint, stored once in a published policy.

    Attributes:
        policy_dir: store path of the policy folder (``{run_id}/policies/stage=k+1``).
        files: {file name in that folder: sha256} of every file of the HF dir (weights, config, tokenizer).
    """

    policy_dir: str
    files: dict[str, str]

    def to_bytes(self) -> bytes:
        """The :data:`~mugrpo.storage.layout.POLICY_REF_FILE` content (the path stored run-relative, as manifests
        do)."""
        layout = RunLayout(self.policy_dir.split("/", 1)[0])
        doc = {"policy": layout.rel(self.policy_dir), "files": dict(sorted(self.files.items()))}
        return json.dumps(doc, indent=2).encode()


def committed_policy_ref(store: Store, policy_rel: str) -> PolicyRef:
    """A :class:`PolicyRef` to the committed policy folder ``policy_rel`` (its marker's files and sha256).

    Raises:
        FileNotFoundError: the folder is not committed.
    """
    if not store.is_complete_dir(policy_rel):
        raise FileNotFoundError(f"policy {store.uri(policy_rel)} is not committed (no _COMPLETE marker)")
    return PolicyRef(policy_rel, dict(store.read_json(f"{policy_rel}/{COMPLETE_MARKER}")["files"]))


def read_policy_ref(store: Store, checkpoint_rel: str) -> PolicyRef | None:
    """The policy reference of the checkpoint folder ``checkpoint_rel``, or None when it holds its own ``model/``.

    Raises:
        ValueError: the reference file does not parse (names it).
    """
    path = posixpath.join(checkpoint_rel, POLICY_REF_FILE)
    if not store.exists(path):
        return None
    return parse_policy_ref(store.read_bytes(path), checkpoint_rel, store.uri(path))


def parse_policy_ref(data: bytes, checkpoint_rel: str, where: str) -> PolicyRef:
    """Parse a :data:`~mugrpo.storage.layout.POLICY_REF_FILE` of the checkpoint ``checkpoint_rel`` (``where`` names it
    in errors).

    Raises:
        ValueError: not the expected JSON object.
    """
    try:
        doc = json.loads(data)
        policy, files = doc["policy"], doc["files"]
        if not isinstance(policy, str) or not isinstance(files, dict):
            raise TypeError("policy must be a string and files an object")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{where}: not a policy reference ({e})") from e
    layout = RunLayout(checkpoint_rel.split("/", 1)[0])
    return PolicyRef(layout.abs(policy), {str(k): str(v) for k, v in files.items()})


def check_ref_matches_marker(store: Store, ref: PolicyRef, where: str) -> None:
    """The referenced policy is committed with exactly the referenced files and sha256 (cheap: no hashing; the
    marker's own check then covers the bytes).

    Raises:
        FileNotFoundError: the policy is not committed.
        mugrpo.storage.store.ChecksumError: its marker lists other files or other sha256 (names the first).
    """
    marker = committed_policy_ref(store, ref.policy_dir).files
    for name in sorted(set(marker) | set(ref.files)):
        if marker.get(name) != ref.files.get(name):
            raise ChecksumError(
                f"{store.uri(posixpath.join(ref.policy_dir, name))}: sha256 {marker.get(name)} in the policy's "
                f"marker differs from {ref.files.get(name)} that {where} references"
            )


def local_policy_dir(store: Store, rel: str) -> Path:
    """A local folder holding the committed HF policy at ``rel``: the folder itself on a local store, else a
    verified download into a cache folder keyed by the store URL and path.

    ``rel`` is a committed HF dir (``policies/stage=k``) or a committed training checkpoint
    (``checkpoints/stage=k/step=n``), whose ``model/`` subfolder is then returned: the behavior policy of a stage
    whose policy was not published (``orchestration.publish_policy_every > 1``). A checkpoint that references a
    published policy (:class:`PolicyRef`) gives that policy's folder.

    Raises:
        FileNotFoundError: the policy folder was never committed (no ``_COMPLETE`` marker).
        mugrpo.storage.store.ChecksumError: a file of it differs from its marker's sha256 (names the file).
    """
    if not store.is_complete_dir(rel):
        raise FileNotFoundError(f"policy {store.uri(rel)} is not committed (no _COMPLETE marker)")
    ref = read_policy_ref(store, rel)
    if ref is not None:
        check_ref_matches_marker(store, ref, f"checkpoint {store.uri(rel)}")
        return local_policy_dir(store, ref.policy_dir)
    local = store.local_path(rel)
    if local is not None:
        verify_committed_dir(store, rel)
    else:
        key = hashlib.sha256(store.uri(rel).encode()).hexdigest()[:16]
        local = cached(f"remote-{key}", lambda folder: store.download_dir(rel, folder))
    if not (local / "config.json").exists() and (local / "model" / "config.json").exists():
        return local / "model"  # a training checkpoint: its HF policy dir
    return local


def verify_committed_dir(store: Store, rel: str) -> None:
    """Re-hash (streamed) every file of the committed folder ``rel`` against its ``_COMPLETE`` marker.

    Raises:
        mugrpo.storage.store.ChecksumError: names the first file that differs.
        FileNotFoundError: a listed file is missing.
    """
    for name, digest in store.read_json(f"{rel}/{COMPLETE_MARKER}")["files"].items():
        store.verify_file(f"{rel}/{name}", digest)
