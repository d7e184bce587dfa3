"""How ``mugrpo sql`` stays read-only: three independent layers, each enough to stop a write on its own.

1. **One read-only filesystem.** DuckDB reaches the run's files only through :class:`ReadOnlyFileSystem`, an fsspec
   filesystem registered on the connection under the ``mugrpo://`` protocol. It wraps the store's filesystem (local,
   s3fs, ...) and refuses every mutating call (open for writing, remove, move, copy, mkdir, touch).
2. **DuckDB's own locks**, applied by :func:`lock_down` after the views exist: ``allowed_directories`` is set to the
   target's ``mugrpo://`` prefix, ``enable_external_access`` is turned off (no other file, no INSTALL/LOAD, no
   replacement scans of Python objects), DuckDB's native ``LocalFileSystem`` is disabled, and finally
   ``lock_configuration`` freezes every setting (a later ``SET``/``RESET``/``PRAGMA`` that changes one fails).
3. **A statement check** (:func:`check_statements`) with DuckDB's own parser: only SELECT-type statements (SELECT,
   WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE) and an EXPLAIN of one run. COPY, ATTACH, EXPORT, CREATE, INSERT, SET,
   INSTALL... are refused with an error that names the statement before DuckDB sees them; this also keeps the views
   intact. ``EXPLAIN ANALYZE`` *executes* the statement it wraps, so an EXPLAIN is judged by what it wraps: DuckDB's
   tokenizer (comments included) finds the end of ``EXPLAIN [ANALYZE] [(options)]`` and DuckDB's parser types the rest
   (:func:`explained_statement`); ``EXPLAIN ANALYZE DROP VIEW rollouts`` is refused as a DROP statement.
"""

from __future__ import annotations

import io
import threading

import duckdb
from fsspec.implementations.dirfs import DirFileSystem

#: The URL scheme under which the run's files are visible to DuckDB: ``mugrpo://{run_id}/rollouts/...``.
PROTOCOL = "mugrpo"

#: Statement types a query may contain. DESCRIBE, SHOW, SUMMARIZE, FROM-first and VALUES parse as SELECT; an EXPLAIN
#: is allowed when the statement it wraps is one of these (:func:`explained_statement`).
ALLOWED_STATEMENTS: frozenset[duckdb.StatementType] = frozenset({duckdb.StatementType.SELECT})

_EXPLAIN_ANALYZE = {"ANALYZE", "ANALYSE"}


class SqlError(RuntimeError):
    """A query could not run; the message is free of credentials."""


class ReadOnlyQueryError(SqlError):
    """A statement would change state (write, copy, attach, install, set...) and was refused."""


class PositionalReader(io.RawIOBase):
    """A read-only binary file whose position is per thread, so one handle can serve several threads at once.

    DuckDB reads a Python (fsspec) file as ``seek(offset)`` then ``read(n)``, two calls with the GIL released in
    between, and its Parquet reader shares one handle between threads (prefetch and scan threads, even at
    ``threads = 1``). On a plain fsspec file another thread's ``seek`` can land between the two, and the bytes read
    come from the wrong offset: DuckDB then fails with a Thrift or decompression error ("don't know what type",
    "Variable-length int over 10 bytes", "Exceeded size limit", "ZSTD Decompression failure", "Out of buffer"). Here
    ``seek``/``tell`` act on the calling thread's own position and each ``read`` is one locked seek-and-read on the
    underlying file, so a read always returns the bytes at the offset its thread asked for.
    """

    def __init__(self, file, path: str):
        super().__init__()
        self._file = file
        self.name = path
        self._lock = threading.Lock()
        self._local = threading.local()
        self._size: int | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    @property
    def size(self) -> int:
        """File size in bytes."""
        if self._size is None:
            with self._lock:
                self._size = self._file.seek(0, io.SEEK_END)
        return self._size

    def tell(self) -> int:
        return getattr(self._local, "pos", 0)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self.tell()
        elif whence == io.SEEK_END:
            offset += self.size
        elif whence != io.SEEK_SET:
            raise ValueError(f"invalid whence {whence} for {self.name}")
        if offset < 0:
            raise ValueError(f"negative seek position {offset} in {self.name}")
        self._local.pos = offset
        return offset

    def read(self, size: int = -1) -> bytes:
        pos = self.tell()
        with self._lock:
            self._file.seek(pos)
            data = self._file.read(size)
        self._local.pos = pos + len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()


