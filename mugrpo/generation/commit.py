"""The commits of a stage's generation: each worker's manifest (its shards with their sha256), then the stage's
generate manifest once every worker has committed (:mod:`mugrpo.coordination.fanout`)."""

from __future__ import annotations

import io
import time
from datetime import UTC, datetime

import numpy as np
import pyarrow.parquet as pq

from mugrpo.algorithms import declared_columns, excluded, excluding_columns
from mugrpo.commits.manifest import write_job_manifest
from mugrpo.commits.tables import read_table
from mugrpo.common.progress import console
from mugrpo.coordination.fanout import commit_when_all_committed, slowest_timings, worker_job
from mugrpo.generation.spec import GenerateSpec, GenerationError
from mugrpo.provenance.prompt_plan import check_rollouts_follow_plan
from mugrpo.storage.store import Store, sha256_bytes
from schemas import FileRecord, JobManifest

#: Rollout columns the generate manifest summarizes.
_SUMMARY_COLUMNS = [
    "prompt_id",
    "reward",
    "reward_components",
    "zero_variance",
    "num_tokens",
    "finish_reason",
    "temperature",
    "reward_status",
]


def commit_worker(
    spec: GenerateSpec,
    store: Store,
    mine: list[int],
    counts: dict[str, int],
    metrics: dict[str, float],
    timings: dict[str, float],
    origin: float,
) -> JobManifest:
    """Write worker ``spec.worker``'s manifest: the shards it owns with their sha256, its new tokens, the
    algorithms' state (``metrics``) and its timings (``switch``, ``gen``; the total counts from ``origin``). It is
    the worker's commit point (:mod:`mugrpo.coordination.fanout`).

    Raises:
        GenerationError: a shard is not a readable Parquet file (names it; delete it and re-run the worker).
    """
    layout = spec.layout
    files = []
    for s in mine:
        rel = layout.rollout_shard(spec.stage, s)
        data = store.read_bytes(rel)
        try:
            rows = pq.ParquetFile(io.BytesIO(data)).metadata.num_rows
        except Exception as e:  # pyarrow raises ArrowInvalid (a ValueError) and OSError on a broken file
            raise GenerationError(
                f"{store.uri(rel)} (shard {s} of worker {spec.worker}) is not a readable Parquet file "
                f"({type(e).__name__}: {e}); delete it and re-run the worker to re-sample that shard"
            ) from e
        files.append(FileRecord(path=layout.rel(rel), sha256=sha256_bytes(data), bytes=len(data), rows=rows))
    manifest = JobManifest(
        run_id=spec.run_id,
        stage=spec.stage,
        job=worker_job("generate", spec.worker, spec.workers),
        created_at=datetime.now(UTC),
        files=files,
        counts=counts,
        metrics=metrics,
        timings={**timings, "total": time.monotonic() - origin},
    )
    write_job_manifest(store, manifest)
    return manifest


def commit_generation(spec: GenerateSpec) -> JobManifest | None:
    """Write the stage's generate manifest from its worker manifests (the generation commit), or return None
    while a worker has not committed. Idempotent: an existing generate manifest is returned as is.

    Every shard is read back through its worker manifest (sha256 checked). Rows a declared ``excludes`` column
    marks (:func:`mugrpo.algorithms.excluded`: AGPO's planning groups, groups dynamic sampling filtered out) are
    counted apart: ``rows``/``prompts`` and the reward metrics are over training rows; ``excluded_rows`` /
    ``excluded_tokens`` count the others, ``tokens`` is every generated token (excluded rows included, the token
    budget), and the workers' metrics (the algorithms' state at their commit) are carried over. Timings are the
    slowest worker's (the workers ran in parallel); ``tokens_per_second`` is the tokens sampled by this launch of
    the workers over that time.

    Raises:
        mugrpo.storage.store.ChecksumError: a shard changed after its worker committed it.
        GenerationError: the worker manifests do not list every shard of the stage.
    """
    store = spec.store()
    return commit_when_all_committed(
        store, spec.run_id, spec.stage, "generate", spec.workers, lambda parts: _generation_manifest(spec, store, parts)
    )


def _committed_rows(spec: GenerateSpec, store: Store, files: list[FileRecord]) -> list[dict]:
    """The summarized columns of every row of ``files`` (each verified against its sha256)."""
    layout = spec.layout
    fields = [c.field for c in declared_columns()]
    columns = _SUMMARY_COLUMNS + [f.name for f in fields]
    rows = []
    for rec in files:
        table = read_table(store, layout.abs(rec.path), "rollouts", expected_sha256=rec.sha256, extra=fields)
        rows.extend(table.select(columns).to_pylist())
    return rows


