"""Run every audit check over one or more runs: open each run, call the checks, collect the rows."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mugrpo.audit import batches, configs, data_order, idle_clip, normalizer
from mugrpo.audit.result import FAIL, NOT_CHECKED, AuditRun, CheckResult

#: The checks in the order the table shows them: (name, ``check(runs, options)``).
CHECKS = (
    (idle_clip.NAME, idle_clip.check),
    (data_order.NAME, data_order.check),
    (configs.NAME, configs.check),
    (batches.NAME, batches.check),
    (normalizer.NAME, normalizer.check),
)
SOURCE = "Probe the Harness (arXiv 2610.02911)"


@dataclass(frozen=True)
class AuditOptions:
    """The audit's settings.

    Attributes:
        vary: config keys (or sections) the compared runs are meant to differ in.
        same_order: the runs are meant to share one data order.
        max_repeat: most times one batch identity may be served in a row.
    """

    vary: tuple[str, ...] = ()
    same_order: bool = False
    max_repeat: int = 1


@dataclass
class AuditReport:
    """Every check's rows over the runs audited."""

    runs: list[str]
    options: AuditOptions
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No row failed (``not-checked`` rows do not fail the audit)."""
        return all(r.status != FAIL for r in self.results)

    def result(self, check: str, run: str) -> CheckResult | None:
        return next((r for r in self.results if r.check == check and r.run == run), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": SOURCE,
            "ok": self.ok,
            "runs": self.runs,
            "options": {
                "vary": list(self.options.vary),
                "same_order": self.options.same_order,
                "max_repeat": self.options.max_repeat,
            },
            "results": [r.to_json() for r in self.results],
        }

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=2, default=str)
            f.write("\n")


def open_run(root: str, run_id: str, storage_options: dict | None = None) -> AuditRun:
    """The committed data of run ``run_id`` under ``root``.

    Raises:
        FileNotFoundError: no run.json.
        mugrpo.config.ConfigError: the stored config no longer loads.
        mugrpo.sql.TargetError: the run's tables or manifests cannot be read.
    """
    from mugrpo.orchestration.runs import load_run_config, open_store
    from mugrpo.sql import connect

    cfg = load_run_config(root, run_id, storage_options)
    store = open_store(cfg)
    catalog = connect(f"{root.rstrip('/')}/{run_id}", cfg.run.storage_options or None)
    return AuditRun(run_id=run_id, uri=store.uri(run_id), cfg=cfg, catalog=catalog, store=store)


def _guarded(name: str, fn, runs: list[AuditRun], options: AuditOptions) -> list[CheckResult]:
    """A check's rows; a check that cannot read what it needs reports not-checked with the reason, per run."""
    try:
        return fn(runs, options)
    except Exception as e:  # noqa: BLE001  (one check's unreadable input must not hide the others' results)
        return [CheckResult(name, r.run_id, NOT_CHECKED, f"could not check: {type(e).__name__}: {e}") for r in runs]


def audit_runs(runs: list[AuditRun], options: AuditOptions | None = None) -> AuditReport:
    """Every check of :data:`CHECKS` over ``runs`` (cross-run checks compare them with each other)."""
    options = options or AuditOptions()
    report = AuditReport([r.run_id for r in runs], options)
    for name, fn in CHECKS:
        report.results.extend(_guarded(name, fn, runs, options))
    return report
