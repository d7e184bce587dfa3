"""Per stage, what the loss's correction of stale data did (the ``stage_corrections`` view); empty without rows."""

from __future__ import annotations

import html

from mugrpo.inspection.report.axes import Axes
from mugrpo.inspection.report.data import ReportData
from mugrpo.inspection.report.markup import table

#: Columns of the per-stage corrections table (header, ``stage_corrections`` column).
CORRECTION_COLUMNS = [
    ("stage", "stage"),
    ("updates", "updates"),
    ("clip frac", "clip_frac"),
    ("veto frac", "veto_token_frac"),
    ("masked frac", "masked_frac"),
    ("weights truncated", "weight_clipped_frac"),
    ("ESS", "correction_ess"),
    ("min ESS", "correction_ess_min"),
    ("ESS vs sampler", "sampler_ess"),
]


def section(data: ReportData, ax: Axes) -> str:
    """Clip and veto fractions, the fraction a stale-data correction masked or truncated and the ESS of its
    weights."""
    if not data.corrections:
        return ""

    def fmt(v):
        return "-" if v is None else v if isinstance(v, int | str) else f"{v:.4g}"

    loss = data.corrections[0]["loss"] or "?"
    rows = [[fmt(r[k]) for _, k in CORRECTION_COLUMNS] for r in data.corrections]
    return (
        f"<h2>Stale-data correction by stage</h2>\n<p>Loss <code>{html.escape(str(loss))}</code>, per stage averaged "
        "over its updates: the fraction of tokens clipped (PPO-style clip) or vetoed (Mu-GRPO), the fraction of units "
        "a stale-data correction masked and of weights it truncated, and the normalized ESS of the weights it applied "
        "((sum w)^2 / (n sum w^2); - where the loss reports none), beside the ESS against the sampler "
        "(docs/algorithms/stale-corrections.md; the <code>stage_corrections</code> view of "
        "<code>mugrpo sql</code>).</p>\n" + table([h for h, _ in CORRECTION_COLUMNS], rows)
    )
