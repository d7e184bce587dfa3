"""The stage flow: generate -> train -> eval -> stage manifest (the commit point), with the next stage's generation
started beside the train job's checkpoint write (:mod:`mugrpo.execution.pipeline`, the schedule); and the segment flow:
one warm job that runs several stages (``orchestration.execution: warm``, :mod:`mugrpo.execution.warm`).

A stage whose manifest exists is skipped; inside a stage each job resumes from what it committed, so re-running
a stage (or a segment) after preemption loses and duplicates nothing. Each job is a Prefect task run
(:func:`tasks.jobs.run_job`) with the config's retries and timeout.
"""

from __future__ import annotations

import re
import time
from typing import Any

from prefect import flow, get_run_logger, tags
from prefect.artifacts import create_markdown_artifact
from prefect.futures import wait

from mugrpo.commits.manifest import read_manifest
from mugrpo.config import Config, config_from_dict
from mugrpo.coordination.fanout import FANOUT_JOBS
from mugrpo.execution.pipeline import RunningJob, run_stage
from mugrpo.orchestration.job_specs import job_env
from mugrpo.orchestration.runs import OpenRun, attach_run
from schemas import StageManifest
from tasks.jobs import discard_prestarted, prestart_job, run_job


def job_python(cfg: Config, job: str) -> str | None:
    """The interpreter of a job kind (e.g. a separate vLLM virtualenv for generation).

    A job runs in the interpreter of the engine it uses: the eval job samples with ``generation.engine``, so unless
    ``eval.python`` is set it runs in ``generation.python`` (with ``generation.engine: vllm`` the main interpreter
    has no vLLM; :class:`mugrpo.config.Config` refuses an ``eval.python`` that differs from it). A warm segment
    generates and trains in one process: with the vLLM engine it runs in the generation interpreter (which then
    needs the trainer's packages: accelerate), else in the training one."""
    segment = cfg.generation.python if cfg.generation.engine == "vllm" else cfg.train.python
    return {
        "generate": cfg.generation.python,
        "train": cfg.train.python,
        "eval": cfg.eval.python or cfg.generation.python,
        "segment": segment,
    }[job]


def _job_task(cfg: Config, job: str, stage: int, **labels: str):
    """The launcher task of one job run, with the config's retries and the run's tags."""
    orch = cfg.orchestration
    return run_job.with_options(
        name=f"{job}-stage-{stage}",
        retries=orch.retries,
        retry_delay_seconds=orch.retry_delay_s,
        tags=[f"run:{cfg.run.id}", f"stage:{stage}", f"job:{job}", *(f"{k}:{v}" for k, v in labels.items())],
    )


def launcher_options(cfg: Config) -> dict[str, Any]:
    """Options of the configured launcher: the subprocess launcher forks jobs from the job fork server
    (``orchestration.fork_jobs``)."""
    return {"fork": cfg.orchestration.fork_jobs} if cfg.orchestration.launcher == "subprocess" else {}


def _job_kwargs(cfg: Config, job: str, stage: int, *, stages: int = 1, **labels: str) -> dict[str, Any]:
    return {
        "python": job_python(cfg, job),
        "env": job_env(cfg),
        "timeout_s": cfg.orchestration.job_timeout_s * stages,
        "launcher": cfg.orchestration.launcher,
        "launcher_options": launcher_options(cfg),
        "labels": {"run": cfg.run.id, "stage": str(stage), **labels},
    }


def launch(cfg: Config, job: str, spec_url: str, stage: int, *, stages: int = 1) -> float:
    """Run one job through the launcher task with the config's retries and timeout (``job_timeout_s`` per stage
    the job runs); returns its wall seconds."""
    t0 = time.monotonic()
    _job_task(cfg, job, stage)(job, spec_url, **_job_kwargs(cfg, job, stage, stages=stages))
    return time.monotonic() - t0


class _SubmittedTask:
    """A job's task run submitted to the flow's task runner (:class:`mugrpo.execution.pipeline.RunningJob`)."""

    def __init__(self, future) -> None:
        self.future = future

    def done(self) -> bool:
        return self.future.state.is_final()

    def result(self) -> None:
        self.future.result()  # raises the task's exception once it failed past its retries


