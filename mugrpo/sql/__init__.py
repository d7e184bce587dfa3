"""SQL over runs: read-only DuckDB views of rollouts, train steps, evals, stage manifests and runs.

See docs/sql.md for example queries and how read-only access is enforced.
"""

from mugrpo.sql.catalog import RUNS_SCHEMA, VIEWS, RunCatalog, connect
from mugrpo.sql.discover import TargetError
from mugrpo.sql.readonly import ReadOnlyQueryError, SqlError

__all__ = ["RUNS_SCHEMA", "VIEWS", "ReadOnlyQueryError", "RunCatalog", "SqlError", "TargetError", "connect"]