class ReadOnlyFileSystem(DirFileSystem):
    """An fsspec filesystem rooted at ``path`` inside ``fs`` that only reads.

    Paths are relative to the root (``run1/rollouts/stage=0/shard=00000.parquet``), with or without the ``mugrpo://``
    prefix. Every mutating method raises PermissionError naming the path. Files open as :class:`PositionalReader`,
    which DuckDB's threads can share safely.
    """

    protocol = PROTOCOL

    def _refuse(self, what: str, path) -> None:
        raise PermissionError(f"mugrpo sql is read-only: refused to {what} {PROTOCOL}://{path}")

    def open(self, path, mode="rb", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            self._refuse(f"open (mode {mode!r})", path)
        f = super().open(path, mode, *args, **kwargs)
        return PositionalReader(f, str(path)) if "b" in mode else f

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


def explained_statement(con: duckdb.DuckDBPyConnection, statement: duckdb.Statement) -> duckdb.Statement:
    """The statement an EXPLAIN wraps, parsed by DuckDB: ``EXPLAIN [ANALYZE|ANALYSE] [(option, ...)] <statement>``.

    The prefix is skipped token by token with DuckDB's own tokenizer (so comments and the parenthesized option list
    of ``EXPLAIN (ANALYZE, FORMAT json) ...`` are handled as DuckDB reads them); the rest is parsed again.

    Raises:
        SqlError: the wrapped text is not exactly one statement DuckDB can parse.
    """
    text = statement.query
    every = duckdb.tokenize(text)
    ends = [pos for pos, _ in every[1:]] + [len(text)]
    spans = [(pos, kind, text[pos:end].strip()) for (pos, kind), end in zip(every, ends, strict=True)]
    tokens = [(pos, kind) for pos, kind, _ in spans if kind != duckdb.token_type.comment]
    words = [word for _, kind, word in spans if kind != duckdb.token_type.comment]
    i = 1  # tokens[0] is EXPLAIN
    if i < len(words) and words[i].upper() in _EXPLAIN_ANALYZE:
        i += 1
    if i < len(words) and words[i].startswith("("):
        depth = 0
        while i < len(words):
            if tokens[i][1] == duckdb.token_type.operator:
                depth += words[i].count("(") - words[i].count(")")
            i += 1
            if depth <= 0:
                break
    inner = text[tokens[i][0] :] if i < len(tokens) else ""
    try:
        wrapped = con.extract_statements(inner)
    except duckdb.Error as e:
        raise SqlError(f"cannot read the statement EXPLAIN wraps ({inner[:80]!r}): {e}") from None
    if len(wrapped) != 1:
        raise SqlError(f"EXPLAIN must wrap exactly one statement, not {len(wrapped)} ({inner[:80]!r})")
    return wrapped[0]


def check_statements(con: duckdb.DuckDBPyConnection, query: str) -> list[duckdb.Statement]:
    """Parse ``query`` with DuckDB's parser; return its statements if every one is a read.

    An EXPLAIN is checked by the statement it wraps (``EXPLAIN ANALYZE`` runs it): ``EXPLAIN ANALYZE DROP VIEW
    rollouts`` is refused as a DROP statement.

    Raises:
        ReadOnlyQueryError: a statement (or the statement an EXPLAIN wraps) is not SELECT-like; the message names
            its type and its position.
        SqlError: the query does not parse, or holds no statement.
    """
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as e:
        raise SqlError(str(e)) from None
    if not statements:
        raise SqlError("the query is empty")
    for i, st in enumerate(statements, 1):
        checked, wrapper = st, ""
        if st.type == duckdb.StatementType.EXPLAIN:
            checked, wrapper = explained_statement(con, st), "wrapped in EXPLAIN "
        if checked.type not in ALLOWED_STATEMENTS:
            kind = checked.type.name.replace("_", " ")
            text = " ".join(st.query.split())
            raise ReadOnlyQueryError(
                f"mugrpo sql is read-only: statement {i} is a {kind} statement {wrapper}({text[:80]!r}), which is "
                "not allowed. Only queries run (SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE, and EXPLAIN "
                "of one of them). To save a result, use --format csv|json or --parquet PATH (Python: "
                "RunCatalog.arrow)."
            )
    return statements
