"""The sections of how a run executes: how flows launch jobs (``orchestration``) and which experiment trackers
mirror its metrics (``tracking``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from mugrpo.config.base import _Section
from mugrpo.config_keys import SEMANTIC


class OrchestrationSection(_Section):
    """How flows launch jobs."""

    job_timeout_s: float = Field(6 * 3600, gt=0, description="A job running longer is killed and retried.")
    retries: int = Field(1, ge=0, description="Retries of a failed job (resume makes them cheap).")
    retry_delay_s: float = Field(5, ge=0)
    lease_ttl_s: float = Field(
        60.0,
        ge=1,
        description="Run lease (one writer per run, mugrpo.coordination.lease): seconds a lease lives without a "
        "heartbeat (the holder renews it every ttl/3). A writer that died on another host blocks the run this long; "
        "one that died on this host is taken over at once. Same order as Kubernetes' node lease (40 s) and Prefect's "
        "slot lease.",
    )
    lease_wait_s: float = Field(
        0.0,
        ge=0,
        description="Seconds a new writer waits for a live holder's lease to expire before it is refused (0: refuse "
        "at once, naming the holder). Set it > lease_ttl_s on a scheduler that restarts a preempted flow.",
    )
    stop_grace_s: float = Field(
        25.0,
        ge=1,
        description="Seconds `mugrpo run` / `resume` takes to stop after Ctrl-C or SIGTERM (to its process group or "
        "its pid). Running jobs get SIGTERM and the jobs' share of it to save their work (the grace less the CLI's "
        "cleanup reserve of min(5 s, half the grace): 20 s of the default 25 s; a train job saves a checkpoint and "
        "exits 75), then SIGKILL; jobs are told their share (MUGRPO_STOP_GRACE_S), and on Kubernetes it is their "
        "pods' terminationGracePeriodSeconds, so an eviction or a node drain gives them the same time. In the "
        "reserve the run lease is released, the Prefect flow run marked Cancelled (not Crashed), the temporary "
        "Prefect server stopped and the resume command printed; past this grace the process exits anyway (exit "
        "code 130 for SIGINT, 143 for SIGTERM). A second Ctrl-C stops at once. Keep it under the "
        "terminationGracePeriodSeconds of a pod that runs `mugrpo run` itself (Kubernetes' default 30 s).",
    )
    verify_on_resume: Literal["quick", "full", "off"] = Field(
        "quick",
        description="What a start checks of the committed files before building on them (mugrpo.commits.verify; a "
        "corrupted or missing file is refused, exit 3). 'quick': re-hash what the next work reads (the first stage "
        "not committed, the checkpoints it resumes from, or the final policy) and check earlier stages by what the "
        "store says without reading them (size, S3's SHA-256 checksum or the ETag recorded at commit, the local hash "
        "cache): the start's cost follows what it builds on, not the run's length. 'full': re-hash every committed "
        "file (`mugrpo verify`). 'off': check nothing (the jobs still verify every file they read). Earlier configs' "
        "true/false read as quick/off.",
    )

    @field_validator("verify_on_resume", mode="before")
    @classmethod
    def _verify_from_bool(cls, v):
        """run.json files written when the key was a bool: true -> quick, false -> off."""
        return {True: "quick", False: "off"}.get(v, v) if isinstance(v, bool) else v

    launcher: Literal["subprocess", "kubernetes"] = Field("subprocess")
    execution: Literal["cold", "warm"] = Field(
        "cold",
        json_schema_extra=SEMANTIC,
        description="'cold': each stage runs generate, train and eval as separate jobs (processes), each loading the "
        "policy and starting its engine: right for Mu-GRPO's few large stages (arXiv 2605.17570). 'warm': one job "
        "per segment of `segment_stages` consecutive stages keeps the policy, the optimizer, the rollout engine and "
        "the verifier pool loaded and syncs weights in memory, as TRL's and verl's GRPO do: the fair way to run "
        "standard GRPO's many short stages (mu = 4). Both commit the same files; on CPU they give the same rollouts "
        "and weights (mugrpo.execution.warm).",
    )
    segment_stages: int = Field(
        16,
        ge=1,
        json_schema_extra=SEMANTIC,
        description="Warm execution: stages per segment job. A segment is one process start; a failed or killed "
        "segment resumes from its last committed stage and checkpoint.",
    )
    overlap_checkpoint: bool = Field(
        True,
        description="Cold execution: start stage k+1's generation as soon as stage k's train job has committed the "
        "policy of stage k+1, while it still writes its final checkpoint (the AdamW moments); stage k+1's training "
        "starts after that checkpoint's commit (mugrpo.execution.pipeline). Same jobs, same files; a stage that does "
        "not publish its policy (publish_policy_every) is not overlapped. False: the jobs run strictly one after "
        "another.",
    )
    fork_jobs: bool = Field(
        True,
        description="Subprocess launcher on Linux: start each job as a fork of a job fork server that has imported "
        "torch, transformers and the mugrpo libraries once per run and interpreter (mugrpo.jobs.forkserver), "
        "instead of a new interpreter that imports them again (6-7 s of CPU per job on 2 cores). The job is still a "
        "separate process with its own session, environment and command line, and commits the same files. False: "
        "every job a new interpreter.",
    )
    prestart_jobs: bool = Field(
        True,
        description="Cold execution: launch each job while the job before it still runs (stage k+1's generate and "
        "stage k's eval while stage k trains, stage k+1's train while stage k+1 generates); it imports, starts its "
        "verifier pool and loads its datasets, then waits for its inputs' commit markers "
        "(mugrpo.coordination.start_gate). On Kubernetes its pod is created ahead. The same jobs commit the same "
        "files; what it saves is each job's start on the critical path, which needs a free core (or node) beside the "
        "running job. Jobs of a stage that does not publish its policy (publish_policy_every) start as before.",
    )
    publish_policy_every: int = Field(
        1,
        ge=1,
        json_schema_extra=SEMANTIC,
        description="Publish policies/stage=k (a full HF copy of the weights) only when k is a multiple of this, and "
        "always the final policy. An unpublished stage's behavior policy is the previous stage's final checkpoint "
        "(mugrpo.orchestration.runs.behavior_policy_dir); with a value > 1, final checkpoints of older stages are "
        "deleted once a later stage commits, so 1,000 short stages do not keep 1,000 copies of the weights.",
    )


class TrackingSection(_Section):
    """Experiment trackers that mirror the run's committed metrics (verl's ``trainer.logger``, TRL's ``report_to``).

    The run flow logs what the store has committed: every update's train_steps row (step = global update), each
    stage's timings, counts and eval metrics (avg@k, pass@k), the config as hyper-parameters (without credentials)
    and a sample of each stage's rollouts. A killed and resumed run continues the same tracker run with no step
    logged twice (each sink reads back what it holds). Changing this section on an existing run is allowed.
    """

    sinks: list[str] = Field(
        default_factory=list,
        description="Tracker sinks: any of tensorboard, wandb, mlflow (extras tracking-tensorboard, tracking-wandb, "
        "tracking-mlflow). [] = none.",
    )
    dir: str | None = Field(
        None,
        description="Local folder for tracker files (TensorBoard events, W&B offline runs, MLflow's default SQLite "
        "db). None = {run folder}/tracking for a local run root, else ./tracking/{run id}.",
    )
    project: str = Field("mugrpo", description="W&B project and MLflow experiment name.")
    poll_s: float = Field(
        30.0, gt=0, description="Seconds between syncs while jobs run (live progress at checkpoint granularity)."
    )
    rollout_samples: int = Field(8, ge=0, description="Rollouts per stage shown as a table (0 = none).")
    wandb_mode: Literal["online", "offline"] | None = Field(
        None, description="W&B mode; None = the WANDB_MODE environment variable, else online."
    )
    wandb_entity: str | None = Field(None, description="W&B entity (team or user); None = your default.")
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; None = MLFLOW_TRACKING_URI, else sqlite in the tracking folder."
    )

    @field_validator("sinks")
    @classmethod
    def _known_installed_sinks(cls, sinks: list[str]) -> list[str]:
        from mugrpo.tracking import TRACKING_SINKS

        for name in sinks:
            TRACKING_SINKS[name].check_installed(name)  # unknown name or missing package: ValueError
        if len(set(sinks)) != len(sinks):
            raise ValueError(f"tracking.sinks lists a sink twice: {sinks}")
        return sinks
