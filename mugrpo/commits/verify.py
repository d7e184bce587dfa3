"""Re-hash a run's committed files against their manifests (``mugrpo verify``; resume checks it first).

What is checked, per stage k (and "final", the evaluation of the final policy at stage K):

- the stage manifest ``stages/stage=k.json`` and the job manifests ``jobs/stage=k/{job}.manifest.json``: each must
  parse, and each file they list must exist with the recorded sha256;
- every committed folder of the stage (``policies/stage=k``, ``checkpoints/stage=k/step=n``): each file its
  ``_COMPLETE`` marker lists must exist with the marker's sha256;
- the published policy files a checkpoint references instead of holding its own weights (``policy.ref.json``,
  :class:`mugrpo.commits.policies.PolicyRef`): each must exist with the reference's sha256. A corrupted shared weight
  file is thus reported from both sides: under the policy's stage and under the checkpoint's. One check reads it
  once: the stages of a :func:`verify_run` share what they read, and judge it against each one's sha256.

Files are streamed and hashed on the fly (:meth:`mugrpo.storage.store.Store.hash_file`). A manifest that no longer
parses counts as corrupted. Limitation: a manifest is not hashed by anything above it, so a change that keeps it valid
(e.g. in a metric) is not detected; a change in a recorded sha256 is (the file then "differs").

Two modes (``mugrpo verify`` / ``mugrpo verify --quick``; a start uses ``orchestration.verify_on_resume``):

- **full**: every file is re-hashed.
- **quick** (what a start does): the files the next work reads are re-hashed: every file of the first stage not
  committed (its policy, its committed shards and mid-stage checkpoints; the final policy and evaluation once every
  stage is), and the checkpoints of the stage before it (the optimizer state training resumes from). Every other
  file is checked by what the store says without reading it (:mod:`mugrpo.storage.digests`): its size against the
  manifest's, then the sha256 the store vouches for (S3's full-object SHA-256; the local hash cache) or, for an S3
  multipart object, the ETag its ``_COMPLETE`` marker recorded at commit. A file the store cannot vouch for (a
  local cache miss, an object written before checksums were kept) is hashed. Manifests and markers are read whole.
  A start's cost thus follows what it builds on, not the run's length; what only re-reading shows (a bit flipped in
  place on a local disk) is left to the full check.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from pydantic import ValidationError

from mugrpo.commits.policies import read_policy_ref
from mugrpo.storage.layout import POLICY_REF_FILE, RunLayout, parse_checkpoint_step
from mugrpo.storage.store import COMPLETE_MARKER, MARKER_ETAGS, StorageError, Store
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
    bytes: int = 0  # bytes of the files checked, hashed or not (a file an earlier stage of the check read: there)
    hashed_bytes: int = 0  # bytes read and hashed
    trusted: int = 0  # files the store vouched for without a read (quick mode)

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
    quick: bool = False
    #: The first stage not committed when the check ran (``K`` for a finished run): the stage a start builds on.
    open_stage: int = 0

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.stages)

    @property
    def total_files(self) -> int:
        """Files checked, each once (a file two stages reach is listed under both)."""
        return len({p for s in self.stages for p in (*s.intact, *s.corrupted, *s.missing)})

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.stages)

    @property
    def hashed_bytes(self) -> int:
        return sum(s.hashed_bytes for s in self.stages)

    @property
    def trusted_files(self) -> int:
        return sum(s.trusted for s in self.stages)

    def summary(self) -> str:
        """One line: files checked, bytes hashed, files the store vouched for."""
        mib = 2**20
        line = f"{self.total_files} committed files ({self.total_bytes / mib:.1f} MiB)"
        if not self.quick:
            return f"re-hashed {line}"
        return (
            f"checked {line}: re-hashed {self.hashed_bytes / mib:.1f} MiB the next work reads, {self.trusted_files} "
            "files by the store's checksum"
        )

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


@dataclass
class _Mode:
    """How a stage's files are checked: ``quick`` (by the store's word) except in ``hashed_folders`` (run-relative
    folders the next work reads, always re-hashed)."""

    quick: bool = False
    hashed_folders: tuple[str, ...] = ()
    markers: dict[str, dict[str, str]] = field(default_factory=dict)
    #: run-relative path -> (sha256, bytes) of each file read so far, None if it was missing: shared by the stages of
    #: one :func:`verify_run`, so a file two stages reach (a policy: its own stage's, and the checkpoint before it
    #: references it) is read once and judged against each reference's sha256.
    reads: dict[str, tuple[str, int] | None] = field(default_factory=dict)

    def hashes(self, run_rel: str) -> bool:
        return not self.quick or any(run_rel.startswith(f"{d}/") for d in self.hashed_folders)

    def recorded_etag(self, store: Store, rel: str) -> str | None:
        """The ETag the ``_COMPLETE`` marker of the committed folder holding ``rel`` recorded for it at commit (S3
        multipart files, :meth:`mugrpo.storage.store.Store.upload_dir`), or None."""
        folder = posixpath.dirname(rel)
        while folder:
            if folder not in self.markers:
                self.markers[folder] = _marker_etags(store, folder)
            name = posixpath.relpath(rel, folder)
            if name in self.markers[folder]:
                return self.markers[folder][name]
            folder = posixpath.dirname(folder)
        return None


def _check_file(
    store: Store,
    layout: RunLayout,
    run_rel: str,
    sha256: str,
    out: StageCheck,
    via: str | None = None,
    *,
    mode: _Mode | None = None,
    size: int | None = None,
) -> None:
    if run_rel in out.intact or run_rel in out.corrupted or run_rel in out.missing:
        return
    rel = layout.abs(run_rel)
    if mode is not None and not mode.hashes(run_rel):
        try:
            verdict = _quick_verdict(store, rel, sha256, size, mode, out)
        except FileNotFoundError:
            out.missing.append(run_rel if via is None else f"{run_rel} (referenced by {via})")
            return
        if verdict is not None:
            if verdict == "":
                out.intact.append(run_rel)
                out.trusted += 1
            else:
                out.corrupted[run_rel] = verdict
            return
    reads = mode.reads if mode is not None else {}
    first_read = run_rel not in reads
    if first_read:
        try:
            reads[run_rel] = store.hash_file(rel)
        except FileNotFoundError:
            reads[run_rel] = None
    if reads[run_rel] is None:
        out.missing.append(run_rel if via is None else f"{run_rel} (referenced by {via})")
        return
    actual, size = reads[run_rel]
    if first_read:  # bytes read: counted where the file was read
        out.bytes += size
        out.hashed_bytes += size
    if actual == sha256:
        out.intact.append(run_rel)
    else:
        source = "the manifest's" if via is None else f"the one {via} references:"
        out.corrupted[run_rel] = f"sha256 {actual} differs from {source} {sha256}"


def _quick_verdict(store: Store, rel: str, sha256: str, size: int | None, mode: _Mode, out: StageCheck) -> str | None:
    """The quick verdict on one file from one HEAD / stat: the empty string when the store vouches for it, the reason
    when it shows the file differs, None when it cannot tell (then the file is hashed)."""
    st = store.stat_object(rel)
    if size is not None and st.size != size:
        out.bytes += st.size
        return f"size {st.size} bytes differs from the manifest's {size} (found without reading it)"
    if st.sha256 is not None:
        out.bytes += st.size
        if st.sha256 == sha256:
            return ""
        where = "the local hash cache's" if store.is_local else "the store's SHA-256 checksum"
        return f"sha256 {st.sha256} ({where}) differs from the manifest's {sha256}"
    if st.multipart and st.version == mode.recorded_etag(store, rel):
        out.bytes += st.size
        return ""
    return None  # a cache miss, an object without a checksum, or an ETag that changed: only the bytes can tell


def _check_manifest(store: Store, layout: RunLayout, rel: str, cls: type, out: StageCheck, mode: _Mode) -> None:
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
        _check_file(store, layout, layout.rel(owner.abs(rec.path)), rec.sha256, out, mode=mode, size=rec.bytes)


def _check_folder(store: Store, layout: RunLayout, rel: str, out: StageCheck, mode: _Mode) -> None:
    marker_rel = posixpath.join(rel, COMPLETE_MARKER)
    if not store.exists(marker_rel):
        return  # never committed: nothing to verify
    try:
        files = store.read_json(marker_rel)["files"]
    except (StorageError, KeyError, TypeError) as e:
        out.corrupted[layout.rel(marker_rel)] = f"commit marker does not parse ({e})"
        return
    for name, digest in files.items():
        _check_file(store, layout, layout.rel(posixpath.join(rel, name)), digest, out, mode=mode)
    if POLICY_REF_FILE in files and layout.rel(posixpath.join(rel, POLICY_REF_FILE)) in out.intact:
        try:
            ref = read_policy_ref(store, rel)
        except ValueError as e:
            out.corrupted[layout.rel(posixpath.join(rel, POLICY_REF_FILE))] = str(e)
            return
        via = layout.rel(rel)
        for name, digest in ref.files.items():
            run_rel = layout.rel(posixpath.join(ref.policy_dir, name))
            _check_file(store, layout, run_rel, digest, out, via=via, mode=mode)


def _marker_etags(store: Store, rel: str) -> dict[str, str]:
    """The ETags a committed folder's marker recorded (S3 multipart files), {} when none or unreadable."""
    try:
        return dict(store.read_json(posixpath.join(rel, COMPLETE_MARKER)).get(MARKER_ETAGS) or {})
    except (StorageError, FileNotFoundError, AttributeError, TypeError, ValueError):
        return {}


