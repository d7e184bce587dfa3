"""Rows not trained on: one rule, read through these helpers wherever rollout rows are trained on, counted, shown
or audited.

A rollout row is not trained on when one of the run's *excluding columns* is true on it. The columns are the
algorithms' declared rollout columns with ``excludes`` set (:func:`mugrpo.algorithms.excluding_columns`: AGPO's
``is_probe``, a plugin's filter column); callers pass their names, since this layer sits below the algorithms. A NULL
(a file older than the column) is not true; a column a file or a view lacks excludes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


def excluded(row: Mapping[str, Any], columns: Sequence[str]) -> bool:
    """Whether one rollout row (a dict) is kept out of training: one of the excluding ``columns`` is true on it."""
    return any(row.get(name) for name in columns)


def training_rows(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    """The rows of an Arrow rollout table that are trained on (the rows where no excluding column is true)."""
    keep = None
    for name in columns:
        if name not in table.column_names:
            continue
        out = pc.invert(pc.fill_null(table[name], False))
        keep = out if keep is None else pc.and_(keep, out)
    return table if keep is None else table.filter(keep)


def training_rows_sql(columns: Sequence[str], available: Iterable[str]) -> str:
    """A SQL predicate true on the rows trained on, over a view with the columns ``available`` (``TRUE`` when no
    excluding column is there)."""
    have = set(available)
    terms = [f'"{name}" IS NOT TRUE' for name in columns if name in have]
    return " AND ".join(terms) or "TRUE"
