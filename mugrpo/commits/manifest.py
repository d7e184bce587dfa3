"""Commit points of a run: stage manifests (written last, the commit point of a stage; reading through one verifies
every file), job manifests (the commit point of a job), and which checkpoints of a stage are committed (a
checkpoint folder is committed once its ``_COMPLETE`` marker is written)."""

from __future__ import annotations

from datetime import UTC, datetime

from mugrpo.common.version import code_version
from mugrpo.storage.layout import RunLayout, parse_checkpoint_step
from mugrpo.storage.store import ChecksumError, Store
from schemas import FileRecord, JobManifest, StageManifest


def _stamped(manifest):
    """``manifest`` with this process's code version when it carries none (an audit tells which code wrote it)."""
    return manifest if manifest.code_version else manifest.model_copy(update={"code_version": code_version()})


def write_manifest(store: Store, manifest: StageManifest) -> str:
    """Write the manifest of ``manifest.stage`` atomically, stamped with the code version. Call it after every
    file of the stage is written.

    Raises:
        mugrpo.coordination.lease.LeaseFenced: (a fenced store, :class:`mugrpo.coordination.lease.LeaseFence`) this
            writer does not hold the run lease (a late job of a superseded owner).
    """
    manifest = _stamped(manifest)
    rel = RunLayout(manifest.run_id).stage_manifest(manifest.stage)
    return store.write_bytes(rel, manifest.model_dump_json(indent=2).encode())


def read_manifest(store: Store, run_id: str, stage: int) -> StageManifest | None:
    """The manifest of a stage, or None if the stage is not committed."""
    rel = RunLayout(run_id).stage_manifest(stage)
    if not store.exists(rel):
        return None
    return StageManifest.model_validate_json(store.read_bytes(rel))


def write_job_manifest(store: Store, manifest: JobManifest) -> str:
    """Write a job's manifest atomically, stamped with the code version; call it after every file of the job is
    written (its commit point).

    Raises:
        mugrpo.coordination.lease.LeaseFenced: (a fenced store, :class:`mugrpo.coordination.lease.LeaseFence`) this
            writer does not hold the run lease.
    """
    manifest = _stamped(manifest)
    rel = RunLayout(manifest.run_id).job_manifest(manifest.stage, manifest.job)
    return store.write_bytes(rel, manifest.model_dump_json(indent=2).encode())


def read_job_manifest(store: Store, run_id: str, stage: int, job: str) -> JobManifest | None:
    """A job's manifest, or None if that job has not committed."""
    rel = RunLayout(run_id).job_manifest(stage, job)
    if not store.exists(rel):
        return None
    return JobManifest.model_validate_json(store.read_bytes(rel))


def read_preemption_record(store: Store, layout: RunLayout, stage: int) -> dict | None:
    """The record a train job of ``stage`` stopped on a preemption notice left (what it saved:
    :func:`mugrpo.trainer.preemption.write_preemption_record`), or None."""
    rel = layout.preemption_record(stage)
    return store.read_json(rel) if store.exists(rel) else None


def verify_manifest(store: Store, manifest: StageManifest | JobManifest) -> None:
    """Check the sha256 of every file the manifest lists. Raises ChecksumError or FileNotFoundError naming the file."""
    layout = RunLayout(manifest.run_id)
    for rec in manifest.files:
        store.read_bytes(layout.abs(rec.path), expected_sha256=rec.sha256)


def new_manifest(run_id: str, stage: int, files: list[FileRecord], **fields) -> StageManifest:
    """A complete-status manifest stamped now (UTC)."""
    return StageManifest(run_id=run_id, stage=stage, created_at=datetime.now(UTC), files=files, **fields)


__all__ = [
    "ChecksumError",
    "behavior_policy_dir",
    "checkpoint_steps",
    "latest_checkpoint",
    "new_manifest",
    "read_job_manifest",
    "read_manifest",
    "verify_manifest",
    "write_job_manifest",
    "write_manifest",
]


def checkpoint_steps(store: Store, layout: RunLayout, stage: int, *, complete: bool = True) -> list[int]:
    """Sorted stage updates of the checkpoints of ``stage`` that are committed (or, with complete=False, not)."""
    folder = layout.checkpoints_dir(stage)
    steps = []
    for name in store.listdir(folder):
        step = parse_checkpoint_step(name)
        if step is not None and store.is_complete_dir(layout.checkpoint_dir(stage, step)) == complete:
            steps.append(step)
    return sorted(steps)


def latest_checkpoint(store: Store, layout: RunLayout, stage: int) -> int | None:
    """The stage update of the latest committed checkpoint of ``stage``, or None."""
    steps = checkpoint_steps(store, layout, stage)
    return steps[-1] if steps else None


def behavior_policy_dir(store: Store, layout: RunLayout, stage: int) -> str:
    """Store path of the behavior policy of stage ``stage`` (a folder :func:`mugrpo.commits.policies.local_policy_dir`
    reads): ``policies/stage={stage}`` when published, else the final checkpoint of the stage before (a
    ``checkpoints/stage=j/step=n`` folder holding the policy in ``model/``), going back over stages that made no
    update (their policy is their behavior policy). A fork's layout resolves the early stages in its parent.

    Raises:
        FileNotFoundError: neither exists (the previous stage has not committed its training).
    """
    for k in range(stage, -1, -1):
        if store.is_complete_dir(layout.policy_dir(k)):
            return layout.policy_dir(k)
        if k == 0:
            break
        train = read_job_manifest(store, layout.run_id, k - 1, "train")
        if train is None:
            break  # stage k-1 has not finished training: its checkpoints are not final
        step = latest_checkpoint(store, layout, k - 1)
        if step is not None and step == train.counts.get("updates"):
            return layout.checkpoint_dir(k - 1, step)
        if train.counts.get("updates", 0) != 0:
            break  # its final checkpoint is gone: no policy to fall back to
    raise FileNotFoundError(
        f"no behavior policy for stage {stage} under {store.uri(layout.run_dir)}: neither "
        f"{layout.policy_dir(stage)} nor a final checkpoint of stage {stage - 1} is committed"
    )
