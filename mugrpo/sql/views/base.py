"""What a view module creates its views with: :class:`Build`, the catalog under construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import duckdb
import pyarrow as pa

from mugrpo.sql.discover import Target

#: Prefix of the registered Arrow tables behind the manifest views and empty placeholders. The database holds no
#: base table at all, so even a data-modifying CTE (``WITH x AS (INSERT ...) SELECT``) has nothing to write to.
INTERNAL = "_mugrpo"


@dataclass
class Build:
    """A catalog under construction.

    Attributes:
        con: the DuckDB connection the views are created on (locked down once every view exists).
        target: the resolved target (store, runs and their files).
        left_out: table files (store-relative paths) left out of the views: a root's files that do not fit their
            table's schema (:mod:`mugrpo.sql.schema_check`).
    """

    con: duckdb.DuckDBPyConnection
    target: Target
    left_out: frozenset[str] = frozenset()

    def register(self, name: str, table: pa.Table) -> str:
        """Expose an Arrow table to SQL under an internal name (read-only: DuckDB cannot insert into it); returns it."""
        internal = f"{INTERNAL}_{name}"
        self.con.register(internal, table)
        return internal

    def view(self, name: str, query: str) -> None:
        """``CREATE VIEW name AS query``."""
        self.con.execute(f"CREATE VIEW {name} AS {query}")

    def read_all(self, rels: list[str]) -> dict[str, bytes]:
        """Bytes of each file (one concurrent batch on S3)."""
        if not rels:
            return {}
        store = self.target.store
        full = {store.full(r): r for r in rels}
        data = store.fs.cat(list(full), on_error="raise")
        return {full[p]: b for p, b in data.items()}


class ViewModule(Protocol):
    """What :data:`mugrpo.sql.catalog.VIEW_MODULES` holds: a module with these two names."""

    NAMES: tuple[str, ...]

    def create(self, build: Build) -> None: ...