def verify_stage(
    store: Store,
    run_id: str,
    stage: int,
    label: str | None = None,
    layout: RunLayout | None = None,
    *,
    quick: bool = False,
    hash_checkpoints: bool = False,
    reads: dict[str, tuple[str, int] | None] | None = None,
) -> StageCheck:
    """Check stage ``stage`` of ``run_id`` (see the module docstring); ``layout``: the run's, when it is a fork (its
    parent's folders below the fork stage are checked as the fork's, shown as ``../PARENT/...``). ``quick``: check
    files by the store's word (module docstring), except the checkpoints with ``hash_checkpoints``. ``reads``: the
    files earlier stages of the same check read (``_Mode.reads``), updated; None: this stage alone."""
    layout = layout or RunLayout(run_id)
    folders = (layout.rel(layout.checkpoints_dir(stage)),) if hash_checkpoints else ()
    mode = _Mode(quick, folders, reads=reads if reads is not None else {})
    out = StageCheck(stage=stage, label=label or str(stage))
    _check_manifest(store, layout, layout.stage_manifest(stage), StageManifest, out, mode)
    for job in JOBS:
        _check_manifest(store, layout, layout.job_manifest(stage, job), JobManifest, out, mode)
    _check_folder(store, layout, layout.policy_dir(stage), out, mode)
    for name in store.listdir(layout.checkpoints_dir(stage)):
        step = parse_checkpoint_step(name)
        if step is not None:
            _check_folder(store, layout, layout.checkpoint_dir(stage, step), out, mode)
    return out


