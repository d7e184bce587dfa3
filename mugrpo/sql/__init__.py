"""SQL over runs: read-only DuckDB views of rollouts, train steps, evals, stage manifests and runs.

See docs/sql.md for example queries and how read-only access is enforced. Names are imported on first use, so
``mugrpo --help`` does not pay for DuckDB and pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mugrpo.sql.catalog import RUNS_SCHEMA, VIEWS, RunCatalog, connect
    from mugrpo.sql.discover import TargetError
    from mugrpo.sql.readonly import ReadOnlyQueryError, SqlError

_EXPORTS = {
    "RUNS_SCHEMA": "mugrpo.sql.catalog",
    "VIEWS": "mugrpo.sql.catalog",
    "RunCatalog": "mugrpo.sql.catalog",
    "connect": "mugrpo.sql.catalog",
    "TargetError": "mugrpo.sql.discover",
    "ReadOnlyQueryError": "mugrpo.sql.readonly",
    "SqlError": "mugrpo.sql.readonly",
}

__all__ = ["RUNS_SCHEMA", "VIEWS", "ReadOnlyQueryError", "RunCatalog", "SqlError", "TargetError", "connect"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mugrpo.sql' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
