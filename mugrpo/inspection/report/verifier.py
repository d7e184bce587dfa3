"""The verifier false-negative audit per stage (the ``verifier_audit`` view; arXiv 2505.22203); empty without rows."""

from __future__ import annotations

from mugrpo.inspection.report.axes import Axes
from mugrpo.inspection.report.data import ReportData
from mugrpo.inspection.report.markup import table


def section(data: ReportData, ax: Axes) -> str:
    if not data.verifier_audit:
        return ""
    rows = [
        [r["source"], r["stage"], r["wrong"], r["numeric_gold"], r["loose_accepts"], r["loose_accept_rate"] or 0.0]
        for r in data.verifier_audit
    ]
    return (
        "<h2>Verifier audit: wrong by the reward, right by a looser reading</h2>\n<p>Responses the reward called "
        "wrong whose last number equals a numeric gold (rule-based verifiers' false negatives grow as the policy "
        "improves: arXiv 2505.22203). The strict format policy refuses unboxed answers on purpose (docs/rewards.md): "
        "read the rows (<code>SELECT * FROM verifier_audit_samples WHERE loose_accepts</code>) before changing "
        "anything.</p>\n" + table(["source", "stage", "wrong", "numeric gold", "loose reading accepts", "share"], rows)
    )
