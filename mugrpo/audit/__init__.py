"""``mugrpo audit``: the harness checklist of "Probe the Harness" (arXiv 2610.02911) as queries over runs' committed
data (docs/audit.md).

Each check is one module with one pure function ``check(runs, options) -> list[CheckResult]``:

- :mod:`~mugrpo.audit.idle_clip`: the importance ratio is 1 at a stage's first update and moves after it;
- :mod:`~mugrpo.audit.data_order`: a data-order fingerprint per run; different seeds, different orders;
- :mod:`~mugrpo.audit.configs`: compared runs differ only in the config keys named;
- :mod:`~mugrpo.audit.batches`: no batch served again and again; replay draws fresh and within ``tau_max``;
- :mod:`~mugrpo.audit.normalizer`: the logged loss equals the loss recomputed from stored rows.

:func:`~mugrpo.audit.runner.audit_runs` runs them all; :mod:`mugrpo.cli` prints the table and writes the JSON.
"""

from __future__ import annotations

from mugrpo.audit.result import FAIL, NOT_CHECKED, PASS, AuditRun, CheckResult
from mugrpo.audit.runner import AuditOptions, AuditReport, audit_runs, open_run

__all__ = [
    "FAIL",
    "NOT_CHECKED",
    "PASS",
    "AuditOptions",
    "AuditReport",
    "AuditRun",
    "CheckResult",
    "audit_runs",
    "open_run",
]
