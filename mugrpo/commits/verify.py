"""Re-hash a run's committed files against their manifests (``mugrpo verify``; resume checks it first).

What is checked, per stage k (and "final", the evaluation of the final policy at stage K):

- the stage manifest ``stages/stage=k.json`` and the job manifests ``jobs/stage=k/{job}.manifest.json``: each must
  parse, and each file they list must exist with the recorded sha256;
- every committed folder of the stage (``policies/stage=k``, ``checkpoints/stage=k/step=n``): each file its
  ``_COMPLETE`` marker lists must exist with the marker's sha256;
- the published policy files a checkpoint references instead of holding its own weights (``policy.ref.json``,
  :class:`mugrpo.commits.policies.PolicyRef`): each must exist with the reference's sha256. A corrupted shared weight
  file is thus reported from both sides: under the policy's stage and under the checkpoint's.

Files are streamed and hashed on the fly (:meth:`mugrpo.storage.store.Store.hash_file`). A manifest that no longer
parses counts as corrupted. Limitation: a manifest is not hashed by anything above it, so a change that keeps it valid
(e.g. in a metric) is not detected; a change in a recorded sha256 is (the file then "differs").
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from pydantic import ValidationError

from mugrpo.commits.policies import read_policy_ref
from mugrpo.storage.layout import POLICY_REF_FILE, RunLayout, parse_checkpoint_step
from mugrpo.storage.store import COMPLETE_MARKER, StorageError, Store
from schemas import JobManifest, StageManifest

JOBS = ("generate", "train", "eval", "segment")


class CorruptedRunError(RuntimeError):
    """A committed file of the run is corrupted or missing; the message names each file and how to recover."""


@dataclass
class StageCheck:
    """Outcome of one stage: run-relative paths that are intact, corrupted (with the reason) or missing."""

    stage: int
    label: str
    committed: bool = False
    holds: list[str] = field(default_factory=list)  # the final row: what of the run's end is committed
    intact: list[str] = field(default_factory=list)
    corrupted: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    bytes: int = 0

    @property
    def files(self) -> int:
        return len(self.intact) + len(self.corrupted) + len(self.missing)

    @property
    def ok(self) -> bool:
        return not self.corrupted and not self.missing


@dataclass
class VerifyReport:
    """Per-stage outcome of :func:`verify_run`."""

    uri: str
    stages: list[StageCheck]

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.stages)

    @property
    def total_files(self) -> int:
        return sum(s.files for s in self.stages)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.stages)

    def problems(self) -> list[str]:
        """One line per corrupted or missing file, then how to recover; [] when intact."""
        lines = []
        for s in self.stages:
            lines += [f"stage {s.label}: corrupted {self.uri}/{p}: {why}" for p, why in s.corrupted.items()]
            lines += [f"stage {s.label}: missing {self.uri}/{p}" for p in s.missing]
        if lines:
            first = next(s for s in self.stages if not s.ok)
            lines.append(recovery_hint(self.uri, first))
        return lines


def recovery_hint(uri: str, first: StageCheck) -> str:
    """How to recover from the first bad stage."""
    return (
        f"recover: restore the file(s) from a copy (the manifests hold their sha256; `mugrpo verify {uri}` checks "
        f"the result), or roll the run back to before stage {first.label}: delete {uri}/stages/stage={first.stage}"
        f".json, {uri}/jobs/stage={first.stage}/*.manifest.json and the same for every later stage, then "
        "`mugrpo resume`, which redoes those stages (same seed and config: the same rollouts on CPU). mugrpo never "
        "regenerates committed data by itself."
    )


def _check_file(
    store: Store, layout: RunLayout, run_rel: str, sha256: str, out: StageCheck, via: str | None = None
) -> None:
    if run_rel in out.intact or run_rel in out.corrupted or run_rel in out.missing:
        return
    rel = layout.abs(run_rel)
    try:
        actual, size = store.hash_file(rel)
    except FileNotFoundError:
        out.missing.append(run_rel if via is None else f"{run_rel} (referenced by {via})")
        return
    out.bytes += size
    if actual == sha256:
        out.intact.append(run_rel)
    else:
        source = "the manifest's" if via is None else f"the one {via} references:"
        out.corrupted[run_rel] = f"sha256 {actual} differs from {source} {sha256}"


def _check_manifest(store: Store, layout: RunLayout, rel: str, cls: type, out: StageCheck) -> None:
    if not store.exists(rel):
        return
    out.committed = out.committed or cls is StageManifest
    try:
        manifest = cls.model_validate_json(store.read_bytes(rel))
    except (ValidationError, ValueError) as e:
        out.corrupted[layout.rel(rel)] = f"manifest does not parse ({str(e).splitlines()[0]})"
        return
    owner = RunLayout(manifest.run_id)  # a fork's inherited stage: the parent's manifest, paths in its run
    for rec in manifest.files:
        _check_file(store, layout, layout.rel(owner.abs(rec.path)), rec.sha256, out)


def _check_folder(store: Store, layout: RunLayout, rel: str, out: StageCheck) -> None:
    marker_rel = posixpath.join(rel, COMPLETE_MARKER)
    if not store.exists(marker_rel):
        return  # never committed: nothing to verify
    try:
        files = store.read_json(marker_rel)["files"]
    except (StorageError, KeyError, TypeError) as e:
        out.corrupted[layout.rel(marker_rel)] = f"commit marker does not parse ({e})"
        return
    for name, digest in files.items():
        _check_file(store, layout, layout.rel(posixpath.join(rel, name)), digest, out)
    if POLICY_REF_FILE in files and layout.rel(posixpath.join(rel, POLICY_REF_FILE)) in out.intact:
        try:
            ref = read_policy_ref(store, rel)
        except ValueError as e:
            out.corrupted[layout.rel(posixpath.join(rel, POLICY_REF_FILE))] = str(e)
            return
        via = layout.rel(rel)
        for name, digest in ref.files.items():
            _check_file(store, layout, layout.rel(posixpath.join(ref.policy_dir, name)), digest, out, via=via)


def verify_stage(
    store: Store, run_id: str, stage: int, label: str | None = None, layout: RunLayout | None = None
) -> StageCheck:
    """Check stage ``stage`` of ``run_id`` (see the module docstring); ``layout``: the run's, when it is a fork (its
    parent's folders below the fork stage are checked as the fork's, shown as ``../PARENT/...``)."""
    layout = layout or RunLayout(run_id)
    out = StageCheck(stage=stage, label=label or str(stage))
    _check_manifest(store, layout, layout.stage_manifest(stage), StageManifest, out)
    for job in JOBS:
        _check_manifest(store, layout, layout.job_manifest(stage, job), JobManifest, out)
    _check_folder(store, layout, layout.policy_dir(stage), out)
    for name in store.listdir(layout.checkpoints_dir(stage)):
        step = parse_checkpoint_step(name)
        if step is not None:
            _check_folder(store, layout, layout.checkpoint_dir(stage, step), out)
    return out


def verify_run(store: Store, run_id: str, num_stages: int, layout: RunLayout | None = None) -> VerifyReport:
    """Check stages 0..K-1 and the final evaluation/policy (stage K) of ``run_id`` (``layout``: as in
    :func:`verify_stage`)."""
    layout = layout or RunLayout(run_id)
    stages = [verify_stage(store, run_id, k, layout=layout) for k in range(num_stages)]
    final = verify_stage(store, run_id, num_stages, "final", layout)  # stage K has no stage manifest, only these:
    if store.is_complete_dir(layout.policy_dir(num_stages)):
        final.holds.append("final policy")
    if store.exists(layout.job_manifest(num_stages, "eval")):
        final.holds.append("final eval")
    final.committed = bool(final.holds)
    stages.append(final)
    return VerifyReport(store.uri(RunLayout(run_id).run_dir), stages)


def refuse_corrupted(store: Store, run_id: str, num_stages: int, layout: RunLayout | None = None) -> VerifyReport:
    """:func:`verify_run`, raising when anything committed is corrupted or missing (resume calls it first).

    Raises:
        CorruptedRunError: names every bad file and how to recover.
    """
    report = verify_run(store, run_id, num_stages, layout)
    if not report.ok:
        raise CorruptedRunError(
            f"run {run_id!r} has corrupted committed files; refusing to build on them:\n" + "\n".join(report.problems())
        )
    return report
