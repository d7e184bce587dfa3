"""Reading and writing mugrpo's Parquet tables with schema-version checks (schemas live in ``schemas/``)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from mugrpo.storage import Store
from schemas import META_TABLE, META_VERSION, SCHEMA_VERSIONS, TABLES, FileRecord


class SchemaError(ValueError):
    """A Parquet file does not carry the expected mugrpo table, schema or version."""


def _stamp(table: pa.Table, name: str) -> pa.Table:
    expected = TABLES[name]
    try:
        table = table.select(expected.names).cast(expected)
    except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise SchemaError(f"table does not match the {name!r} schema: {e}") from e
    meta = {META_TABLE: name.encode(), META_VERSION: str(SCHEMA_VERSIONS[name]).encode()}
    return table.replace_schema_metadata(meta)


def table_from_rows(rows: list[dict], name: str) -> pa.Table:
    """Build a table of schema ``name`` from row dicts. Raises SchemaError naming the table on a bad row."""
    try:
        return pa.Table.from_pylist(rows, schema=TABLES[name])
    except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise SchemaError(f"rows do not fit the {name!r} schema: {e}") from e


def write_table(store: Store, rel: str, table: pa.Table, name: str, *, run_rel: str | None = None) -> FileRecord:
    """Validate ``table`` against schema ``name``, stamp the version, and write it atomically at ``rel``.

    Args:
        run_rel: the path recorded in the returned FileRecord (relative to the run dir); defaults to ``rel``.

    Raises:
        SchemaError: a column is missing or cannot be cast to the schema's type.
    """
    if name not in TABLES:
        raise SchemaError(f"unknown table {name!r}; known tables: {sorted(TABLES)}")
    table = _stamp(table, name)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    data = buf.getvalue()
    digest = store.write_bytes(rel, data)
    return FileRecord(path=run_rel or rel, sha256=digest, bytes=len(data), rows=table.num_rows)


def _rollouts_v1_to_v2(table: pa.Table) -> pa.Table:
    """Rollouts v1 had no ``top_k`` / ``min_p``: v1 engines never applied them, so 0 (off) is exact."""
    rows = table.num_rows
    table = table.append_column(pa.field("top_k", pa.int32(), nullable=False), pa.array([0] * rows, pa.int32()))
    return table.append_column(pa.field("min_p", pa.float32(), nullable=False), pa.array([0.0] * rows, pa.float32()))


#: Older versions a reader still accepts: (table, version) -> upgrade of a table read at that version to the next.
UPGRADES = {("rollouts", 1): _rollouts_v1_to_v2}


def check_schema(schema: pa.Schema, name: str, where: str) -> None:
    """Raise SchemaError unless ``schema``'s metadata says table ``name`` at the current or an upgradable version."""
    meta = schema.metadata or {}
    table = meta.get(META_TABLE, b"").decode()
    version = meta.get(META_VERSION, b"").decode()
    if table != name:
        raise SchemaError(f"{where}: expected a mugrpo {name!r} table, file says {table or 'nothing'!r}")
    expected = SCHEMA_VERSIONS[name]
    if version != str(expected) and not (version.isdigit() and (name, int(version)) in UPGRADES):
        raise SchemaError(
            f"{where}: {name!r} schema version {version or 'missing'!r} is not supported "
            f"(this mugrpo reads version {expected}); re-generate the file or use a matching mugrpo version"
        )


def read_table(store: Store, rel: str, name: str, *, expected_sha256: str | None = None) -> pa.Table:
    """Read a Parquet table written by :func:`write_table`, checking table name, version and (optionally) sha256.

    A file at an older version listed in :data:`UPGRADES` is brought to the current schema (added columns get
    the values that the older writer implied).

    Raises:
        SchemaError: wrong table, unknown version, or columns that differ from the schema.
        mugrpo.storage.ChecksumError: bytes differ from ``expected_sha256``.
    """
    data = store.read_bytes(rel, expected_sha256=expected_sha256)
    where = store.uri(rel)
    try:
        table = pq.read_table(pa.BufferReader(data))
    except pa.ArrowInvalid as e:
        raise SchemaError(f"{where}: not a readable Parquet file: {e}") from e
    check_schema(table.schema, name, where)
    version = int(table.schema.metadata[META_VERSION].decode())
    while version < SCHEMA_VERSIONS[name]:
        table = UPGRADES[(name, version)](table).select(TABLES[name].names)
        version += 1
    if not table.schema.remove_metadata().equals(TABLES[name]):
        raise SchemaError(f"{where}: columns differ from the {name!r} schema version {SCHEMA_VERSIONS[name]}")
    return table
