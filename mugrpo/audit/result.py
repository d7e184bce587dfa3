"""What every audit check returns, and the committed data of one run that the checks read.

A check is a pure function over committed data: one or more runs in, one :class:`CheckResult` per run out. It never
writes, and a fact the data cannot establish (a column an older schema lacks, a run too short) is reported as
``not-checked`` with the reason, never as a pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS = "pass"
FAIL = "fail"
NOT_CHECKED = "not-checked"


@dataclass(frozen=True)
class CheckResult:
    """One row of the audit: ``check`` on ``run``.

    Attributes:
        check: the check's name (``idle-clip``, ``data-order``, ``configs``, ``batches``, ``normalizer``).
        run: the run id.
        status: ``pass``, ``fail`` or ``not-checked``.
        detail: one line: the rule's evidence, or the offending stage/update and values, or why not checked.
        values: machine-readable evidence (e.g. ``{"fingerprint": ...}``), copied into the JSON file.
    """

    check: str
    run: str
    status: str
    detail: str
    values: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "run": self.run, "status": self.status, "detail": self.detail, **self.values}


@dataclass
class AuditRun:
    """The committed data of one run, as the checks read it.

    Attributes:
        run_id: the run id; ``uri`` its folder's URL.
        cfg: the resolved config stored in run.json (:class:`mugrpo.config.Config`).
        catalog: a read-only SQL catalog over the run (:func:`mugrpo.sql.connect`): the checks' query layer.
        store: the run's store (for the prompt plans and rollouts the trainer's own readers load).
    """

    run_id: str
    uri: str
    cfg: Any
    catalog: Any
    store: Any
    _columns: dict[str, set[str]] = field(default_factory=dict)

    def rows(self, query: str) -> list[dict[str, Any]]:
        """The rows of a read-only SQL query over the run's views, as dicts."""
        return self.catalog.arrow(query).to_pylist()

    def columns(self, view: str) -> set[str]:
        """Column names of a view (a column an older schema lacks is absent or NULL, depending on the reader)."""
        if view not in self._columns:
            self._columns[view] = set(self.catalog.sql(f"SELECT * FROM {view} LIMIT 0").columns)
        return self._columns[view]

    def has_values(self, view: str, column: str) -> bool:
        """Whether ``column`` exists in ``view`` and holds at least one non-NULL value."""
        if column not in self.columns(view):
            return False
        return bool(self.rows(f'SELECT count("{column}") AS n FROM {view}')[0]["n"])
