"""The run report: one self-contained HTML file (inline SVG plots, no scripts, no network).

It holds a per-stage table in the style of the Mu-GRPO paper's Table 1 (accuracy per benchmark, T_roll, T_train,
T_total), reward and accuracy against wall-clock time and against updates, E[ratio | A<0] and the veto fraction
against updates, response-length statistics, and the paths of the Parquet files. Data comes through the read-only
SQL catalog (:mod:`mugrpo.sql`), the same views users query (:mod:`~mugrpo.inspection.report.data`).

Each part of the page is a module of this package with a ``section(data, axes) -> str``;
:data:`~mugrpo.inspection.report.page.SECTIONS` lists them top to bottom and :func:`render` joins them. A new section
is a new module and one line in that list (plus, if it shows new data, a field of :class:`ReportData` and its query
in :func:`collect`).
"""

from __future__ import annotations

from mugrpo.inspection.report.data import (
    CORRECTNESS,
    EVALS_QUERY,
    EXAMPLES_PER_STAGE,
    HEALTH_COLUMNS,
    ReportData,
    collect,
)
from mugrpo.inspection.report.header import CSS
from mugrpo.inspection.report.health import HEALTH_TABLE_ROWS
from mugrpo.inspection.report.page import SECTIONS, render, write_report, write_report_data
from mugrpo.inspection.report.table1 import table1_markdown

__all__ = [
    "CORRECTNESS",
    "CSS",
    "EVALS_QUERY",
    "EXAMPLES_PER_STAGE",
    "HEALTH_COLUMNS",
    "HEALTH_TABLE_ROWS",
    "SECTIONS",
    "ReportData",
    "collect",
    "render",
    "table1_markdown",
    "write_report",
    "write_report_data",
]