def open_stage(store: Store, layout: RunLayout, num_stages: int) -> int:
    """The first stage without a stage manifest (``num_stages`` when every stage is committed)."""
    return next((k for k in range(num_stages) if not store.exists(layout.stage_manifest(k))), num_stages)


def verify_run(
    store: Store, run_id: str, num_stages: int, layout: RunLayout | None = None, *, quick: bool = False
) -> VerifyReport:
    """Check stages 0..K-1 and the final evaluation/policy (stage K) of ``run_id`` (``layout``: as in
    :func:`verify_stage`). ``quick``: re-hash only what the next work reads (the first stage not committed, the
    checkpoints of the stage before it; the final stage once all are committed) and check the rest by the store's
    word (module docstring)."""
    layout = layout or RunLayout(run_id)
    first = open_stage(store, layout, num_stages)
    reads: dict[str, tuple[str, int] | None] = {}  # each file is read once, whichever stages reach it

    def check(k: int, label: str | None = None) -> StageCheck:
        if not quick or k == first:
            return verify_stage(store, run_id, k, label, layout, reads=reads)
        return verify_stage(
            store, run_id, k, label, layout, quick=True, hash_checkpoints=k == first - 1 and first < num_stages,
            reads=reads,
        )  # fmt: skip

    stages = [check(k) for k in range(num_stages)]
    final = check(num_stages, "final")  # stage K has no stage manifest, only these:
    if store.is_complete_dir(layout.policy_dir(num_stages)):
        final.holds.append("final policy")
    if store.exists(layout.job_manifest(num_stages, "eval")):
        final.holds.append("final eval")
    final.committed = bool(final.holds)
    stages.append(final)
    return VerifyReport(store.uri(RunLayout(run_id).run_dir), stages, quick, first)


def refuse_corrupted(
    store: Store, run_id: str, num_stages: int, layout: RunLayout | None = None, *, quick: bool = False
) -> VerifyReport:
    """:func:`verify_run`, raising when anything committed is corrupted or missing (a start calls it first, quick).

    Raises:
        CorruptedRunError: names every bad file and how to recover.
    """
    report = verify_run(store, run_id, num_stages, layout, quick=quick)
    if not report.ok:
        raise CorruptedRunError(
            f"run {run_id!r} has corrupted committed files; refusing to build on them:\n" + "\n".join(report.problems())
        )
    return report
