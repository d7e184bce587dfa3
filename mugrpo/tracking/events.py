"""Committed run data -> tracker events, after a :class:`~mugrpo.tracking.base.Cursor`.

Only committed data becomes an event, so what a tracker shows never disagrees with the store and is never taken
back: train-step rows up to the stage's latest committed checkpoint (or all of them once the train job committed),
and a stage's summary once its manifest (the stage's commit point) exists. The order is the run's own order (stage
k's updates, then stage k's summary, then stage k+1's updates, ...; the final evaluation last), so every tracker
sees monotone steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import pyarrow.parquet as pq

from mugrpo.commits.exclusion import training_rows
from mugrpo.commits.manifest import latest_checkpoint, read_job_manifest, read_manifest
from mugrpo.commits.tables import part_numbers, read_table
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.tracking.base import STAGE_CURSOR_KEY, TRAIN_CURSOR_KEY, Cursor, Event

#: train_steps columns that are bookkeeping, not metrics.
_NOT_METRICS = {"run_id", "stage", "update", "created_at"}
#: Rollout columns shown in a stage's sample table (the response cut to ``_TEXT_CHARS`` characters).
SAMPLE_COLUMNS = ["prompt_id", "sample_idx", "reward", "advantage", "num_tokens", "extracted_answer", "ground_truth"]
_TEXT_CHARS = 500


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def committed_train_events(store: Store, layout: RunLayout, stage: int, after_update: int) -> list[Event]:
    """Train events of ``stage`` with global update > ``after_update``, from committed train_steps parts only."""
    done = read_job_manifest(store, layout.run_id, stage, "train") is not None
    limit = None if done else latest_checkpoint(store, layout, stage)
    if not done and limit is None:
        return []
    events = []
    for part in part_numbers(store, layout, "train_steps", stage):
        if limit is not None and part > limit:
            continue  # written before a checkpoint that never committed: not part of the run (yet)
        for row in read_table(store, layout.train_steps_part(stage, part), "train_steps").to_pylist():
            if row["update"] <= after_update:
                continue
            extra = dict(row.pop("loss_metrics", None) or [])  # v2: loss metrics without a column of their own
            values = {
                f"train/{k}": float(v) for k, v in {**row, **extra}.items() if k not in _NOT_METRICS and _finite(v)
            }
            values["train/stage"] = float(stage)
            values[TRAIN_CURSOR_KEY] = float(row["update"])  # the cursor key goes last
            events.append(Event("train", int(row["update"]), values, stage=stage))
    return sorted(events, key=lambda e: e.step)


def rollout_sample(
    store: Store, layout: RunLayout, stage: int, rows: int, excluding: Sequence[str] = ()
) -> tuple[list[str], list[list]] | None:
    """The first ``rows`` rollouts trained on of the stage (by shard, then prompt_id, sample_idx), or None if none;
    rows where an ``excluding`` column is true were not trained on and are left out
    (:func:`mugrpo.commits.exclusion.training_rows`). Shards are read in order until ``rows`` are found."""
    if rows <= 0:
        return None
    shards = sorted(n for n in store.listdir(layout.rollouts_dir(stage)) if n.endswith(".parquet"))
    columns = [*SAMPLE_COLUMNS, "response_text"]
    data: list[list] = []
    for name in shards:
        with store.fs.open(store.full(f"{layout.rollouts_dir(stage)}/{name}"), "rb") as f:
            table = training_rows(pq.read_table(f), excluding)
        table = table.select(columns).sort_by([("prompt_id", "ascending"), ("sample_idx", "ascending")])
        for r in table.slice(0, rows - len(data)).to_pylist():
            data.append([r[c] if c != "response_text" else r[c][:_TEXT_CHARS] for c in columns])
        if len(data) >= rows:
            break
    return (columns, data) if data else None


def stage_event(
    store: Store, layout: RunLayout, stage: int, step: int, sample_rows: int, excluding: Sequence[str] = ()
) -> Event | None:
    """The summary of committed stage ``stage``: T_gen..T_total, counts, generate/train/eval metrics; or None."""
    m = read_manifest(store, layout.run_id, stage)
    if m is None:
        return None
    values: dict[str, float] = {f"stage/{k}": float(v) for k, v in m.timings.model_dump().items()}
    for key, v in sorted({**m.counts, **m.metrics}.items()):
        if not _finite(v):
            continue
        job, _, name = key.partition("/")
        values[f"eval/{name}" if job == "eval" else f"stage/{key}"] = float(v)
    values[STAGE_CURSOR_KEY] = float(stage)
    return Event("stage", step, values, rollout_sample(store, layout, stage, sample_rows, excluding), stage=stage)


def final_eval_event(store: Store, layout: RunLayout, num_stages: int, step: int) -> Event | None:
    """The evaluation of the final policy (eval job of stage ``num_stages``) as a stage event, or None."""
    m = read_job_manifest(store, layout.run_id, num_stages, "eval")
    if m is None:
        return None
    values = {f"eval/{k}": float(v) for k, v in sorted(m.metrics.items()) if _finite(v)}
    values[STAGE_CURSOR_KEY] = float(num_stages)
    return Event("stage", step, values, stage=num_stages)


def pending_events(
    store: Store, run_id: str, num_stages: int, cursor: Cursor, sample_rows: int = 8, excluding: Sequence[str] = ()
) -> Iterator[Event]:
    """Every committed event after ``cursor``, in run order (see the module docstring); ``excluding``: the run's
    excluding columns (:func:`mugrpo.algorithms.excluding_columns`), whose rows the rollout samples leave out.

    Stages before ``cursor.stage`` are skipped without reading their train_steps (their updates were logged before
    their summary), so a poll costs one stage's files.
    """
    layout = RunLayout(run_id)
    step = 0
    for stage in range(num_stages):
        m = read_manifest(store, run_id, stage)
        if stage <= cursor.stage and m is not None:
            step = int(m.counts.get("train/policy_version", step))
            continue
        train = committed_train_events(store, layout, stage, cursor.train_update)
        yield from train
        if m is None:
            return  # later stages cannot have committed anything yet
        step = int(m.counts.get("train/policy_version", train[-1].step if train else step))
        event = stage_event(store, layout, stage, step, sample_rows, excluding)
        if event is not None:
            yield event
    if cursor.stage < num_stages:
        final = final_eval_event(store, layout, num_stages, step)
        if final is not None:
            yield final
