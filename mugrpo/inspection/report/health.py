"""The health panel of the latest updates (docs/sql.md, "Health panel")."""

from __future__ import annotations

from mugrpo.inspection.report.axes import Axes
from mugrpo.inspection.report.data import HEALTH_COLUMNS, ReportData
from mugrpo.inspection.report.markup import table

#: Updates listed in the report's health table (the latest ones).
HEALTH_TABLE_ROWS = 30


def section(data: ReportData, ax: Axes) -> str:
    return f"""<h2>Health panel</h2>
<p>Per update, the importance weights w = pi_theta / q against the sampler's log-probs q: normalized ESS, KL(q || pi)
(k3), ratio percentiles, the clip fraction against the loss's clip range, the mean logit variance, S*eta and T*eta,
and the batch identity (docs/sql.md, "Health panel"). The latest {HEALTH_TABLE_ROWS} updates:</p>
{health_table(data.steps)}"""


def health_table(steps: list[dict]) -> str:
    """The health panel of the latest :data:`HEALTH_TABLE_ROWS` updates; NULL (older files, no clip range) as -."""

    def fmt(v):
        return "-" if v is None else v if isinstance(v, str) else f"{v:.4g}"

    shown = steps[-HEALTH_TABLE_ROWS:]
    return table(["update", *HEALTH_COLUMNS], [[s["update"], *(fmt(s[c]) for c in HEALTH_COLUMNS)] for s in shown])
