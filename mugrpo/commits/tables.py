"""Reading and writing mugrpo's Parquet tables with schema-version checks (schemas live in ``schemas/``)."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store, sha256_bytes
from schemas import META_TABLE, META_VERSION, OLDER_DEFAULTS, OLDER_SCHEMAS, SCHEMA_VERSIONS, TABLES, FileRecord


class SchemaError(ValueError):
    """A Parquet file does not carry the expected mugrpo table, schema or version."""


class RolloutDataError(ValueError):
    """The committed rollouts cannot be trained on (missing manifest, bad row, nothing left to train on)."""


#: File metadata key listing a table's extension columns (comma-separated): declared columns the versioned schema
#: lacks (an algorithm's :class:`~mugrpo.algorithms.RolloutColumn`), written after the schema's own columns.
META_EXTENSIONS = b"mugrpo.extension_columns"


def _schema_with(name: str, extra: Sequence[pa.Field]) -> tuple[pa.Schema, list[str]]:
    """Schema ``name`` followed by the ``extra`` fields it lacks, and those fields' names.

    Raises:
        SchemaError: an extra field named like a schema column has another type.
    """
    schema, added = TABLES[name], []
    for f in extra:
        if f.name in schema.names:
            if schema.field(f.name).type != f.type:
                own = schema.field(f.name).type
                raise SchemaError(f"declared column {f.name!r} ({f.type}) differs from the {name!r} schema's ({own})")
            continue
        schema, added = schema.append(f), [*added, f.name]
    return schema, added


def _stamp(table: pa.Table, name: str, extra: Sequence[pa.Field] = ()) -> pa.Table:
    expected, added = _schema_with(name, extra)
    try:
        table = table.select(expected.names).cast(expected)
    except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise SchemaError(f"table does not match the {name!r} schema: {e}") from e
    meta = {META_TABLE: name.encode(), META_VERSION: str(SCHEMA_VERSIONS[name]).encode()}
    if added:
        meta[META_EXTENSIONS] = ",".join(added).encode()
    return table.replace_schema_metadata(meta)


def table_from_rows(rows: list[dict], name: str, extra: Sequence[pa.Field] = ()) -> pa.Table:
    """Build a table of schema ``name`` (followed by the ``extra`` declared fields it lacks) from row dicts. Values
    of map columns (``reward_components``, ``loss_metrics``) are written with their keys sorted, whatever order the
    dict had (a config read back from run.json lists reward components in another order than its YAML): a resumed
    run's rows equal an uninterrupted run's, byte for byte. Raises SchemaError naming the table on a bad row."""
    schema = TABLES.get(name)
    maps = [f.name for f in schema if pa.types.is_map(f.type)] if schema is not None else []
    if maps:
        rows = [{**r, **{m: _sorted_map(r[m]) for m in maps if m in r}} for r in rows]
    try:
        return pa.Table.from_pylist(rows, schema=_schema_with(name, extra)[0])
    except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise SchemaError(f"rows do not fit the {name!r} schema: {e}") from e


def _sorted_map(value):
    """A map value in canonical key order: a dict's items sorted by key (a list of pairs as given; None kept)."""
    return dict(sorted(value.items())) if isinstance(value, dict) else value


def write_table(
    store: Store,
    rel: str,
    table: pa.Table,
    name: str,
    *,
    run_rel: str | None = None,
    extra: Sequence[pa.Field] = (),
) -> FileRecord:
    """Validate ``table`` against schema ``name``, stamp the version, and write it atomically at ``rel``.

    Args:
        run_rel: the path recorded in the returned FileRecord (relative to the run dir); defaults to ``rel``.
        extra: declared fields written after the schema's columns (those it lacks: extension columns, listed in
            the file's metadata).

    Raises:
        SchemaError: a column is missing or cannot be cast to the schema's type.
    """
    if name not in TABLES:
        raise SchemaError(f"unknown table {name!r}; known tables: {sorted(TABLES)}")
    table = _stamp(table, name, extra)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    data = buf.getvalue()
    digest = store.write_bytes(rel, data)
    return FileRecord(path=run_rel or rel, sha256=digest, bytes=len(data), rows=table.num_rows)


