"""The page: :data:`SECTIONS` in order, and writing it (:func:`write_report`)."""

from __future__ import annotations

from collections.abc import Callable

from mugrpo.inspection.report import (
    audit,
    corrections,
    examples,
    files,
    fork,
    header,
    health,
    plots,
    rollouts,
    stage_table,
    verifier,
)
from mugrpo.inspection.report.axes import Axes, axes
from mugrpo.inspection.report.data import ReportData, collect

#: The page's sections, top to bottom: each takes the collected data and the shared axes and returns its HTML ("" to
#: leave it out). A new section is a new module of :mod:`mugrpo.inspection.report` and one line here.
SECTIONS: tuple[Callable[[ReportData, Axes], str], ...] = (
    header.section,
    stage_table.section,
    fork.section,
    plots.section,
    health.section,
    corrections.section,
    rollouts.section,
    examples.section,
    verifier.section,
    audit.section,
    files.section,
)


def render(data: ReportData) -> str:
    """The report's HTML for collected data."""
    ax = axes(data)
    body = "\n".join(section(data, ax) for section in SECTIONS)
    return f"{body}\n</body></html>\n"


def write_report(target: str, storage_options: dict | None = None, out: str | None = None) -> str:
    """Build the report of run folder ``target`` and write it to ``out`` (default: ``{run}/report.html`` in the
    run's storage, written atomically). Returns where it was written."""
    return write_report_data(collect(target, storage_options), target, storage_options, out)


def write_report_data(
    data: ReportData, target: str, storage_options: dict | None = None, out: str | None = None
) -> str:
    """Write already-collected report data (see :func:`write_report`)."""
    from mugrpo.storage.store import Store

    page = render(data).encode()
    if out is not None:
        with open(out, "wb") as f:
            f.write(page)
        return out
    parent, _, run_id = target.rstrip("/").rpartition("/")
    store = Store(parent or ".", storage_options)
    rel = f"{run_id}/report.html"
    store.write_bytes(rel, page)
    return store.uri(rel)
