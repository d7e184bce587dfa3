"""The stage manifest: written last, it is the commit point of a stage (docs/design.md, "Commits")."""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
from pydantic import BaseModel, Field

MANIFEST_VERSION = 1


class FileRecord(BaseModel):
    """One committed file, relative to the run directory."""

    path: str = Field(description="Path relative to the run directory, e.g. 'rollouts/stage=0/shard=00000.parquet'.")
    sha256: str = Field(description="Hex sha256 of the file's bytes.")
    bytes: int = Field(ge=0)
    rows: int | None = Field(default=None, description="Row count for Parquet files.")


class StageTimings(BaseModel):
    """Wall-clock seconds, in the columns of the Mu-GRPO paper's Table 1 (T_roll = t_gen, T_total)."""

    t_gen: float = 0.0
    t_train: float = 0.0
    t_eval: float = 0.0
    t_switch: float = Field(
        0.0,
        description="Everything in the stage that is not generation, training or evaluation work. Cold execution: "
        "job process start, imports, engine start and weight load, summed over the stage's jobs. Warm execution: "
        "the in-memory weight sync and per-stage bookkeeping (plus, in a segment's first stage, the segment job's "
        "start and load).",
    )
    t_total: float = 0.0
    t_sync: float = Field(
        0.0, description="Warm execution: seconds to sync the trainer's weights into the rollout engine (in t_switch)."
    )
    t_next_gen: float = Field(
        0.0,
        description="Cold execution with orchestration.overlap_checkpoint: seconds of the next stage's generation "
        "that this stage started once its policy was published (mugrpo.execution.pipeline). They are in this stage's "
        "t_total (every wall second is in one stage's t_total), while the next stage's t_gen is that job's own wall "
        "time.",
    )
    t_overlap: float = Field(
        0.0,
        description="Of t_next_gen, the seconds during which this stage's train job was still writing its checkpoint "
        "(checkpoint time hidden behind the next stage's generation; counted once, in t_total).",
    )


class JobManifest(BaseModel):
    """What one job (generate, train or eval) of a stage committed; written last by the job."""

    manifest_version: int = MANIFEST_VERSION
    run_id: str
    stage: int = Field(ge=0)
    job: str = Field(description="generate | train | eval")
    created_at: datetime
    files: list[FileRecord]
    counts: dict[str, int] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds: switch (start + load), work, total.")
    code_version: str | None = Field(
        None,
        description="Version of the code that wrote it (mugrpo.common.version); None in manifests of older versions.",
    )


class StageManifest(BaseModel):
    """Everything a stage committed. Its existence means the stage is complete."""

    manifest_version: int = MANIFEST_VERSION
    run_id: str
    stage: int = Field(ge=0)
    status: str = "complete"
    created_at: datetime
    files: list[FileRecord]
    counts: dict[str, int] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    timings: StageTimings = Field(default_factory=StageTimings)
    code_version: str | None = Field(
        None,
        description="Version of the code that committed the stage (mugrpo.common.version); None in older manifests.",
    )
    job_code_versions: dict[str, str] = Field(
        default_factory=dict,
        description="Version of the code that committed each job of the stage, by job (generate, train, eval): a "
        "stage resumed by a newer version after its generation committed shows both.",
    )


#: Flattened form of a manifest used by the SQL ``stages`` view.
STAGE_VIEW_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("stage", pa.int32()),
        pa.field("status", pa.string()),
        pa.field("created_at", pa.timestamp("us", tz="UTC")),
        pa.field("num_files", pa.int32()),
        pa.field("counts", pa.map_(pa.string(), pa.int64())),
        pa.field("metrics", pa.map_(pa.string(), pa.float64())),
        pa.field("t_gen", pa.float64()),
        pa.field("t_train", pa.float64()),
        pa.field("t_eval", pa.float64()),
        pa.field("t_switch", pa.float64()),
        pa.field("t_total", pa.float64()),
        pa.field("t_sync", pa.float64()),
        pa.field("t_next_gen", pa.float64()),  # the next stage's generation started in this stage (overlap)
        pa.field("t_overlap", pa.float64()),  # of it, seconds beside this stage's checkpoint write (hidden)
        pa.field("code_version", pa.string()),  # the code that committed the stage; NULL in older manifests
        pa.field("job_code_versions", pa.map_(pa.string(), pa.string())),  # job -> the code that committed it
        pa.field("inherited_from", pa.string()),  # a fork's stage below its fork stage: the parent run that holds it
    ]
)
