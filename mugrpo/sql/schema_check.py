"""Table files that do not fit their table: a committed Parquet file replaced by another of a different schema (a
column missing, retyped or added) is found from its footer alone, by the rule mugrpo's own reader applies
(:func:`mugrpo.commits.tables.schema_misfit`: older schema versions still fit).

Such a file is never read: the SQL catalog of a root of runs leaves it out of its views (``mugrpo sql`` warns), the
catalog of one run is refused naming it (so ``mugrpo sql RUN`` and ``mugrpo report`` are), and ``mugrpo status``
calls the run not healthy. Nothing is cached: each command reads the footers once (concurrently; one ranged read
each on S3).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mugrpo.commits.tables import file_schema_misfit
from mugrpo.sql.discover import RunFiles, run_files
from mugrpo.storage.store import Store

#: Footers read at once (S3 latency, not bandwidth, is what they cost).
CONCURRENCY = 16


@dataclass(frozen=True)
class Misfit:
    """A table file that does not fit its table's schema."""

    run_id: str
    table: str
    rel: str  # relative to the store root
    uri: str  # the file's full path or URL
    reason: str  # what differs (names the table and each column)

    def __str__(self) -> str:
        return f"{self.uri}: {self.reason}"


def misfit_files(store: Store, runs: dict[str, RunFiles]) -> list[Misfit]:
    """Every table file of ``runs`` whose footer does not fit its table, in run, table and path order."""
    files = [(run_id, table, rel) for run_id, f in runs.items() for table, rels in f.tables.items() for rel in rels]

    def check(item: tuple[str, str, str]) -> str | None:
        return file_schema_misfit(store, item[2], item[1])

    if len(files) > 1:
        with ThreadPoolExecutor(min(CONCURRENCY, len(files)), thread_name_prefix="mugrpo-footer") as pool:
            reasons = list(pool.map(check, files))
    else:
        reasons = [check(f) for f in files]
    return [
        Misfit(run_id, table, rel, store.uri(rel), why)
        for (run_id, table, rel), why in zip(files, reasons, strict=True)
        if why is not None
    ]


def _advice(run_uri: str) -> str:
    return (
        f"`mugrpo verify {run_uri}` names the corrupted files and how to recover; restore each from a copy (the "
        "manifests hold their sha256)"
    )


def refusal(misfits: list[Misfit], run_uri: str) -> str:
    """The one block a query or report of a single run gets when files of it do not fit their table."""
    files = "\n".join(f"  {m}" for m in misfits)
    what = (
        "a table file does not fit its table's schema; refusing to read it"
        if len(misfits) == 1
        else f"{len(misfits)} table files do not fit their table's schema; refusing to read them"
    )
    return f"{run_uri}: {what}:\n{files}\n{_advice(run_uri)}"


def skipped(misfit: Misfit, run_uri: str) -> str:
    """The warning of a file skipped in a query over a root of runs."""
    return f"Warning: skipped {misfit}; {_advice(run_uri)}"


def unhealthy(store: Store, run_id: str) -> list[str]:
    """``mugrpo status``: one line per table file of the run that does not fit its table, then the advice; [] when
    every file fits. Reads footers only (never re-hashes a file: ``mugrpo verify`` does)."""
    misfits = misfit_files(store, {run_id: run_files(store, run_id)})
    if not misfits:
        return []
    return [*(f"not healthy: {m}" for m in misfits), _advice(store.uri(run_id))]
