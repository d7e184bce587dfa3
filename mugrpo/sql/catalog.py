"""Read-only DuckDB views over the Parquet tables and manifests of one run or a root of runs.

    from mugrpo.sql import connect
    with connect("runs/exp1") as cat:                       # or connect("s3://bucket/runs", {"endpoint_url": ...})
        cat.arrow("SELECT stage, avg(reward) FROM rollouts GROUP BY stage ORDER BY stage")

Views (one set per connection, over the files committed when it was opened; :func:`connect` again to see new ones):
each view, or small family of views, is a module of :mod:`mugrpo.sql.views` that describes it; :data:`VIEW_MODULES`
lists them in creation order and :data:`VIEWS` names every view. ``rollouts``, ``train_steps``, ``evals``,
``replay`` (:mod:`~mugrpo.sql.views.tables`), ``stages``, ``runs`` and ``lineage`` hold the files and manifests as
written; ``eval_problems``, ``eval_scores``, ``verifier_audit(_samples)``, ``stage_corrections``, ``rescores`` and
``reward_flips`` are derived from them. A view over a table with no file yet is empty but has the table's columns, so
queries never fail for lack of data.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import duckdb
import pyarrow as pa

from mugrpo.sql.discover import Target, TargetError, resolve_target
from mugrpo.sql.readonly import PROTOCOL, ReadOnlyFileSystem, SqlError, check_statements, lock_down
from mugrpo.sql.redact import Redactor
from mugrpo.sql.schema_check import Misfit, misfit_files, refusal
from mugrpo.sql.views import corrections, evals, rescores, runs, stages, tables, verifier_audit
from mugrpo.sql.views.base import Build, ViewModule
from mugrpo.sql.views.runs import RUNS_SCHEMA

log = logging.getLogger(__name__)

#: The view modules, in the order their views are created (a view may read one created before it). A new view is a
#: new module of :mod:`mugrpo.sql.views` and one line here.
VIEW_MODULES: tuple[ViewModule, ...] = (
    tables,
    rescores,
    stages,
    runs,
    evals,
    verifier_audit,
    corrections,
)

#: Every view a catalog defines, in the order ``.tables`` lists them (a module with ``LISTED_LAST`` comes last).
VIEWS = tuple(
    name for module in sorted(VIEW_MODULES, key=lambda m: getattr(m, "LISTED_LAST", False)) for name in module.NAMES
)

__all__ = ["RUNS_SCHEMA", "VIEWS", "VIEW_MODULES", "RunCatalog", "connect"]


class RunCatalog:
    """A locked, read-only DuckDB connection with the views of one target. Build it with :func:`connect`.

    Attributes:
        target: the resolved target (store, runs and their files).
        misfits: table files of a root's runs left out of the views because they do not fit their table's schema
            (:mod:`mugrpo.sql.schema_check`; over one run, :func:`connect` refuses them instead).
        duckdb_connection: the underlying connection. Using it directly skips the statement check, but DuckDB's
            own locks (see :mod:`mugrpo.sql.readonly`) still refuse every write.
    """

    def __init__(
        self, target: Target, con: duckdb.DuckDBPyConnection, redact: Redactor, misfits: list[Misfit] | None = None
    ):
        self.target = target
        self.duckdb_connection = con
        self.misfits = list(misfits or [])
        self._redact = redact

    @property
    def run_ids(self) -> list[str]:
        """Runs in the target, sorted."""
        return list(self.target.runs)

    def views(self) -> dict[str, list[tuple[str, str]]]:
        """``{view: [(column, DuckDB type), ...]}`` for every view."""
        out = {}
        for view in VIEWS:
            rel = self.duckdb_connection.sql(f"SELECT * FROM {view}")
            out[view] = [(c, str(t)) for c, t in zip(rel.columns, rel.types, strict=True)]
        return out

    def _error(self, e: BaseException) -> SqlError:
        return SqlError(self._redact(str(e)))

    def statements(self, query: str) -> list[duckdb.Statement]:
        """The statements of ``query``, after the read-only check (raises ReadOnlyQueryError / SqlError)."""
        return check_statements(self.duckdb_connection, query)

    def sql(self, query: str) -> duckdb.DuckDBPyRelation:
        """Run one read-only statement; returns DuckDB's relation (lazy: rows are read when fetched).

        Raises:
            ReadOnlyQueryError: the statement is not a query.
            SqlError: several statements, or it does not parse or bind. Messages never contain credentials.
        """
        statements = self.statements(query)
        if len(statements) != 1:
            raise SqlError(f"expected one statement, got {len(statements)}; run them one at a time")
        return self._relation(statements[0])

    def _relation(self, statement: duckdb.Statement) -> duckdb.DuckDBPyRelation:
        try:
            return self.duckdb_connection.sql(statement)
        except (duckdb.Error, OSError) as e:
            raise self._error(e) from None

    def arrow(self, query: str) -> pa.Table:
        """Run one read-only statement and return its result as an Arrow table (same errors as :meth:`sql`)."""
        return self._fetch(self.sql(query))

    def _fetch(self, rel: duckdb.DuckDBPyRelation) -> pa.Table:
        try:
            return rel.to_arrow_table()
        except (duckdb.Error, OSError) as e:
            raise self._error(e) from None

    def run_script(self, query: str) -> Iterator[tuple[str, pa.Table]]:
        """Check every statement of ``query`` now (raises as :meth:`sql`), then run them in order as iterated.

        Yields:
            (statement text, result) per statement; a failing one raises SqlError when reached.
        """
        statements = self.statements(query)
        return ((st.query.strip(), self._fetch(self._relation(st))) for st in statements)

    def close(self) -> None:
        self.duckdb_connection.close()

    def __enter__(self) -> RunCatalog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunCatalog({self.target.url!r}, runs={self.run_ids})"


def connect(target: str, storage_options: dict[str, Any] | None = None) -> RunCatalog:
    """Open a read-only SQL catalog over a run folder or a root of runs (local path or fsspec URL).

    Args:
        target: ``ROOT/RUN_ID`` (one run) or ``ROOT`` (every run below it), e.g. ``runs/exp1``, ``s3://bucket/runs``.
        storage_options: fsspec options for S3 etc. (``endpoint_url``, ``key``, ``secret``...). Credentials are
            never written into SQL, errors or logs; prefer the environment (``AWS_ACCESS_KEY_ID``...).

    Returns:
        a :class:`RunCatalog` whose views are ``rollouts``, ``train_steps``, ``evals``, ``replay``, ``stages``,
        ``runs``, ``lineage`` and the derived views of :data:`VIEWS`.

    Raises:
        TargetError: the target is missing, holds no run, a manifest/run.json is invalid, or it is one run with a
            table file that does not fit its table's schema (names each such file, what differs, how to recover).
    """
    redact = Redactor(storage_options)
    try:
        tgt = resolve_target(target, storage_options)
    except TargetError as e:
        raise TargetError(redact(str(e))) from None
    except (OSError, ValueError) as e:
        raise TargetError(redact(f"cannot open {target}: {e}")) from None
    # A table file that does not fit its table's schema is never read (docs/sql.md, "Files that do not fit their
    # table"): one run is refused, naming each; a root leaves them out of its views (the command line warns).
    misfits = [replace(m, reason=redact(m.reason)) for m in misfit_files(tgt.store, tgt.runs)]
    if misfits and tgt.single_run:
        raise TargetError(redact(refusal(misfits, tgt.store.uri(tgt.scope))))
    # Every file read goes through ReadOnlyFileSystem, whose file handles keep a position per thread: DuckDB shares
    # one handle between its threads (see readonly.PositionalReader), so the default thread count is safe.
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    try:
        con.register_filesystem(ReadOnlyFileSystem(path=tgt.store.root, fs=tgt.store.fs))
        con.execute("SET parquet_metadata_cache = true")  # files are immutable once committed
        build = Build(con, tgt, frozenset(m.rel for m in misfits))
        for module in VIEW_MODULES:
            module.create(build)
        lock_down(con, f"{PROTOCOL}://{tgt.scope}/" if tgt.scope else f"{PROTOCOL}://")
    except TargetError:
        con.close()
        raise
    except (duckdb.Error, OSError) as e:
        con.close()
        raise TargetError(redact(f"cannot open {target}: {e}")) from None
    log.debug("sql catalog over %s: runs %s, files that do not fit %s", tgt.url, list(tgt.runs), misfits)
    return RunCatalog(tgt, con, redact, misfits)
