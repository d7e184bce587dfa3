"""The ``train_steps`` table: one row per optimizer update, written in parts aligned with checkpoints.

The rows of updates (n_prev, n] go to ``train_steps/stage=k/part-{n}.parquet`` just before the checkpoint of
update n is committed (:func:`mugrpo.commits.tables.write_part`). A resume restarts after the latest committed
checkpoint, so it rewrites at most the one part whose checkpoint never got its marker (same updates, same metrics; only
timings differ) and no row is ever duplicated.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from mugrpo.commits.tables import delete_parts_after as delete_table_parts_after
from mugrpo.commits.tables import read_parts, write_part
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import TRAIN_STEP_SCHEMA, FileRecord
from schemas.tables import TRAIN_STEP_V3_COLUMNS, TRAIN_STEP_V4_COLUMNS

#: Loss metrics copied into a row (the other TRAIN_STEP_SCHEMA columns are filled by the trainer).
LOSS_METRIC_COLUMNS = [
    "policy_loss",
    "loss",
    "clip_frac_low",
    "clip_frac_high",
    "veto_token_frac",
    "veto_response_frac",
    "trigger_count",
    "ratio_mean",
    "ratio_max",
    "ratio_mean_neg_adv",
    "approx_kl_behavior",
    "kl_ref",
    "entropy",
]


def train_step_row(
    *,
    run_id: str,
    stage: int,
    stage_update: int,
    policy_version: int,
    metrics: dict[str, float],
    grad_norm: float,
    lr: float,
    num_sequences: int,
    num_tokens: int,
    seconds: float,
    staleness: int,
    mean_reward: float | None,
    columns: Mapping[str, Any] | None = None,
    health: Mapping[str, Any] | None = None,
) -> dict:
    """One ``train_steps`` row. Loss metrics missing from ``metrics`` (e.g. kl_ref without a KL term) are null; the
    loss's other metrics go to the ``loss_metrics`` map. ``columns`` holds the values algorithms filled
    (:meth:`mugrpo.algorithms.training.TrainHooks.after_update`) of the columns the trainer does not fill itself
    (``schemas.tables.TRAIN_STEP_V3_COLUMNS``); the others are null. ``health`` holds the update's health panel
    (``schemas.tables.TRAIN_STEP_V4_COLUMNS``, :mod:`mugrpo.trainer.health`); a missing one is null.

    Raises:
        KeyError: ``columns`` names a column outside ``TRAIN_STEP_V3_COLUMNS``, or ``health`` one outside
            ``TRAIN_STEP_V4_COLUMNS``.
    """
    row = {
        "run_id": run_id,
        "stage": stage,
        "update": policy_version + stage_update,
        "stage_update": stage_update,
        "grad_norm": grad_norm,
        "lr": lr,
        "num_sequences": num_sequences,
        "num_tokens": num_tokens,
        "seconds": seconds,
        "tokens_per_second": num_tokens / seconds if seconds > 0 else 0.0,
        "staleness": staleness,
        "mean_reward": mean_reward,
        "created_at": datetime.now(UTC),
    }
    row.update({name: metrics.get(name) for name in LOSS_METRIC_COLUMNS})
    row["loss_metrics"] = {k: float(v) for k, v in sorted(metrics.items()) if k not in LOSS_METRIC_COLUMNS}
    columns = columns or {}
    unknown = set(columns) - set(TRAIN_STEP_V3_COLUMNS)
    if unknown:
        raise KeyError(f"not train_steps columns an algorithm fills: {sorted(unknown)}")
    row.update({name: columns.get(name) for name in TRAIN_STEP_V3_COLUMNS})
    health = health or {}
    unknown = set(health) - set(TRAIN_STEP_V4_COLUMNS)
    if unknown:
        raise KeyError(f"not health panel columns of train_steps: {sorted(unknown)}")
    row.update({name: health.get(name) for name in TRAIN_STEP_V4_COLUMNS})
    missing = [f.name for f in TRAIN_STEP_SCHEMA if f.name not in row]
    if missing:  # the schema gained a column this module does not fill
        raise KeyError(f"train_steps columns not filled: {missing}")
    return row


def write_steps_part(store: Store, layout: RunLayout, stage: int, part: int, rows: list[dict]) -> FileRecord:
    """Write ``rows`` as part ``part`` (the stage update of the checkpoint it belongs to), atomically."""
    return write_part(store, layout, "train_steps", stage, part, rows)


def delete_parts_after(store: Store, layout: RunLayout, stage: int, step: int) -> list[int]:
    """Delete parts of updates after ``step`` (left by a run killed before their checkpoint committed)."""
    return delete_table_parts_after(store, layout, "train_steps", stage, step)


def read_steps(store: Store, layout: RunLayout, stage: int) -> tuple[pa.Table, list[FileRecord]]:
    """All committed rows of a stage (ordered by update) and a FileRecord (with sha256) for each part."""
    tables, records = read_parts(store, layout, "train_steps", stage)
    if not tables:
        return TRAIN_STEP_SCHEMA.empty_table(), records
    return pa.concat_tables(tables).sort_by("stage_update"), records
