"""The run flow: K stage flows in order, then the evaluation of the final policy."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, tags
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.runtime import flow_run as current_flow_run

from flows.exclusive import one_flow_run_per_run_id
from flows.stage import launch_workers, segment_flow, stage_flow
from mugrpo.algorithms import excluding_columns
from mugrpo.commits.manifest import read_job_manifest
from mugrpo.commits.verify import refuse_corrupted
from mugrpo.config import Config, config_from_dict
from mugrpo.config.precision import describe
from mugrpo.coordination.lease import RunLease, held_lease
from mugrpo.orchestration.job_specs import write_final_eval_spec
from mugrpo.orchestration.runs import open_store, start_run
from mugrpo.storage.store import Store
from mugrpo.tracking.session import TrackingSession
from tasks.stops import note_flow_run


def artifact_key(run_id: str, suffix: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]", "-", f"{run_id.lower()}-{suffix}")


def publish_report(cfg, run_uri: str) -> str:
    """Write the HTML report next to the run and publish it as Prefect artifacts (a table and a link)."""
    from mugrpo.inspection.report import collect, table1_markdown, write_report_data

    data = collect(run_uri, cfg.run.storage_options)
    where = write_report_data(data, run_uri, cfg.run.storage_options)
    create_markdown_artifact(
        markdown=f"### Run `{cfg.run.id}`\n\n{table1_markdown(data)}\n\nHTML report: `{where}`",
        key=artifact_key(cfg.run.id, "summary"),
        description=f"mugrpo run {cfg.run.id}: per-stage summary",
    )
    link = where if "://" in where else Path(where).resolve().as_uri()
    create_link_artifact(
        link=link,
        link_text="HTML report",
        key=artifact_key(cfg.run.id, "report"),
        description=f"mugrpo run {cfg.run.id}: self-contained HTML report",
    )
    get_run_logger().info("report: %s", where)
    return where


@flow(name="mugrpo-run", log_prints=True)
def run_flow(config: dict[str, Any]) -> dict[str, Any]:
    """Run or resume a whole run. Object storage decides what is done: committed stages and jobs are skipped.

    At most one flow run per run id runs at a time (flows/exclusive.py: a Prefect global concurrency limit
    ``mugrpo-run:{run id}`` of one slot, a lease that frees itself minutes after its holder died).

    A stop of ``mugrpo run`` (Ctrl-C, SIGTERM) marks this flow run, its stage flow runs and their unfinished task
    runs ``Cancelled``, with the resume command in the state's message (:func:`tasks.stops.cancel_flow_runs`: the
    flow run notes its id here), instead of the ``Crashed`` Prefect's engine gives a run a signal unwound.

    Raises:
        mugrpo.orchestration.runs.ConfigMismatchError: the run id exists with a config that differs in a semantic key.
        mugrpo.orchestration.runs.InputChangedError: an input (training set, eval set, initial weights, tokenizer)
            changed or is missing since the run started.
        TimeoutError: another flow run of the run id held its slot for 15 minutes.
        mugrpo.coordination.lease.RunLeaseHeld: another live writer holds the run lease in object storage (names it).
        mugrpo.coordination.lease.LeaseFenced: this writer's lease was taken over while it ran.
        mugrpo.commits.verify.CorruptedRunError: a committed file is corrupted or missing (names it and the
            recovery).
    """
    note_flow_run(current_flow_run.id)  # a stop of `mugrpo run` in this process marks it Cancelled
    cfg = config_from_dict(config, source="run_flow(config)")
    with one_flow_run_per_run_id(cfg.run.id):  # flows/exclusive.py: two flow runs of one run id never overlap
        return _run(cfg)


def _run(cfg: Config) -> dict[str, Any]:
    """Hold the run lease in object storage (mugrpo.coordination.lease: one writer per run, jobs fenced by its token)
    for the whole run."""
    orch = cfg.orchestration
    store = open_store(cfg)  # the one store of this run in this flow (start_run and every stage helper use it)
    held = held_lease(store, cfg.run.id)
    if held is not None:  # taken by `mugrpo run` before Prefect started (mugrpo.cli): a loser never got here
        return _run_leased(cfg, store, held)
    with RunLease(store, cfg.run.id, ttl_s=orch.lease_ttl_s, wait_s=orch.lease_wait_s) as lease:
        return _run_leased(cfg, store, lease)


def _run_leased(cfg: Config, store: Store, lease: RunLease) -> dict[str, Any]:
    logger = get_run_logger()
    t0 = time.monotonic()
    cleared = lease.cleared  # what `mugrpo run` checked before it took this lease (mugrpo.orchestration.preflight)
    check = verified = None
    if cleared is not None and cleared.current(cfg):  # nothing written since: one verification per start
        check, verified = cleared.check, cleared.verified
        if verified is not None:
            logger.info("committed files (checked before the lease was taken): %s", verified.summary())
    elif cfg.orchestration.verify_on_resume != "off":  # never build on a corrupted committed stage, and refuse
        # before start_run records the resume in run.json's history (mugrpo.commits.verify)
        quick = cfg.orchestration.verify_on_resume == "quick"
        verified = refuse_corrupted(store, cfg.run.id, cfg.run.num_stages, cfg.layout, quick=quick)
        logger.info("committed files: %s", verified.summary())
    run = start_run(cfg, check, verified, store=store)  # the open run every stage helper below takes
    cfg = run.config  # the concrete config: auto precision resolved once, at run start
    logger.info("run %s lives at %s", cfg.run.id, store.uri(cfg.run.id))
    if check is None:  # this flow resolved the precision (no preflight of `mugrpo run` did, nor printed it): it says so
        logger.info(describe(run.precision))
        if run.warning:
            logger.warning(run.warning)
    results = []
    final = {}
    with TrackingSession(
        cfg, store, excluding_columns()
    ) as tracking:  # live mirror of committed metrics (tracking.sinks)
        if cfg.orchestration.execution == "warm":  # one job per segment of consecutive stages
            size = cfg.orchestration.segment_stages
            for first in range(0, cfg.run.num_stages, size):
                lease.ensure_held()
                results.extend(segment_flow(config=cfg.to_json_dict(), first=first, count=size))
                tracking.sync()
        else:
            for k in range(cfg.run.num_stages):
                lease.ensure_held()
                results.append(stage_flow(config=cfg.to_json_dict(), stage=k))
                tracking.sync()
        lease.ensure_held()
        spec = write_final_eval_spec(run)
        if spec is not None:
            with tags(f"run:{cfg.run.id}", "final-eval"):
                if read_job_manifest(store, cfg.run.id, cfg.run.num_stages, "eval") is None:
                    launch_workers(run, "eval", cfg.run.num_stages)
            final = read_job_manifest(store, cfg.run.id, cfg.run.num_stages, "eval").metrics
    try:
        report = publish_report(cfg, store.uri(cfg.run.id))
    except Exception as e:  # the report is derived from committed files: never fail a finished run over it
        report = f"not written ({type(e).__name__}: {e}); rebuild it with `mugrpo report {store.uri(cfg.run.id)}`"
        logger.warning("report %s", report)
    return {
        "run_id": cfg.run.id,
        "uri": store.uri(cfg.run.id),
        "stages": len(results),
        "final_eval": final,
        "report": report,
        "seconds": time.monotonic() - t0,
    }
