"""The jobs of one cold stage, in order, with the next stage's generation overlapped with this stage's checkpoint.

    generate k  ->  train k  --(policies/stage=k+1 committed)-->  generate k+1   (beside the end of train k)
                             --(train k committed)------------->  eval k  ->  stage manifest k (the commit point)

A train job commits in this order (:mod:`mugrpo.trainer.commit`): train_steps, the published policy of stage k+1
(marker last), then the stage's final checkpoint (the AdamW moments: the larger half of what it writes) and its job
manifest. Stage k+1's generation needs only the published policy (and, for AGPO, stage k's generate manifest), so
with ``orchestration.overlap_checkpoint`` on it starts as soon as the policy's marker exists, while the train job is
still writing its checkpoint. Stage k+1's training needs stage k's final checkpoint (its AdamW moments): it is
launched by stage k+1's own schedule, after stage k's train job returned, and the trainer refuses to start a stage
whose previous stage's training has not committed (:class:`mugrpo.trainer.loop.Trainer`).

Pre-started jobs (``orchestration.prestart_jobs``): each job is launched while the job before it still runs,
and waits at its start gate (:mod:`mugrpo.coordination.start_gate`) for the commit markers the schedule itself waits for
(:func:`mugrpo.orchestration.job_specs.start_markers`):

    launch generate k   ->  pre-start train k          (waits for generate k's manifest, stage k-1's manifest)
    launch train k      ->  pre-start generate k+1     (waits for policies/stage=k+1)
    run generate k+1    ->  pre-start train k+1        (waits for generate k+1's and stage k's manifests)

Its imports, verifier pool and datasets are then ready when its turn comes, and the launcher follows the process
already running instead of starting one (locally: the same process; on Kubernetes: the Job created ahead). A job
pre-started in stage k's schedule and followed in stage k+1's keeps its seconds in stage k+1's ``t_total`` from the
moment stage k+1's schedule runs it (its start before that was beside other work). On a failure the schedule
stops the pre-started jobs it has not followed yet.

Nothing changes in what is committed: the same jobs write the same files, each job resumes from what it committed,
and a stage whose job manifest exists skips that job (stage k+1 finds its generation committed and keeps the
timings that job recorded). A kill anywhere in the overlap resumes exactly: the train job re-runs from its last
checkpoint and references the committed policy, the generate job from its last committed shard (tests/e2e/
test_flow_resume.py kills at each moment of the overlap).

Timings (:class:`schemas.StageTimings`): every wall second is in exactly one stage's ``t_total``, so the run's wall
clock is their sum. The next stage's generation, when this stage started it, runs inside this stage's schedule:
``t_next_gen`` seconds of this stage's ``t_total``, of which ``t_overlap`` ran while this stage's train job was
still writing its checkpoint (checkpoint time hidden behind generation, counted once).

The Prefect stage flow (flows/stage.py) and the benches' Prefect-free runner (bench/warm_vs_cold.py) both run a
stage with :func:`run_stage`; they differ only in their :class:`StageJobs`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from mugrpo.commits.manifest import read_job_manifest, read_manifest
from mugrpo.orchestration.job_specs import write_job_specs
from mugrpo.orchestration.runs import OpenRun, commit_stage, overlaps_next_generation, prestarts
from schemas import StageManifest, StageTimings

#: The job-reported seconds of real work, by job kind; the rest of a job's wall time is switching overhead.
WORK_TIMING = {"generate": "gen", "train": "train", "eval": "eval"}
#: Seconds between two looks at the store for the published policy while the train job runs.
POLICY_POLL_S = 0.1


class RunningJob(Protocol):
    """A job launched in the background."""

    def done(self) -> bool:
        """Whether the job has ended (either way)."""
        ...

    def result(self) -> None:
        """Wait for the job's end.

        Raises:
            Exception: the job failed (past its retries), as the launcher reports it.
        """
        ...


class StageJobs(Protocol):
    """How a stage's jobs are launched (Prefect tasks in the stage flow, plain processes in the benches)."""

    def run(self, job: str, stage: int, spec_url: str) -> float:
        """Run job ``job`` of ``stage`` to its end (all its workers, for a fan-out job); returns its wall seconds.
        A job pre-started with the same spec (:meth:`prestart`) is followed instead of launched again.

        Raises:
            Exception: the job failed past its retries.
        """
        ...

    def submit(self, job: str, stage: int, spec_url: str) -> RunningJob:
        """Launch job ``job`` of ``stage`` in the background (a one-process job: train)."""
        ...

    def prestart(self, job: str, stage: int, spec_url: str) -> None:
        """Launch job ``job`` of ``stage`` now, ahead of its inputs: it gets ready and waits at its start gate
        (:mod:`mugrpo.coordination.start_gate`) until :meth:`run` or :meth:`submit` of the same spec follows it. A
        launcher that cannot pre-start does nothing (the job then starts when it is run)."""
        ...

    def discard_prestarted(self) -> None:
        """Stop every pre-started job no :meth:`run` has followed yet (the schedule failed or was interrupted)."""
        ...


def switch_seconds(run: OpenRun, stage: int, job: str, wall: float) -> float:
    """T_switch of a job: its wall time minus the work it reports (process start, imports, engine/weights load)."""
    m = read_job_manifest(run.store, run.config.run.id, stage, job)
    work = m.timings.get(WORK_TIMING[job], 0.0) if m else 0.0
    return max(wall - work, 0.0)


