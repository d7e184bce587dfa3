"""The harness audit: ``mugrpo audit``'s checklist over the run's committed data (docs/audit.md); empty without
rows."""

from __future__ import annotations

from mugrpo.inspection.report.axes import Axes
from mugrpo.inspection.report.data import ReportData
from mugrpo.inspection.report.markup import table


def section(data: ReportData, ax: Axes) -> str:
    if not data.audit:
        return ""
    rows = [[r["check"], r["status"], r["detail"]] for r in data.audit]
    return (
        "<h2>Harness audit</h2>\n<p>The checklist of Probe the Harness (arXiv 2610.02911) over this run's committed "
        "data, as <code>mugrpo audit</code> prints it (docs/audit.md).</p>\n"
        + table(["check", "status", "detail"], rows)
    )
