"""The ``lineage`` view: one row per run, its parent and fork stage when it is a fork (``mugrpo fork``).

Built from each run's ``run.json`` like the ``runs`` view: a fork's run.json holds a ``lineage`` block (parent run
id, fork stage K, the parent's config sha256, the changed keys, the fork's options); a run of its own has none, so
its parent columns are NULL.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pyarrow as pa
from pydantic import TypeAdapter, ValidationError

from mugrpo.config_keys import ConfigChange

#: One row per run (the ``lineage`` view).
LINEAGE_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("parent_run_id", pa.string()),  # NULL: a run of its own
        pa.field("fork_stage", pa.int32()),  # K: the first stage the fork computed itself; NULL for a root run
        pa.field("reuse_rollouts", pa.bool_()),
        pa.field("fresh_optimizer", pa.bool_()),
        pa.field("eval_inherited", pa.bool_()),  # the fork took the parent's evaluation of the policy of stage K
        pa.field("parent_config_sha256", pa.string()),
        pa.field("changed_keys", pa.list_(pa.string())),  # 'key: from -> to', values as JSON
        pa.field("created_at", pa.timestamp("us", tz="UTC")),  # when forked (lineage), else run.json's created_at
    ]
)

_datetime = TypeAdapter(datetime | None)


def change_lines(lineage: dict[str, Any], sep: str = ": ") -> list[str]:
    """The changed keys of a ``lineage`` block as ``key: from -> to`` lines (values as JSON, as config changes are
    printed on resume); ``sep`` is what follows the key.

    Raises:
        KeyError: a change without ``key``.
    """
    return [
        ConfigChange(c["key"], c.get("from"), c.get("to"), c.get("class", "")).line().replace(": ", sep, 1)
        for c in lineage.get("changed_keys") or []
    ]


def lineage_rows(docs: dict[str, dict[str, Any]], where: dict[str, str]) -> pa.Table:
    """The ``lineage`` view's rows, one per run.

    Args:
        docs: run id -> its parsed run.json (``{}`` when the run has none).
        where: run id -> the run.json's URI, for error messages.

    Raises:
        ValueError: a run.json whose ``lineage`` block is not an object with a parent run id and an integer stage,
            or has an invalid ``created_at``.
    """
    rows = []
    for run_id, doc in docs.items():
        row: dict[str, Any] = {"run_id": run_id, "changed_keys": None, "created_at": doc.get("created_at")}
        lineage = doc.get("lineage")
        try:
            if lineage is not None:
                row.update(
                    parent_run_id=str(lineage["parent_run_id"]),
                    fork_stage=int(lineage["stage"]),
                    reuse_rollouts=bool(lineage.get("reuse_rollouts", False)),
                    fresh_optimizer=bool(lineage.get("fresh_optimizer", False)),
                    eval_inherited=bool(lineage.get("eval_inherited", False)),
                    parent_config_sha256=lineage.get("parent_config_sha256"),
                    changed_keys=change_lines(lineage),
                    created_at=lineage.get("created_at") or doc.get("created_at"),
                )
            row["created_at"] = _datetime.validate_python(row["created_at"])
        except (KeyError, TypeError, ValueError, AttributeError, ValidationError) as e:
            raise ValueError(
                f"{where.get(run_id, run_id)} has an invalid lineage block (a fork's parent_run_id, stage, "
                f"changed_keys and ISO created_at): {e!r}"
            ) from None
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=LINEAGE_SCHEMA)
