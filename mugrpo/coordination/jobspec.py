"""What every job spec carries: where the run lives and which stage the job works on (:class:`JobSpec`).

Each job's spec subclasses it (``TrainSpec``, ``GenerateSpec``, ``EvalSpec``, ``SegmentSpec``); the run flow writes
the spec under ``{root}/{run_id}/jobs/stage={k}/`` and launches the job on it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mugrpo.coordination.lease import LeaseFence
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import RetryBudget, Store


class JobSpec(BaseModel):
    """Fields every job spec carries: where the run lives and which stage the job works on."""

    model_config = ConfigDict(extra="forbid")

    root: str = Field(description="Run root URL (local folder or s3://...).")
    storage_options: dict[str, Any] = Field(default_factory=dict, description="fsspec options (no secrets).")
    storage_retry: RetryBudget = Field(default_factory=RetryBudget, description="Retry budget of S3 requests.")
    run_id: str
    parent_run: str | None = Field(
        None, description="A fork's parent run (run.parent.run_id): the folders below fork_stage are its."
    )
    fork_stage: int = Field(0, ge=0, description="A fork's first own stage (run.parent.stage); 0 for a run of its own.")
    stage: int = Field(ge=0)
    seed: int = 0
    start_after: list[str] = Field(
        default_factory=list,
        description="Store paths of the commit markers of this job's inputs (a job manifest, a policy's _COMPLETE, "
        "a stage manifest). A job launched before they exist (orchestration.prestart_jobs) imports, starts its "
        "verifier pool and loads its datasets, then waits for them before it reads anything "
        "(mugrpo.coordination.start_gate). Empty: start at once.",
    )
    start_timeout_s: float = Field(
        6 * 3600.0, gt=0, description="Seconds a job waits for the markers of start_after before it exits (1)."
    )

    @property
    def layout(self) -> RunLayout:
        """The run's storage layout, a fork's naming its parent (:class:`mugrpo.storage.layout.RunLayout`)."""
        if self.parent_run is None:
            return RunLayout(self.run_id)
        return RunLayout(self.run_id, parent=self.parent_run, fork_stage=self.fork_stage)

    def store(self) -> Store:
        """The run's store, its writes fenced by the run lease (:class:`mugrpo.coordination.lease.LeaseFence`): a job of
        a writer that lost the run changes nothing."""
        return Store(self.root, self.storage_options, self.storage_retry, guard=LeaseFence())

    @staticmethod
    def run_fields(cfg, stage: int) -> dict[str, Any]:
        """The fields above but the start markers, taken from a run config (:class:`mugrpo.config.Config`) for
        stage ``stage``."""
        return {
            "root": cfg.run.root,
            "storage_options": cfg.run.storage_options,
            "storage_retry": cfg.run.storage_retry,
            "run_id": cfg.run.id,
            "parent_run": cfg.run.parent.run_id if cfg.run.parent else None,
            "fork_stage": cfg.run.parent.stage if cfg.run.parent else 0,
            "stage": stage,
            "seed": cfg.run.seed,
        }