def run_stage(run: OpenRun, stage: int, launcher: StageJobs, say: Callable[[str], None] = print) -> StageManifest:
    """Run (or resume) cold stage ``stage`` of open run ``run``: its generate, train and eval jobs, each skipped
    when committed, the next stage's generation overlapped with the train job's checkpoint
    (:func:`overlaps_next_generation`), each job pre-started while the one before it runs (:func:`prestart_next`),
    then the stage manifest. A committed stage is returned as it is.

    Raises:
        Exception: a job failed past its retries (from ``launcher``); what it committed stays for the resume, and
            the jobs pre-started for later are stopped.
        RuntimeError: a job returned without committing.
    """
    cfg, store = run.config, run.store
    done = read_manifest(store, cfg.run.id, stage)
    if done is not None:
        say(f"stage {stage} already committed: skipping")
        return done
    t0 = time.monotonic()
    urls = write_job_specs(run, stage)
    walls: dict[str, float] = {}
    switch, next_gen, overlap = 0.0, 0.0, 0.0
    try:
        for job in ("generate", "train", "eval"):
            if job not in urls:
                continue
            committed = read_job_manifest(store, cfg.run.id, stage, job)
            if committed is not None and committed.run_id != cfg.run.id:  # a fork's, inherited: no time here
                say(f"stage {stage}: {job} job inherited from run {committed.run_id} (mugrpo fork): not launched")
                continue
            if committed is not None:  # from an earlier attempt, or started by the stage before: its own timings
                say(f"stage {stage}: {job} job already committed: not relaunched")
                walls[job] = committed.timings.get("total", 0.0)
                switch += committed.timings.get("switch", 0.0)
                continue
            prestart_next(run, stage, job, launcher, say)
            if job == "train" and overlaps_next_generation(cfg, stage):
                walls[job], next_gen, overlap = _train_beside_next_generation(run, stage, urls[job], launcher, say)
            else:
                walls[job] = launcher.run(job, stage, urls[job])
            switch += switch_seconds(run, stage, job, walls[job])
    except BaseException:
        launcher.discard_prestarted()
        raise
    timings = StageTimings(
        t_gen=walls.get("generate", 0.0),
        t_train=walls.get("train", 0.0),
        t_eval=walls.get("eval", 0.0),
        t_switch=switch,
        t_total=time.monotonic() - t0,
        t_next_gen=next_gen,
        t_overlap=overlap,
    )
    return commit_stage(run, stage, timings)


def prestart_next(run: OpenRun, stage: int, job: str, launcher: StageJobs, say: Callable[[str], None]) -> None:
    """Before job ``job`` of ``stage`` is launched, pre-start the jobs that follow it (``orchestration.
    prestart_jobs``; each waits for its markers, :func:`mugrpo.orchestration.job_specs.start_markers`):

    - before generate k: train k;
    - before train k: generate k+1;
    - before generate k+1 runs beside train k's checkpoint (:func:`_train_beside_next_generation`): train k+1.

    The eval job is not pre-started: it is off the path from one policy to the next (its start, about 2 s with the
    job fork server, delays only the stage's commit), and getting it ready would take CPU from the training beside
    it. Jobs already committed are not pre-started; jobs of a stage that does not publish its policy are not
    either (:func:`mugrpo.orchestration.runs.prestarts`).
    """
    cfg, store = run.config, run.store

    def ahead(k: int, name: str) -> None:
        if not prestarts(cfg, k) or read_job_manifest(store, cfg.run.id, k, name) is not None:
            return
        url = write_job_specs(run, k, ahead=True, jobs=(name,))[name]  # its spec with its start markers
        launcher.prestart(name, k, url)
        say(f"stage {k}: {name} job pre-started (it waits for its inputs)")

    if job == "generate":
        ahead(stage, "train")
    elif job == "train":
        ahead(stage + 1, "generate")


def _train_beside_next_generation(
    run: OpenRun, stage: int, url: str, launcher: StageJobs, say: Callable[[str], None]
) -> tuple[float, float, float]:
    """Run stage ``stage``'s train job; once it has committed the policy of stage ``stage + 1``, run that stage's
    generation beside the rest of it (its checkpoint and manifest). Returns (train wall seconds, seconds of the
    next stage's generation, seconds both ran: checkpoint time hidden).

    Raises:
        Exception: the train job or the generation failed past its retries. A failed generation is raised after
            the train job ended (so its checkpoint is committed for the resume).
        RuntimeError: the train job returned without committing.
    """
    cfg, store, layout = run.config, run.store, run.layout
    submitted = datetime.now(UTC)
    train = launcher.submit("train", stage, url)
    while not train.done() and not store.is_complete_dir(layout.policy_dir(stage + 1)):
        time.sleep(POLICY_POLL_S)
    next_gen = overlap = 0.0
    failure: BaseException | None = None
    if not train.done() and read_job_manifest(store, cfg.run.id, stage + 1, "generate") is None:
        next_urls = write_job_specs(run, stage + 1)  # its behavior policy: the policy just committed
        say(f"stage {stage}: policy of stage {stage + 1} committed: its generation starts beside the checkpoint")
        prestart_next(run, stage + 1, "generate", launcher, say)
        start = datetime.now(UTC)
        try:
            launcher.run("generate", stage + 1, next_urls["generate"])
        except Exception as e:  # the train job is still writing: let it commit before the failure propagates
            failure = e
        end = datetime.now(UTC)
        next_gen = (end - start).total_seconds()
    train.result()
    manifest = read_job_manifest(store, cfg.run.id, stage, "train")
    if manifest is None:
        raise RuntimeError(f"stage {stage}: the train job exited 0 but has no job manifest")
    if failure is not None:
        raise failure
    if next_gen:
        overlap = max((min(manifest.created_at, end) - start).total_seconds(), 0.0)
        say(f"stage {stage}: {overlap:.1f} s of the checkpoint ran beside stage {stage + 1}'s generation")
    return max((manifest.created_at - submitted).total_seconds(), 0.0), next_gen, overlap
