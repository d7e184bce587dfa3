"""Run-level bookkeeping shared by the flows and the CLI (no Prefect here): run.json, the initial policy, what the
stage schedule decides per stage (policy versions, evaluations, published policies, pre-started jobs), stage commits
and status. Object storage is the only source of truth. The job specs a stage's jobs read are
:mod:`mugrpo.orchestration.job_specs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mugrpo.commits.manifest import new_manifest, read_job_manifest, read_manifest, write_manifest
from mugrpo.commits.tables import part_numbers, read_table
from mugrpo.common.scratch import scratch
from mugrpo.common.version import code_version as code_version
from mugrpo.config import Config
from mugrpo.coordination.lease import LeaseFence
from mugrpo.orchestration.resume import (
    ConfigMismatchError as ConfigMismatchError,  # re-exported: callers catch it from here
)
from mugrpo.orchestration.resume import InputChangedError as InputChangedError
from mugrpo.orchestration.resume import ResumeCheck, check_resume, record_resume
from mugrpo.provenance.fingerprint import model_source_path
from mugrpo.schedules.stages import stage_plan
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store, sha256_bytes
from schemas import FileRecord, StageManifest, StageTimings

if TYPE_CHECKING:
    from mugrpo.commits.verify import VerifyReport

JOBS = ("generate", "train", "eval")


def open_store(cfg: Config) -> Store:
    """The run's store, its writes fenced by the run lease (:class:`mugrpo.coordination.lease.LeaseFence`)."""
    return Store(cfg.run.root, cfg.run.storage_options, cfg.run.storage_retry, guard=LeaseFence())


def init_run(cfg: Config) -> Store:
    """Create the run (run.json with its input fingerprints, policies/stage=0), or check that an existing one may
    continue with ``cfg`` and record the resume in its history (:mod:`mugrpo.orchestration.resume`).

    Raises:
        ConfigMismatchError: run.json exists with a config that differs in a semantic key.
        InputChangedError: an input (training set, eval set, initial weights, tokenizer) changed or is missing.
        ConfigError: the stored config no longer validates (names the key and the file).
    """
    return start_run(cfg).store


@dataclass(frozen=True)
class OpenRun:
    """A started run, opened once per process and handed to every orchestration helper instead of its config
    (:func:`start_run` makes it under the run lease; :func:`attach_run` attaches to a run already started).

    Attributes:
        config: the concrete config every stage uses (``auto`` precision resolved, or kept from run.json on resume).
        store: the run's store, its writes fenced by the run lease (:func:`open_store`).
        layout: the run's storage layout (``config.layout``).
        precision: the precision record (:mod:`mugrpo.config.precision`; {} when attached: recorded in run.json).
        warning: the precision's one-time warning, or None.
        check: the resume check the run started on (None when attached).
        verification: the committed files' check it started on (:class:`mugrpo.commits.verify.VerifyReport`, made
            by the preflight or by the run flow; None when ``orchestration.verify_on_resume`` is off or attached).
    """

    config: Config
    store: Store
    layout: RunLayout
    precision: dict = field(default_factory=dict)
    warning: str | None = None
    check: ResumeCheck | None = None
    verification: VerifyReport | None = None


def start_run(
    cfg: Config,
    check: ResumeCheck | None = None,
    verification: VerifyReport | None = None,
    *,
    store: Store | None = None,
) -> OpenRun:
    """:func:`init_run`, returning the open run every stage helper takes (with the concrete config every stage must
    use, :mod:`mugrpo.config.precision`). ``check``: the resume check the preflight made of the run as it still is
    (its inputs then are not hashed again); ``verification``: the committed files' check already made (kept, not
    made again); ``store``: the run's store when the caller has it open already (:func:`open_store`).

    Raises:
        See :func:`init_run`.
    """
    store = store if store is not None else open_store(cfg)
    check = check if check is not None else check_resume(store, cfg)
    record_resume(store, cfg, check)
    concrete = check.config if check.config is not None else cfg
    ensure_initial_policy(concrete, store)
    precision = check.precision
    record, warning = (precision.record, precision.warning) if precision else ({}, None)
    return OpenRun(concrete, store, concrete.layout, record, warning, check, verification)


def attach_run(cfg: Config) -> OpenRun:
    """The open run of run ``cfg`` (a concrete config, as the run flow hands its stage flows) that was already
    started (:func:`start_run`): its store opened, nothing checked or written (an entry point of its own, such as a
    stage flow, a bench or a test, that builds on a run start)."""
    return OpenRun(cfg, open_store(cfg), cfg.layout)


