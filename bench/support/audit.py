"""The audit the benches run on the seeds of one arm or cell (bench/quality.py, bench/staleness.py)."""

from __future__ import annotations

from pathlib import Path


def audit_seeds(root: Path, run_ids: list[str]):
    """``mugrpo.audit`` over the runs ``run_ids`` under ``root`` together, as the seeds of one arm: their data orders
    must differ and their configs may differ only in ``run.seed``. Returns the :class:`mugrpo.audit.AuditReport`;
    each run's catalog is closed afterwards.

    Raises:
        FileNotFoundError: a run has no run.json.
        mugrpo.config.ConfigError: a run's stored config no longer loads.
        mugrpo.sql.TargetError: a run's tables or manifests cannot be read.
    """
    from mugrpo.audit import AuditOptions, audit_runs, open_run

    opened = [open_run(str(root), r) for r in run_ids]
    try:
        return audit_runs(opened, AuditOptions(vary=("run.seed",)))
    finally:
        for r in opened:
            r.catalog.close()