class PrefectLauncher:
    """The stage schedule's launcher (:class:`mugrpo.execution.pipeline.StageJobs`) in a flow: every job a launcher task
    run, fan-out jobs (generate, eval) as their N workers (:func:`launch_workers`)."""

    def __init__(self, run: OpenRun) -> None:
        self.opened, self.cfg = run, run.config

    def run(self, job: str, stage: int, spec_url: str) -> float:
        if job in FANOUT_JOBS:
            return launch_workers(self.opened, job, stage)
        return launch(self.cfg, job, spec_url, stage)

    def submit(self, job: str, stage: int, spec_url: str) -> RunningJob:
        if job in FANOUT_JOBS:
            raise ValueError(f"{job} is a fan-out job: run it with run()")
        task = _job_task(self.cfg, job, stage)
        return _SubmittedTask(task.submit(job, spec_url, **_job_kwargs(self.cfg, job, stage)))

    def prestart(self, job: str, stage: int, spec_url: str) -> None:
        """Pre-start the job's process(es) (:func:`tasks.jobs.prestart_job`): each worker of a fan-out job, with
        the arguments its task run in :meth:`run` / :func:`launch_workers` will have."""
        if job not in FANOUT_JOBS:
            prestart_job(job, spec_url, **_job_kwargs(self.cfg, job, stage))
            return
        for w, url in enumerate(_worker_spec_urls(self.opened, job, stage)):
            prestart_job(job, url, **_job_kwargs(self.cfg, job, stage, worker=str(w)))

    def discard_prestarted(self) -> None:
        options = launcher_options(self.cfg)
        discard_prestarted({"run": self.cfg.run.id}, launcher=self.cfg.orchestration.launcher, launcher_options=options)


def _worker_spec_urls(run: OpenRun, job: str, stage: int) -> list[str]:
    """The spec URLs of fan-out job ``job``'s workers (:func:`mugrpo.coordination.fanout.worker_spec_paths`, written
    from the job spec when there is more than one worker)."""
    from mugrpo.coordination.fanout import worker_spec_paths
    from mugrpo.evaluation.worker import EvalSpec
    from mugrpo.generation import GenerateSpec

    store = run.store
    spec_cls = {"generate": GenerateSpec, "eval": EvalSpec}[job]
    spec = spec_cls.model_validate_json(store.read_bytes(run.layout.job_spec(stage, job)))
    return [store.uri(p) for p in worker_spec_paths(store, run.config.run.id, stage, job, spec, spec.workers)]


def launch_workers(run: OpenRun, job: str, stage: int) -> float:
    """Run the fan-out job ``job`` (generate or eval) of stage ``stage`` of open run ``run``: its N workers
    (``generation.workers``, ``eval.workers``; :mod:`mugrpo.coordination.fanout`) at once, each its own launcher task
    run (a process, or a Kubernetes Job with its own GPU request) with the config's retries and timeout; workers
    whose worker manifest exists are not relaunched. Once all returned, the job manifest is written from their
    manifests if the last worker did not write it. N = 1 runs the same way. Returns the wall seconds of the fan-out.

    Raises:
        JobError: a worker failed past its retries (the first failed worker's error, with its last lines; the
            other workers run to their end first, so what they sampled is committed for the resume).
        RuntimeError: every worker returned but one has no worker manifest.
    """
    from mugrpo.coordination.fanout import missing_workers
    from mugrpo.evaluation.worker import EvalSpec, commit_eval
    from mugrpo.generation import GenerateSpec, commit_generation

    logger = get_run_logger()
    cfg, store = run.config, run.store
    spec_cls, finalize = {"generate": (GenerateSpec, commit_generation), "eval": (EvalSpec, commit_eval)}[job]
    spec = spec_cls.model_validate_json(store.read_bytes(run.layout.job_spec(stage, job)))
    n = spec.workers
    urls = _worker_spec_urls(run, job, stage)
    todo = missing_workers(store, cfg.run.id, stage, job, n)
    if len(todo) < n:
        logger.info(
            "stage %d: %s workers %s already committed: not relaunched", stage, job, sorted(set(range(n)) - set(todo))
        )
    t0 = time.monotonic()
    futures = []
    for w in todo:
        task = _job_task(cfg, job, stage, worker=str(w)).with_options(
            task_run_name=f"{job}-stage-{stage}-worker-{w}-of-{n}"  # one task run per worker, with its logs
        )
        future = task.submit(job, urls[w], **_job_kwargs(cfg, job, stage, worker=str(w)))
        futures.append((w, future))
    wait([f for _, f in futures])
    for w, future in futures:
        if future.state.is_failed():
            try:
                future.result()
            except Exception as e:
                e.add_note(f"stage {stage}: {job} worker {w} of {n} failed past its retries")
                raise
    if finalize(spec) is None:
        missing = missing_workers(store, cfg.run.id, stage, job, n)
        raise RuntimeError(f"stage {stage}: {job} workers {missing} of {n} exited 0 but have no worker manifest")
    return time.monotonic() - t0