def create_fork(store: Store, plan) -> dict:
    """Write the fork a :func:`mugrpo.orchestration.fork.plan_fork` planned: the verbatim copies of the parent's
    metadata, then run.json with its ``lineage`` block and the parent's precision record (the fork's commit point: a
    fork killed before it leaves no run.json, and the same ``mugrpo fork`` starts over). Returns the run.json
    document.

    Raises:
        InputChangedError: an input of the parent's config is missing or changed.
    """
    from mugrpo.orchestration.fork import lineage_record, write_copies

    write_copies(store, plan)
    check = check_resume(store, plan.config, forking=True)
    precision = store.read_json(plan.parent.layout.run_json).get("precision")
    return record_resume(
        store, plan.config, check, extra={"lineage": lineage_record(store, plan), "precision": precision}
    )


def ensure_initial_policy(cfg: Config, store: Store) -> None:
    """Convert the configured model once into an HF dir at policies/stage=0 (skipped when already committed)."""
    from mugrpo.policy.models import convert_to_hf_dir

    rel = cfg.layout.policy_dir(0)
    if store.is_complete_dir(rel) or cfg.run.parent is not None:  # a fork's is its parent's: never written here
        return
    source = model_source_path(cfg.model.source)  # the file or folder it names (the lab policy: from its cache)
    with scratch("policy0") as tmp:
        convert_to_hf_dir(source, tmp)
        store.upload_dir(tmp, rel, meta={"source": str(source), "policy_version": 0})


def load_run_config(root: str, run_id: str, storage_options: dict | None = None) -> Config:
    """The config a run runs with (from its run.json), rooted where the run was found: ``run.root`` is ``root``
    (an operational key: a run folder moved or read from another working directory is continued in place)."""
    from mugrpo.config import config_from_dict

    store = Store(root, storage_options)
    rel = RunLayout(run_id).run_json
    if not store.exists(rel):
        raise FileNotFoundError(f"no run {run_id!r} under {store.uri()} (missing {store.uri(rel)})")
    data = store.read_json(rel)["config"]
    data["run"]["root"] = root
    data["run"]["storage_options"] = {**data["run"].get("storage_options", {}), **(storage_options or {})}
    return config_from_dict(data, source=store.uri(rel))


def policy_version(cfg: Config, stage: int) -> int:
    """Optimizer updates done before stage ``stage``'s behavior policy (``run.stage_schedule``)."""
    return stage_plan(cfg, stage).policy_version


def evaluates_stage(cfg: Config, stage: int) -> bool:
    """Whether the behavior policy of stage ``stage`` is evaluated within the stage (``eval.every_stage``,
    ``eval.every_n_stages``); the final policy is always evaluated when benchmarks are configured."""
    return bool(cfg.eval.benchmarks) and cfg.eval.every_stage and stage % cfg.eval.every_n_stages == 0


def publishes_policy(cfg: Config, stage: int) -> bool:
    """Whether ``policies/stage={stage}`` is published (``orchestration.publish_policy_every``): stage 0 (the
    initial policy), every N-th stage, and the final policy (stage K)."""
    return stage % cfg.orchestration.publish_policy_every == 0 or stage == cfg.run.num_stages


def behavior_policy_dir(store: Store, cfg: Config, stage: int) -> str:
    """Store path of the behavior policy of stage ``stage``
    (:func:`mugrpo.commits.manifest.behavior_policy_dir`, in the run's layout: a fork's early policies are its
    parent's).

    Raises:
        FileNotFoundError: no policy is committed for it (the previous stage has not committed its training).
    """
    from mugrpo.commits.manifest import behavior_policy_dir as resolve

    return resolve(store, cfg.layout, stage)


def overlaps_next_generation(cfg: Config, stage: int) -> bool:
    """Whether stage ``stage + 1``'s generation may start while stage ``stage``'s train job writes its checkpoint:
    cold execution with ``orchestration.overlap_checkpoint``, a next stage, and its behavior policy published (an
    unpublished one is the final checkpoint itself, ``orchestration.publish_policy_every``)."""
    orch = cfg.orchestration
    return (
        orch.execution == "cold"
        and orch.overlap_checkpoint
        and 0 <= stage
        and stage + 1 < cfg.run.num_stages
        and publishes_policy(cfg, stage + 1)
    )


def prestarts(cfg: Config, stage: int) -> bool:
    """Whether the jobs of ``stage`` may be launched before their inputs exist (``orchestration.prestart_jobs``):
    cold execution, and a behavior policy that is published, so their specs can name it before it is committed."""
    orch = cfg.orchestration
    return (
        orch.execution == "cold"
        and orch.prestart_jobs
        and 0 <= stage < cfg.run.num_stages
        and publishes_policy(cfg, stage)
    )