#: Values of columns an older file lacks, where NULL would be wrong (``schemas.OLDER_DEFAULTS``; the SQL views fill
#: the same values).
DEFAULTS_FOR_OLDER = OLDER_DEFAULTS


def schema_misfit(schema: pa.Schema, name: str) -> str | None:
    """Why a Parquet file of Arrow ``schema`` cannot be read as table ``name``, or None when it fits: the one rule
    of :func:`read_table`, which needs no more than the file's footer (``pq.read_schema``).

    A file fits when its metadata says table ``name`` at the current version or an older one of
    ``schemas.OLDER_SCHEMAS`` (whose missing columns are filled when read), and its columns are that version's, in
    order, with their types and nullability, followed by the extension columns its metadata lists. The reason names
    what differs, e.g. "columns differ from the 'rollouts' schema version 4: missing column `advantage`; column
    `reward` is string, expected float; unexpected column `bogus`".
    """
    meta = schema.metadata or {}
    table = meta.get(META_TABLE, b"").decode()
    version = meta.get(META_VERSION, b"").decode()
    if table != name:
        return f"expected a mugrpo {name!r} table, file says {table or 'nothing'!r}"
    readable = [SCHEMA_VERSIONS[name], *sorted(v for t, v in OLDER_SCHEMAS if t == name)]
    if version not in {str(v) for v in readable}:
        return (
            f"{name!r} schema version {version or 'missing'!r} is not supported (this mugrpo reads version "
            f"{', '.join(map(str, readable))}); re-generate the file or use a matching mugrpo version"
        )
    expected = TABLES[name] if int(version) == SCHEMA_VERSIONS[name] else OLDER_SCHEMAS[(name, int(version))]
    listed = meta.get(META_EXTENSIONS, b"").decode()
    extensions = [n for n in listed.split(",") if n]
    problems = []
    for want in expected:
        found = [schema.field(i) for i in schema.get_all_field_indices(want.name)]
        if not found:
            problems.append(f"missing column `{want.name}`")
        elif len(found) > 1:
            problems.append(f"column `{want.name}` appears {len(found)} times")
        elif not found[0].equals(want):
            got = found[0]
            if got.type == want.type and got.nullable != want.nullable:
                null = {True: "nullable", False: "not nullable"}
                problems.append(f"column `{want.name}` is {null[got.nullable]}, expected {null[want.nullable]}")
            else:
                problems.append(f"column `{want.name}` is {got.type}, expected {want.type}")
    problems += [f"unexpected column `{n}`" for n in schema.names if n not in expected.names and n not in extensions]
    problems += [
        f"extension column `{n}` (listed in the file's metadata) is missing or named like a schema column"
        for n in extensions
        if n not in schema.names or n in expected.names
    ]
    if not problems and [n for n in schema.names if n not in extensions] != expected.names:
        problems.append("columns are not in the schema's order")
    return f"columns differ from the {name!r} schema version {version}: {'; '.join(problems)}" if problems else None


def file_schema_misfit(store: Store, rel: str, name: str) -> str | None:
    """:func:`schema_misfit` of the Parquet file at ``rel`` read from its footer only (a ranged read on S3, never the
    whole file); a file that is no Parquet is a misfit too. None for a file that is gone (deleted since listed)."""
    try:
        with store.fs.open(store.full(rel), "rb") as f:
            schema = pq.read_schema(f)
    except FileNotFoundError:
        return None
    except OSError as e:  # pyarrow's I/O errors too
        return f"cannot be read: {e}"
    except pa.ArrowException as e:
        return f"not a readable Parquet file: {e}"
    return schema_misfit(schema, name)


