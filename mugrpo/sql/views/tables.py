"""``rollouts``, ``train_steps``, ``evals``, ``replay`` (every table of ``schemas.TABLES``): the Parquet files as
written (``schemas.tables``), read with Hive partitioning so ``stage`` is an INTEGER column; token lists stay
``INTEGER[]``/``FLOAT[]`` lists.

- ``replay``: with the replay buffer on (``replay.enabled``), one row per rollout used by an update, fresh or replayed
  (``schemas.tables.REPLAY_SCHEMA``): which rollout was used by which update, at what age.

A view over a table with no file yet is empty but has the table's columns, so queries never fail for lack of data.
"""

from __future__ import annotations

import pyarrow as pa

from mugrpo.sql.discover import TABLE_FILES
from mugrpo.sql.readonly import PROTOCOL, sql_string
from mugrpo.sql.views.base import Build
from schemas import OLDER_DEFAULTS, OLDER_SCHEMAS, TABLES

NAMES = tuple(TABLE_FILES)

_DUCKDB_TYPES = {pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE"}


def create(build: Build) -> None:
    for table in TABLE_FILES:
        paths = [p for files in build.target.runs.values() for p in files.tables[table] if p not in build.left_out]
        empty = build.register(f"empty_{table}", TABLES[table].empty_table())
        source = _parquet_source(paths, table) if paths else empty
        if paths and _has_older_versions(table):  # files of older versions only: still the current columns
            source = f"(SELECT * FROM {empty} UNION ALL BY NAME SELECT * FROM {source})"
            source = _with_older_defaults(source, table)
        build.view(table, f"SELECT * FROM {source}")


def _parquet_source(paths: list[str], table: str) -> str:
    files = ", ".join(sql_string(f"{PROTOCOL}://{p}") for p in paths)
    # The files also hold a `stage` column; Hive partitioning types the folder's value the same way. A table with
    # readable older versions (schemas.OLDER_SCHEMAS) is read by column name, so an older file's missing columns are
    # NULL; that reads every file's footer when the view is created, so only those tables pay for it.
    by_name = ", union_by_name = true" if _has_older_versions(table) else ""
    return f"read_parquet([{files}], hive_partitioning = true, hive_types = {{'stage': INTEGER}}{by_name})"


def _has_older_versions(table: str) -> bool:
    return any(t == table for t, _ in OLDER_SCHEMAS)


def _with_older_defaults(source: str, table: str) -> str:
    """``source`` with the columns older files lack filled as mugrpo's own reader fills them
    (``schemas.OLDER_DEFAULTS``: v1 rollouts' ``top_k`` / ``min_p`` are 0, off), so ``mugrpo sql`` and
    :func:`mugrpo.commits.tables.read_table` agree. Current files hold no NULL there (the columns are not nullable)."""
    fills = [
        f"coalesce({col}, CAST({value!r} AS {_DUCKDB_TYPES[TABLES[table].field(col).type]})) AS {col}"
        for (name, col), value in OLDER_DEFAULTS.items()
        if name == table
    ]
    return f"(SELECT * REPLACE ({', '.join(fills)}) FROM {source})" if fills else source