def _generation_manifest(spec: GenerateSpec, store: Store, parts: list[JobManifest]) -> JobManifest:
    """The stage's generate manifest from its committed worker manifests (see :func:`commit_generation`)."""
    files = sorted((f for p in parts for f in p.files), key=lambda f: f.path)
    all_rows = _committed_rows(spec, store, files)
    check_rollouts_follow_plan(store, spec.run_id, spec.stage, (r["prompt_id"] for r in all_rows))
    excluding = excluding_columns()
    excluded_rows = [r for r in all_rows if excluded(r, excluding)]
    train_rows = [r for r in all_rows if not excluded(r, excluding)]
    metrics = _summary(train_rows)
    t_gen = max(p.timings.get("gen", 0.0) for p in parts)
    tokens = sum(p.counts.get("new_tokens", 0) for p in parts)
    if t_gen > 0:
        metrics["tokens_per_second"] = tokens / t_gen
    if excluded_rows:
        metrics["excluded_mean_reward"] = float(np.mean([r["reward"] for r in excluded_rows]))
        metrics["mean_temperature"] = float(np.mean([r["temperature"] for r in train_rows]))
    for p in parts:  # the algorithms' state at each worker's commit
        metrics.update(p.metrics)
    excluded_tokens = sum(r["num_tokens"] for r in excluded_rows)
    first = parts[0].counts
    counts = {
        "rows": len(train_rows),
        "prompts": len({r["prompt_id"] for r in train_rows}),
        "shards": first["shards"],
        "tokens": excluded_tokens + sum(r["num_tokens"] for r in train_rows),
        "excluded_rows": len(excluded_rows),
        "excluded_tokens": excluded_tokens,
        "zero_variance_groups": len({r["prompt_id"] for r in train_rows if r["zero_variance"]}),
        "dataset_rows": first["dataset_rows"],
        "workers": spec.workers,
        # rows scored 0 because the verifier timed out / raised (reward_status), not because they were wrong
        "reward_timeouts": sum(r["reward_status"] == "timeout" for r in train_rows),
        "reward_errors": sum(r["reward_status"].startswith("error") for r in train_rows),
        **{k: v for k, v in first.items() if k.startswith("skipped_")},
    }
    if len(files) != counts["shards"]:
        raise GenerationError(
            f"stage {spec.stage}: the {spec.workers} worker manifests list {len(files)} shards, the stage has "
            f"{counts['shards']}"
        )
    manifest = JobManifest(
        run_id=spec.run_id,
        stage=spec.stage,
        job="generate",
        created_at=datetime.now(UTC),
        files=files,
        counts=counts,
        metrics=metrics,
        timings=slowest_timings(parts, ("switch", "gen", "total")),
    )
    _print_commit(spec, counts, metrics)
    return manifest


def _print_commit(spec: GenerateSpec, counts: dict, metrics: dict) -> None:
    tps = f"{metrics['tokens_per_second']:.0f} tok/s" if "tokens_per_second" in metrics else "no new tokens"
    console.print(
        f"generate stage {spec.stage}: {counts['rows']} rows from {spec.workers} worker(s), mean reward "
        f"{metrics['mean_reward']:.3f}, zero-variance groups {counts['zero_variance_groups']}/{counts['prompts']}, "
        f"{tps}"
    )


def _summary(rows: list[dict]) -> dict[str, float]:
    if not rows:
        return {"mean_reward": 0.0}
    rewards = np.array([r["reward"] for r in rows])
    groups: dict[str, bool] = {}
    for r in rows:
        groups[r["prompt_id"]] = r["zero_variance"]
    metrics = {
        "mean_reward": float(rewards.mean()),
        "zero_variance_group_frac": float(np.mean(list(groups.values()))),
        "mean_response_tokens": float(np.mean([r["num_tokens"] for r in rows])),
        "length_finish_frac": float(np.mean([r["finish_reason"] == "length" for r in rows])),
    }
    components = [dict(r["reward_components"]) for r in rows]  # Arrow maps read back as (key, value) pairs
    for name in components[0]:
        metrics[f"mean_{name}"] = float(np.mean([c[name] for c in components]))
    return metrics
