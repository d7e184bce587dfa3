"""``runs`` and ``lineage``: one row per run each, from its ``run.json`` (read once for both).

- ``runs``: ``run.json`` fields (NULL when it is absent) and counts of committed stages and files (:data:`RUNS_SCHEMA`;
  ``config`` is exposed as DuckDB JSON).
- ``lineage``: a fork's parent, fork stage and changed keys (:mod:`mugrpo.sql.lineage`; NULL for a run of its own).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pyarrow as pa
from pydantic import TypeAdapter, ValidationError

from mugrpo.sql.discover import TargetError
from mugrpo.sql.lineage import lineage_rows
from mugrpo.sql.views.base import Build

NAMES = ("runs", "lineage")

#: One row per run (the ``runs`` view; ``config`` is exposed as DuckDB JSON).
RUNS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("uri", pa.string()),  # the run folder's URL (no credentials)
        pa.field("created_at", pa.timestamp("us", tz="UTC")),  # run.json "created_at"
        pa.field("code_version", pa.string()),  # run.json "code_version"
        pa.field("config", pa.string()),  # run.json "config" (else the whole document), JSON text
        pa.field("stages_committed", pa.int32()),  # stage manifests present
        pa.field("last_stage", pa.int32()),  # highest committed stage, NULL if none
        pa.field("rollout_files", pa.int32()),
        pa.field("train_step_files", pa.int32()),
        pa.field("eval_files", pa.int32()),
    ]
)

_datetime = TypeAdapter(datetime | None)


def create(build: Build) -> None:
    tgt = build.target
    docs = _run_docs(build)
    runs = build.register("runs", _run_rows(build, docs))
    build.view("runs", f"SELECT * REPLACE (config::JSON AS config) FROM {runs}")
    try:
        family = lineage_rows(docs, {r: tgt.store.uri(f.run_json or r) for r, f in tgt.runs.items()})
    except ValueError as e:
        raise TargetError(str(e)) from None
    build.view("lineage", f"SELECT * FROM {build.register('lineage', family)}")


def _run_docs(build: Build) -> dict[str, dict[str, Any]]:
    """Run id -> its parsed run.json (``{}`` when absent), for the ``runs`` and ``lineage`` views."""
    target = build.target
    run_json = build.read_all([f.run_json for f in target.runs.values() if f.run_json])
    docs: dict[str, dict[str, Any]] = {}
    for run_id, files in target.runs.items():
        docs[run_id] = {}
        if files.run_json:
            try:
                docs[run_id] = json.loads(run_json[files.run_json])
                _datetime.validate_python(docs[run_id].get("created_at"))
            except (json.JSONDecodeError, AttributeError, ValidationError) as e:
                raise TargetError(
                    f"{target.store.uri(files.run_json)} is not a valid run.json (a JSON object with an ISO "
                    f"created_at): {e}"
                ) from None
    return docs


def _run_rows(build: Build, docs: dict[str, dict[str, Any]]) -> pa.Table:
    rows = []
    for run_id, files in build.target.runs.items():
        doc = docs[run_id]
        created_at = _datetime.validate_python(doc.get("created_at"))
        code_version = doc.get("code_version")
        config = doc.get("config", doc) if doc else None
        stages = sorted(files.manifests)
        rows.append(
            {
                "run_id": run_id,
                "uri": build.target.store.uri(run_id),
                "created_at": created_at,
                "code_version": None if code_version is None else str(code_version),
                "config": None if config is None else json.dumps(config, sort_keys=True),
                "stages_committed": len(stages),
                "last_stage": stages[-1] if stages else None,
                "rollout_files": len(files.tables["rollouts"]),
                "train_step_files": len(files.tables["train_steps"]),
                "eval_files": len(files.tables["evals"]),
            }
        )
    return pa.Table.from_pylist(rows, schema=RUNS_SCHEMA)