def commit_stage(run: OpenRun, stage: int, timings: StageTimings) -> StageManifest:
    """Write the stage manifest (the commit point) of open run ``run`` from the stage's job manifests.

    Raises:
        RuntimeError: a job of the stage has not committed.
    """
    cfg, store = run.config, run.store
    files, counts, metrics, versions = [], {}, {}, {}
    jobs = ["generate", "train"] + (["eval"] if evaluates_stage(cfg, stage) else [])
    for job in jobs:
        m = read_job_manifest(store, cfg.run.id, stage, job)
        if m is None:
            raise RuntimeError(f"stage {stage}: the {job} job has not committed; cannot write the stage manifest")
        owner = RunLayout(m.run_id)  # a fork's job inherited from its parent: its files, referenced
        files.extend(f.model_copy(update={"path": cfg.layout.rel(owner.abs(f.path))}) for f in m.files)
        counts.update({f"{job}/{k}": v for k, v in m.counts.items()})
        metrics.update({f"{job}/{k}": v for k, v in m.metrics.items()})
        if m.code_version:
            versions[job] = m.code_version
    plan = cfg.layout.prompt_plan(stage)
    if store.exists(plan):  # the stage's prompt plan (mugrpo.provenance.prompt_plan), covered by `mugrpo verify`
        data = store.read_bytes(plan)
        files.append(FileRecord(path=cfg.layout.rel(plan), sha256=sha256_bytes(data), bytes=len(data)))
    manifest = new_manifest(
        cfg.run.id, stage, files, counts=counts, metrics=metrics, timings=timings, job_code_versions=versions
    )
    write_manifest(store, manifest)
    if cfg.orchestration.publish_policy_every > 1:
        prune_stage_checkpoints(store, cfg, stage)
    else:  # (above, older stages' checkpoints go whole, their moments with them)
        retain_optimizer_state(store, cfg, stage)
    return manifest


def retain_optimizer_state(store: Store, cfg: Config, stage: int) -> list[str]:
    """Once stage ``stage`` has committed, delete the optimizer state (the AdamW moments) of the checkpoints of the
    stages ``train.keep_optimizer_state`` no longer keeps, keeping their weights and every other file, each
    checkpoint committed with its marker rewritten first (:func:`mugrpo.commits.retention.prune_optimizer_state`).
    Returns the checkpoint folders pruned now.

    The latest N committed stages keep theirs (N >= 1: stage ``stage``'s final checkpoint, which the next stage
    starts from, is never pruned); ``auto`` decides by the bytes of that checkpoint's optimizer state. A fork prunes
    its own stages only: the checkpoints below its fork stage are its parent's (and may serve other forks).

    Cost: stages are visited from the newest one beyond the retention down to the first one already pruned, whose
    pruning is finished if a kill interrupted it (prunes run oldest first, so every stage below it is pruned): one
    or two stages per commit, not all of them; a smaller retention set on resume walks down once.
    """
    from mugrpo.commits.manifest import checkpoint_steps, latest_checkpoint
    from mugrpo.commits.retention import OPTIMIZER_FILE, describe, kept_stages, optimizer_pruned
    from mugrpo.commits.retention import prune_optimizer_state as prune

    setting, layout = cfg.train.keep_optimizer_state, cfg.layout
    if setting == "all":
        return []
    measured = None
    if setting == "auto":
        step = latest_checkpoint(store, layout, stage)
        path = f"{layout.checkpoint_dir(stage, step)}/{OPTIMIZER_FILE}" if step is not None else None
        if path is None or not store.exists(path):
            return []  # nothing to measure (a stage without updates): keep all
        measured = store.size(path)
    keep = kept_stages(setting, measured)
    if keep is None:
        return []
    first = cfg.run.parent.stage if cfg.run.parent is not None else 0
    visit: list[tuple[int, list[int]]] = []
    for k in range(stage - keep, first - 1, -1):
        steps = checkpoint_steps(store, layout, k)
        if not steps:
            continue  # no checkpoint (a stage without updates, or deleted whole)
        visit.append((k, steps))
        if all(optimizer_pruned(store, layout.checkpoint_dir(k, s)) is not None for s in steps):
            break
    reason = describe(setting, measured)
    pruned = []
    for k, steps in reversed(visit):  # oldest first
        for s in steps:
            rel = layout.checkpoint_dir(k, s)
            if prune(store, rel, reason):
                pruned.append(rel)
    return pruned


