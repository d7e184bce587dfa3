"""The ``train_steps`` table: one row per optimizer update, written in parts aligned with checkpoints.

The rows of updates (n_prev, n] go to ``train_steps/stage=k/part-{n}.parquet`` just before the checkpoint of
update n is committed. A resume restarts after the latest committed checkpoint, so it rewrites at most the one part
whose checkpoint never got its marker (same updates, same metrics; only timings differ) and no row is ever
duplicated.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pyarrow as pa

from mugrpo.layout import RunLayout
from mugrpo.storage import Store, sha256_bytes
from mugrpo.tables import read_table, table_from_rows, write_table
from schemas import TRAIN_STEP_SCHEMA, FileRecord
from schemas.tables import TRAIN_STEP_V3_COLUMNS

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
    replay: dict[str, float | int | None] | None = None,
) -> dict:
    """One ``train_steps`` row. Loss metrics missing from ``metrics`` (e.g. kl_ref without a KL term) are null; the
    loss's other metrics (e.g. ConSPO's ``conspo_*``) go to the ``loss_metrics`` map. ``replay`` holds the replay
    columns (``schemas.tables.TRAIN_STEP_V3_COLUMNS``: fresh/replayed counts, ages, buffer size, evictions); they
    are null without it (replay off)."""
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
    replay = replay or {}
    unknown = set(replay) - set(TRAIN_STEP_V3_COLUMNS)
    if unknown:
        raise KeyError(f"not train_steps replay columns: {sorted(unknown)}")
    row.update({name: replay.get(name) for name in TRAIN_STEP_V3_COLUMNS})
    missing = [f.name for f in TRAIN_STEP_SCHEMA if f.name not in row]
    if missing:  # the schema gained a column this module does not fill
        raise KeyError(f"train_steps columns not filled: {missing}")
    return row


def write_steps_part(store: Store, layout: RunLayout, stage: int, part: int, rows: list[dict]) -> FileRecord:
    """Write ``rows`` as part ``part`` (the stage update of the checkpoint it belongs to), atomically."""
    rel = layout.train_steps_part(stage, part)
    return write_table(store, rel, table_from_rows(rows, "train_steps"), "train_steps", run_rel=layout.rel(rel))


def part_numbers(store: Store, layout: RunLayout, stage: int) -> list[int]:
    """Sorted part numbers present under ``train_steps/stage=k``."""
    parts = []
    for name in store.listdir(layout.train_steps_dir(stage)):
        m = re.fullmatch(r"part-(\d{5,})\.parquet", name)
        if m:
            parts.append(int(m.group(1)))
    return sorted(parts)


def delete_parts_after(store: Store, layout: RunLayout, stage: int, step: int) -> list[int]:
    """Delete parts of updates after ``step`` (left by a run killed before their checkpoint committed)."""
    doomed = [p for p in part_numbers(store, layout, stage) if p > step]
    for part in doomed:
        store.delete(layout.train_steps_part(stage, part))
    return doomed


def read_steps(store: Store, layout: RunLayout, stage: int) -> tuple[pa.Table, list[FileRecord]]:
    """All committed rows of a stage (ordered by update) and a FileRecord (with sha256) for each part."""
    tables, records = [], []
    for part in part_numbers(store, layout, stage):
        rel = layout.train_steps_part(stage, part)
        data = store.read_bytes(rel)
        digest = sha256_bytes(data)
        table = read_table(store, rel, "train_steps", expected_sha256=digest)
        tables.append(table)
        records.append(FileRecord(path=layout.rel(rel), sha256=digest, bytes=len(data), rows=table.num_rows))
    if not tables:
        return TRAIN_STEP_SCHEMA.empty_table(), records
    return pa.concat_tables(tables).sort_by("stage_update"), records


def write_replay_part(store: Store, layout: RunLayout, stage: int, part: int, rows: list[dict]) -> FileRecord:
    """Write the ``replay`` audit rows of the updates up to ``part`` (a checkpoint's stage update), atomically."""
    rel = layout.replay_part(stage, part)
    return write_table(store, rel, table_from_rows(rows, "replay"), "replay", run_rel=layout.rel(rel))


def _replay_part_numbers(store: Store, layout: RunLayout, stage: int) -> list[int]:
    parts = []
    for name in store.listdir(layout.replay_dir(stage)):
        m = re.fullmatch(r"part-(\d{5,})\.parquet", name)
        if m:
            parts.append(int(m.group(1)))
    return sorted(parts)


def delete_replay_parts_after(store: Store, layout: RunLayout, stage: int, step: int) -> list[int]:
    """Delete ``replay`` parts of updates after ``step`` (left by a run killed before their checkpoint)."""
    doomed = [p for p in _replay_part_numbers(store, layout, stage) if p > step]
    for part in doomed:
        store.delete(layout.replay_part(stage, part))
    return doomed


def replay_part_records(store: Store, layout: RunLayout, stage: int) -> list[FileRecord]:
    """A FileRecord (with sha256, verified as a ``replay`` table) for each committed ``replay`` part of a stage."""
    records = []
    for part in _replay_part_numbers(store, layout, stage):
        rel = layout.replay_part(stage, part)
        data = store.read_bytes(rel)
        digest = sha256_bytes(data)
        table = read_table(store, rel, "replay", expected_sha256=digest)
        records.append(FileRecord(path=layout.rel(rel), sha256=digest, bytes=len(data), rows=table.num_rows))
    return records
