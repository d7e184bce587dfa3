"""The top of the page: its head (title, :data:`CSS`), the run's id, where it is stored and when it was created."""

from __future__ import annotations

import html
from datetime import UTC, datetime

from mugrpo.inspection.report.axes import Axes
from mugrpo.inspection.report.data import ReportData

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222}
h1{font-size:1.6rem} h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem} td,th{border:1px solid #ccc;padding:.25rem .5rem}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums}
.plots{display:flex;flex-wrap:wrap;gap:1rem} figure{margin:0} figcaption{font-size:.85rem;color:#555}
code{font-size:.85rem} h1 code{font-size:inherit} .muted{color:#777}
"""


def section(data: ReportData, ax: Axes) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mugrpo report: {html.escape(data.run_id)}</title>
<style>{CSS}</style></head><body>
<h1>mugrpo run <code>{html.escape(data.run_id)}</code></h1>
<p class="muted">Stored at <code>{html.escape(data.uri)}</code>; created {html.escape(str(data.created_at))};
report generated {now}.</p>"""
