"""The job specs of a stage (generate, train, eval), as the cold jobs and a warm segment run them, the commit
markers a pre-started job waits for (:func:`start_markers`), and the environment a job process gets
(:func:`job_env`). What the stage schedule decides (the behavior policy, the policy version, whether the stage is
evaluated or its jobs pre-started) is run bookkeeping, in :mod:`mugrpo.orchestration.runs`.
"""

from __future__ import annotations

import json
import os

from mugrpo.common.preemption import GRACE_ENV, job_grace_s
from mugrpo.config import Config
from mugrpo.coordination.lease import TOKEN_ENV
from mugrpo.orchestration.runs import (
    OpenRun,
    behavior_policy_dir,
    evaluates_stage,
    overlaps_next_generation,
    policy_version,
    prestarts,
    publishes_policy,
)


def start_markers(cfg: Config, stage: int, job: str) -> list[str]:
    """The commit markers job ``job`` of ``stage`` waits for before it reads its inputs (store paths; the spec's
    ``start_after``, :mod:`mugrpo.coordination.start_gate`). They are the commits the cold stage schedule
    (:mod:`mugrpo.execution.pipeline`) waits for before it launches the job, so a pre-started job runs exactly when a
    job launched then would, and never beside another job of the run but where the schedule overlaps them:

    - generate k: the behavior policy's ``_COMPLETE`` marker, and stage k-1's manifest unless stage k-1 overlaps
      this generation with its checkpoint;
    - train k: stage k's generate manifest and stage k-1's manifest (its evaluation done, its AdamW moments final);
    - eval k: stage k's train manifest, and stage k+1's generate manifest when that generation runs beside stage k's
      checkpoint.

    [] when the stage's jobs are not pre-started (:func:`prestarts`).
    """
    from mugrpo.storage.store import COMPLETE_MARKER

    if not prestarts(cfg, stage):
        return []
    layout = cfg.layout
    previous = [layout.stage_manifest(stage - 1)] if stage > 0 else []
    if job == "generate":
        policy = [f"{layout.policy_dir(stage)}/{COMPLETE_MARKER}"]
        return policy if overlaps_next_generation(cfg, stage - 1) else policy + previous
    if job == "train":
        return [layout.job_manifest(stage, "generate"), *previous]
    if job == "eval":
        beside = [layout.job_manifest(stage + 1, "generate")] if overlaps_next_generation(cfg, stage) else []
        return [layout.job_manifest(stage, "train"), *beside]
    raise ValueError(f"no start markers for job {job!r}: one of generate, train, eval")


def build_job_specs(run: OpenRun, stage: int, *, with_eval: bool | None = None, ahead: bool = False) -> dict:
    """The generate/train(/eval) specs of a stage of open run ``run``, as the cold jobs and a warm segment both
    run them.

    The behavior policy is resolved with :func:`behavior_policy_dir`, so stage ``stage - 1`` must have committed
    its training. With ``ahead``, the specs of jobs launched before their inputs exist (:func:`prestarts` must
    hold): the behavior policy is the published ``policies/stage={stage}``, committed or not (the path the
    resolution gives once it is), and each spec carries its :func:`start_markers`. A spec written when its job
    is launched has none: the job, also run by hand, starts at once.

    Raises:
        FileNotFoundError: no behavior policy is committed (not ``ahead``).
        ValueError: ``ahead`` for a stage whose jobs are not pre-started.
    """
    from mugrpo.evaluation.worker import EvalSpec
    from mugrpo.generation import GenerateSpec
    from mugrpo.trainer.spec import TrainSpec

    cfg, store = run.config, run.store
    if ahead and not prestarts(cfg, stage):
        raise ValueError(f"stage {stage}: its jobs are not pre-started, so their specs cannot be written ahead")
    version = policy_version(cfg, stage)
    behavior = cfg.layout.policy_dir(stage) if ahead else behavior_policy_dir(store, cfg, stage)
    specs = {
        "generate": GenerateSpec.from_config(cfg, stage, version).model_copy(update={"policy_dir": behavior}),
        "train": TrainSpec.from_config(cfg, stage, version).model_copy(
            update={"policy_dir": behavior, "publish_policy": publishes_policy(cfg, stage + 1)}
        ),
    }
    if evaluates_stage(cfg, stage) if with_eval is None else (with_eval and cfg.eval.benchmarks):
        specs["eval"] = EvalSpec.from_config(cfg, stage).model_copy(update={"policy_dir": behavior})
    if ahead:
        timeout = cfg.orchestration.job_timeout_s
        for job, spec in specs.items():
            specs[job] = spec.model_copy(
                update={"start_after": start_markers(cfg, stage, job), "start_timeout_s": timeout}
            )
    return specs


def write_job_specs(
    run: OpenRun, stage: int, *, with_eval: bool | None = None, ahead: bool = False, jobs: tuple[str, ...] = ()
) -> dict[str, str]:
    """Write the generate/train/eval specs of a stage (:func:`build_job_specs`; only ``jobs`` when given) to
    storage; returns {job: URL}. A spec file that already holds the same bytes is left as it is."""
    store, layout = run.store, run.layout
    urls = {}
    for job, spec in build_job_specs(run, stage, with_eval=with_eval, ahead=ahead).items():
        if jobs and job not in jobs:
            continue
        rel = layout.job_spec(stage, job)
        data = spec.model_dump_json(indent=2).encode()
        if not (store.exists(rel) and store.read_bytes(rel) == data):
            store.write_bytes(rel, data)
        urls[job] = store.uri(rel)
    return urls


def write_final_eval_spec(run: OpenRun) -> str | None:
    """Spec of the evaluation of the final policy (stage K) of open run ``run``; None when no benchmark is
    configured."""
    from mugrpo.evaluation.worker import EvalSpec

    cfg, store = run.config, run.store
    if not cfg.eval.benchmarks:
        return None
    rel = run.layout.job_spec(cfg.run.num_stages, "eval")
    store.write_bytes(rel, EvalSpec.from_config(cfg, cfg.run.num_stages).model_dump_json(indent=2).encode())
    return store.uri(rel)


def job_env(cfg: Config) -> dict[str, str]:
    """Environment for job processes: storage options (never secrets) so specs on object storage can be read, the
    seconds a job has from its SIGTERM to its SIGKILL (``MUGRPO_STOP_GRACE_S``: ``orchestration.stop_grace_s`` less
    what the CLI keeps for its cleanups, :func:`mugrpo.common.preemption.job_grace_s`; the Kubernetes launcher sets
    the pod's ``terminationGracePeriodSeconds`` from it), and the run lease token of this writer
    (``MUGRPO_LEASE_TOKEN``) when it holds one."""
    env = {
        "MUGRPO_STORAGE_OPTIONS": json.dumps(cfg.to_json_dict()["run"]["storage_options"]),
        GRACE_ENV: f"{job_grace_s(cfg.orchestration.stop_grace_s):g}",
    }
    token = os.environ.get(TOKEN_ENV)
    if token:  # the run lease's fencing token (mugrpo.coordination.lease): a job of a superseded writer cannot commit
        env[TOKEN_ENV] = token
    return env