def read_table(
    store: Store,
    rel: str,
    name: str,
    *,
    expected_sha256: str | None = None,
    extra: Sequence[pa.Field] = (),
) -> pa.Table:
    """Read a Parquet table written by :func:`write_table`, checking table name, version and (optionally) sha256.

    A file at an older version listed in ``schemas.OLDER_SCHEMAS`` is brought to the current schema: added columns
    get the values that the older writer implied (``schemas.OLDER_DEFAULTS``), else NULL. The file's extension
    columns follow the schema's; each of the ``extra`` declared fields the file lacks is added as NULL.

    Raises:
        SchemaError: wrong table, unknown version, or columns that differ from the schema.
        mugrpo.storage.store.ChecksumError: bytes differ from ``expected_sha256``.
    """
    data = store.read_bytes(rel, expected_sha256=expected_sha256)
    where = store.uri(rel)
    try:
        table = pq.read_table(pa.BufferReader(data))
    except pa.ArrowInvalid as e:
        raise SchemaError(f"{where}: not a readable Parquet file: {e}") from e
    misfit = schema_misfit(table.schema, name)
    if misfit is not None:
        raise SchemaError(f"{where}: {misfit}")
    meta = table.schema.metadata or {}
    version = int(meta[META_VERSION])
    schema = TABLES[name] if version == SCHEMA_VERSIONS[name] else OLDER_SCHEMAS[(name, version)]
    core = table.select(schema.names)
    own = table.select([n for n in meta.get(META_EXTENSIONS, b"").decode().split(",") if n])
    for missing in (f for f in TABLES[name] if f.name not in schema.names):  # an older version: fill what it lacks
        default = DEFAULTS_FOR_OLDER.get((name, missing.name))
        column = (
            pa.nulls(table.num_rows, missing.type)
            if default is None
            else pa.array([default] * table.num_rows, missing.type)
        )
        core = core.append_column(missing, column)
    table = core.select(TABLES[name].names)
    for i, column in enumerate(own.columns):
        table = table.append_column(own.schema.field(i), column)
    for f in extra:
        if f.name not in table.column_names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table


# Tables written in parts per stage (``train_steps``, an algorithm's audit table such as ``replay``): the rows of
# updates (n_prev, n] go to ``{table}/stage=k/part-{n:05d}.parquet`` just before the checkpoint of update n is
# committed. A resume deletes the parts after its checkpoint and rewrites them, so no row is ever duplicated.


def write_part(store: Store, layout: RunLayout, table: str, stage: int, part: int, rows: list[dict]) -> FileRecord:
    """Write ``rows`` as part ``part`` (the stage update of the checkpoint it belongs to) of ``table``, atomically."""
    rel = layout.table_part(table, stage, part)
    return write_table(store, rel, table_from_rows(rows, table), table, run_rel=layout.rel(rel))


def part_numbers(store: Store, layout: RunLayout, table: str, stage: int) -> list[int]:
    """Sorted part numbers present under ``{table}/stage=k``."""
    parts = []
    for name in store.listdir(layout.table_dir(table, stage)):
        m = re.fullmatch(r"part-(\d{5,})\.parquet", name)
        if m:
            parts.append(int(m.group(1)))
    return sorted(parts)


def delete_parts_after(store: Store, layout: RunLayout, table: str, stage: int, step: int) -> list[int]:
    """Delete the parts of ``table`` of updates after ``step`` (left by a run killed before their checkpoint
    committed); returns their numbers."""
    doomed = [p for p in part_numbers(store, layout, table, stage) if p > step]
    for part in doomed:
        store.delete(layout.table_part(table, stage, part))
    return doomed


def read_parts(store: Store, layout: RunLayout, table: str, stage: int) -> tuple[list[pa.Table], list[FileRecord]]:
    """Every part of ``table`` of a stage, in part order, each verified as that table, with a FileRecord (sha256)."""
    tables, records = [], []
    for part in part_numbers(store, layout, table, stage):
        rel = layout.table_part(table, stage, part)
        data = store.read_bytes(rel)
        digest = sha256_bytes(data)
        t = read_table(store, rel, table, expected_sha256=digest)
        tables.append(t)
        records.append(FileRecord(path=layout.rel(rel), sha256=digest, bytes=len(data), rows=t.num_rows))
    return tables, records