def prune_stage_checkpoints(store: Store, cfg: Config, stage: int) -> list[str]:
    """Once stage ``stage`` has committed, delete the checkpoints of earlier stages except the one that holds the
    behavior policy of stage ``stage + 1`` (checkpoints carry the resume; published policies stay). Returns the
    deleted folders. Markers go first, so an interrupted deletion leaves folders that nothing reads. A fork prunes
    its own stages only: the checkpoints below its fork stage are its parent's (and may serve other forks)."""
    from mugrpo.commits.manifest import checkpoint_steps
    from mugrpo.storage.store import COMPLETE_MARKER

    layout = cfg.layout
    keep = behavior_policy_dir(store, cfg, stage + 1) if stage + 1 <= cfg.run.num_stages else None
    doomed = [
        layout.checkpoint_dir(k, step)
        for k in range(cfg.run.parent.stage if cfg.run.parent else 0, stage)
        for step in checkpoint_steps(store, layout, k)
        if layout.checkpoint_dir(k, step) != keep
    ]
    for rel in doomed:
        store.delete(f"{rel}/{COMPLETE_MARKER}")
        store.delete(rel, recursive=True)
    return doomed


@dataclass
class StageStatus:
    stage: int
    committed: bool
    jobs: dict[str, bool] = field(default_factory=dict)
    shards_written: int = 0
    checkpoints: int = 0
    manifest: StageManifest | None = None


@dataclass
class RunStatus:
    run_id: str
    uri: str
    num_stages: int
    stages: list[StageStatus]
    final_eval: bool
    #: The train_steps row of the run's latest written update (its health panel for ``mugrpo status``), or None.
    latest_update: dict | None = None

    @property
    def complete(self) -> bool:
        return all(s.committed for s in self.stages) and self.final_eval


def run_status(store: Store, cfg: Config) -> RunStatus:
    """What is committed of a run: per stage its manifest, jobs, shards and checkpoints."""
    layout = cfg.layout
    stages = []
    for k in range(cfg.run.num_stages):
        st = StageStatus(stage=k, committed=False)
        st.manifest = read_manifest(store, cfg.run.id, k)
        st.committed = st.manifest is not None
        st.jobs = {job: read_job_manifest(store, cfg.run.id, k, job) is not None for job in JOBS}
        st.shards_written = sum(1 for n in store.listdir(layout.rollouts_dir(k)) if n.endswith(".parquet"))
        st.checkpoints = sum(
            1
            for n in store.listdir(layout.checkpoints_dir(k))
            if store.is_complete_dir(f"{layout.checkpoints_dir(k)}/{n}")
        )
        stages.append(st)
    final = (not cfg.eval.benchmarks) or read_job_manifest(store, cfg.run.id, cfg.run.num_stages, "eval") is not None
    latest = latest_train_step(store, layout, cfg.run.num_stages)
    return RunStatus(cfg.run.id, store.uri(layout.run_dir), cfg.run.num_stages, stages, final, latest)


def latest_train_step(store: Store, layout: RunLayout, num_stages: int) -> dict | None:
    """The train_steps row of the latest update written (highest stage with parts, its last part's last row),
    as :func:`mugrpo.commits.tables.read_table` reads it (health columns NULL in files before train_steps v4), or
    None."""
    for stage in reversed(range(num_stages)):
        parts = part_numbers(store, layout, "train_steps", stage)
        if parts:
            rows = read_table(store, layout.train_steps_part(stage, parts[-1]), "train_steps").to_pylist()
            if rows:
                return max(rows, key=lambda r: r["update"])
    return None


#: The health panel columns ``mugrpo status`` shows, with their labels and formats (docs/sql.md, "Health panel").
HEALTH_LINE = (
    ("ess", "ESS", ".3f"),
    ("kl_sampler", "KL(q||pi)", ".2e"),
    ("sampler_ratio_max", "ratio max", ".3f"),
    ("sampler_clip_frac", "clip frac", ".3f"),
    ("logit_var", "logit var", ".3g"),
    ("s_eta", "S*eta", ".2e"),
)


def health_line(row: dict) -> str:
    """One line of the health panel of a train_steps row: ``health @ update U (stage k): ESS 0.998 ...``; a NULL
    value (a loss without a clip range, a file before train_steps v4) shows as ``-``."""
    shown = "  ".join(
        f"{label} {'-' if row.get(name) is None else format(row[name], fmt)}" for name, label, fmt in HEALTH_LINE
    )
    return f"health @ update {row['update']} (stage {row['stage']}): {shown}"
