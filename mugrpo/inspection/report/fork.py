"""A fork's lineage: its parent, K, the changed keys and the paired differences fork - parent
(:func:`mugrpo.inspection.lineage.lineage_section`; empty for a run of its own)."""

from __future__ import annotations

from mugrpo.inspection.lineage import lineage_section
from mugrpo.inspection.report.axes import Axes
from mugrpo.inspection.report.data import ReportData
from mugrpo.inspection.report.markup import table


def section(data: ReportData, ax: Axes) -> str:
    return lineage_section(data.fork, table)