def stage_table(manifest: StageManifest) -> str:
    """Markdown summary of a committed stage: counts, reward, accuracy and timings (Table 1 columns)."""
    t = manifest.timings
    lines = [
        f"### Stage {manifest.stage} of run `{manifest.run_id}`",
        "",
        "| metric | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in sorted(manifest.counts.items())),
        *(f"| {k} | {v:.4g} |" for k, v in sorted(manifest.metrics.items())),
        f"| T_gen (s) | {t.t_gen:.1f} |",
        f"| T_train (s) | {t.t_train:.1f} |",
        f"| T_eval (s) | {t.t_eval:.1f} |",
        f"| T_switch (s) | {t.t_switch:.1f} |",
        f"| T_sync (s) | {t.t_sync:.3f} |",
        f"| T_total (s) | {t.t_total:.1f} |",
        *(
            [
                f"| next stage's generation, started here (s) | {t.t_next_gen:.1f} |",
                f"| of it, beside this stage's checkpoint (s) | {t.t_overlap:.1f} |",
            ]
            if t.t_next_gen
            else []
        ),
    ]
    return "\n".join(lines)


@flow(name="mugrpo-stage", log_prints=True)
def stage_flow(config: dict[str, Any], stage: int) -> dict[str, Any]:
    """Run (or resume) stage ``stage`` of the run described by ``config`` (a resolved config dict: the run flow
    started the run). The flow opens the run once (:func:`mugrpo.orchestration.runs.attach_run`: nothing checked
    again) and hands it to everything it runs."""
    cfg = config_from_dict(config, source="stage_flow(config)")
    logger = get_run_logger()
    run = attach_run(cfg)
    done = read_manifest(run.store, cfg.run.id, stage)
    if done is not None:
        logger.info("stage %d already committed: skipping", stage)
        return done.model_dump(mode="json")
    with tags(f"run:{cfg.run.id}", f"stage:{stage}"):
        manifest = run_stage(run, stage, PrefectLauncher(run), say=logger.info)
    create_markdown_artifact(
        markdown=stage_table(manifest),
        key=re.sub(r"[^a-z0-9-]", "-", f"{cfg.run.id.lower()}-stage-{stage}"),
        description=f"mugrpo run {cfg.run.id}, stage {stage}",
    )
    logger.info("stage %d committed in %.1f s", stage, manifest.timings.t_total)
    return manifest.model_dump(mode="json")


@flow(name="mugrpo-segment", log_prints=True)
def segment_flow(config: dict[str, Any], first: int, count: int) -> list[dict[str, Any]]:
    """Run (or resume) stages ``first .. first + count - 1`` warm, as one segment job launched through the same
    launcher task as the cold jobs; its progress lines update a Prefect progress artifact while it runs, and each
    stage it commits gets the stage flow's summary artifact. Returns the stage manifests."""
    from mugrpo.execution.warm import SegmentSpec

    cfg = config_from_dict(config, source="segment_flow(config)")
    logger = get_run_logger()
    store = attach_run(cfg).store  # opened once (the run flow started the run)
    stages = range(first, min(first + count, cfg.run.num_stages))
    if all(read_manifest(store, cfg.run.id, k) is not None for k in stages):
        logger.info("stages %d..%d already committed: skipping", stages[0], stages[-1])
    else:
        rel = cfg.layout.job_spec(first, "segment")
        store.write_bytes(rel, SegmentSpec.from_config(cfg, first, count).model_dump_json(indent=2).encode())
        with tags(f"run:{cfg.run.id}", f"segment:{first}"):
            wall = launch(cfg, "segment", store.uri(rel), first, stages=len(stages))
        logger.info("segment %d..%d done in %.1f s", stages[0], stages[-1], wall)
    manifests = []
    for k in stages:
        manifest = read_manifest(store, cfg.run.id, k)
        if manifest is None:
            raise RuntimeError(f"segment job exited 0 but stage {k} has no manifest")
        create_markdown_artifact(
            markdown=stage_table(manifest),
            key=re.sub(r"[^a-z0-9-]", "-", f"{cfg.run.id.lower()}-stage-{k}"),
            description=f"mugrpo run {cfg.run.id}, stage {k} (warm)",
        )
        manifests.append(manifest.model_dump(mode="json"))
    return manifests
