"""The paths of the run's Parquet files."""

from __future__ import annotations

import html

from mugrpo.inspection.report.axes import Axes
from mugrpo.inspection.report.data import ReportData


def section(data: ReportData, ax: Axes) -> str:
    files = "".join(f"<li><code>{html.escape(f)}</code></li>" for f in data.files)
    return f"""<h2>Parquet files</h2>
<p>Plain Hive-partitioned Parquet: query them with <code>mugrpo sql</code>, the DuckDB CLI, pandas, polars or
pyarrow.</p>
<ul>{files}</ul>"""
