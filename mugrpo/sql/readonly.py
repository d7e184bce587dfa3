"""How ``mugrpo sql`` stays read-only: three independent layers, each enough to stop a write on its own.

1. **One read-only filesystem.** DuckDB reaches the run's files only through :class:`ReadOnlyFileSystem`, an fsspec
   filesystem registered on the connection under the ``mugrpo://`` protocol. It wraps the store's filesystem (local,
   s3fs, ...) and refuses every mutating call (open for writing, remove, move, copy, mkdir, touch).
2. **DuckDB's own locks**, applied by :func:`lock_down` after the views exist: ``allowed_directories`` is set to the
   target's ``mugrpo://`` prefix, ``enable_external_access`` is turned off (no other file, no INSTALL/LOAD, no
   replacement scans of Python objects), DuckDB's native ``LocalFileSystem`` is disabled, and finally
   ``lock_configuration`` freezes every setting (a later ``SET``/``RESET``/``PRAGMA`` that changes one fails).
3. **A statement check** (:func:`check_statements`) with DuckDB's own parser: only SELECT-type statements (SELECT,
   WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE) and EXPLAIN run. COPY, ATTACH, EXPORT, CREATE, INSERT, SET, INSTALL...
   are refused with an error that names the statement before DuckDB sees them; this also keeps the views intact.
"""

from __future__ import annotations

import duckdb
from fsspec.implementations.dirfs import DirFileSystem

#: The URL scheme under which the run's files are visible to DuckDB: ``mugrpo://{run_id}/rollouts/...``.
PROTOCOL = "mugrpo"

#: Statement types a query may contain. DESCRIBE, SHOW, SUMMARIZE, FROM-first and VALUES parse as SELECT.
ALLOWED_STATEMENTS: frozenset[duckdb.StatementType] = frozenset(
    {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
)


class SqlError(RuntimeError):
    """A query could not run; the message is free of credentials."""


class ReadOnlyQueryError(SqlError):
    """A statement would change state (write, copy, attach, install, set...) and was refused."""


class ReadOnlyFileSystem(DirFileSystem):
    """An fsspec filesystem rooted at ``path`` inside ``fs`` that only reads.

    Paths are relative to the root (``run1/rollouts/stage=0/shard=00000.parquet``), with or without the ``mugrpo://``
    prefix. Every mutating method raises PermissionError naming the path.
    """

    protocol = PROTOCOL

    def _refuse(self, what: str, path) -> None:
        raise PermissionError(f"mugrpo sql is read-only: refused to {what} {PROTOCOL}://{path}")

    def open(self, path, mode="rb", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            self._refuse(f"open (mode {mode!r})", path)
        return super().open(path, mode, *args, **kwargs)

    def _open(self, path, mode="rb", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            self._refuse(f"open (mode {mode!r})", path)
        return super()._open(path, mode, *args, **kwargs)

    def rm(self, path, *args, **kwargs):
        self._refuse("remove", path)

    def rm_file(self, path, *args, **kwargs):
        self._refuse("remove", path)

    def rmdir(self, path, *args, **kwargs):
        self._refuse("remove", path)

    def mv(self, path1, path2, *args, **kwargs):
        self._refuse("move", path1)

    def cp_file(self, path1, path2, *args, **kwargs):
        self._refuse("copy", path1)

    def copy(self, path1, path2, *args, **kwargs):
        self._refuse("copy", path1)

    def pipe_file(self, path, *args, **kwargs):
        self._refuse("write", path)

    def put_file(self, lpath, rpath, *args, **kwargs):
        self._refuse("write", rpath)

    def mkdir(self, path, *args, **kwargs):
        self._refuse("create a folder at", path)

    def makedirs(self, path, *args, **kwargs):
        self._refuse("create a folder at", path)

    def touch(self, path, *args, **kwargs):
        self._refuse("create", path)


def sql_string(value: str) -> str:
    """``value`` as a single-quoted SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def lock_down(con: duckdb.DuckDBPyConnection, allowed_prefix: str) -> None:
    """Restrict ``con`` to reading under ``allowed_prefix`` (a ``mugrpo://...`` URL) and freeze its configuration.

    Call it after every view is created: views are lazy, so they keep reading through the allowed prefix. The order
    matters: DuckDB refuses ``enable_external_access=false`` once the local filesystem is disabled.
    """
    con.execute(f"SET allowed_directories = [{sql_string(allowed_prefix)}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET disabled_filesystems = 'LocalFileSystem'")
    con.execute("SET lock_configuration = true")


def check_statements(con: duckdb.DuckDBPyConnection, query: str) -> list[duckdb.Statement]:
    """Parse ``query`` with DuckDB's parser; return its statements if every one is a read.

    Raises:
        ReadOnlyQueryError: a statement is not SELECT-like or EXPLAIN; the message names it and its position.
        SqlError: the query does not parse, or holds no statement.
    """
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as e:
        raise SqlError(str(e)) from None
    if not statements:
        raise SqlError("the query is empty")
    for i, st in enumerate(statements, 1):
        if st.type not in ALLOWED_STATEMENTS:
            kind = st.type.name.replace("_", " ")
            text = " ".join(st.query.split())
            raise ReadOnlyQueryError(
                f"mugrpo sql is read-only: statement {i} is a {kind} statement ({text[:80]!r}), which is not "
                "allowed. Only queries run (SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN). "
                "To save a result, use --format csv|json or --parquet PATH (Python: RunCatalog.arrow)."
            )
    return statements
