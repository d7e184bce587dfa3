"""The per-stage summary in the style of the Mu-GRPO paper's Table 1: accuracy per benchmark with its CI and the
paired gain over the base policy, and the timings of each stage's policy."""

from __future__ import annotations

from mugrpo.inspection.report.axes import Axes
from mugrpo.inspection.report.data import ReportData
from mugrpo.inspection.report.markup import ci, table


def section(data: ReportData, ax: Axes) -> str:
    return f"""<h2>Per-stage summary (Mu-GRPO Table 1 style)</h2>
<p>Held-out accuracy (avg@k) of the behavior policy of each stage (stage 0: the base model) and of the final policy,
with its 95% confidence interval clustered by problem, and the paired gain over the base policy on the same problems
with its 95% CI (Miller 2024, arXiv 2411.00640): a gain whose interval excludes 0 is beyond the eval's noise. T_gen
is the generation wall time (the paper's T_roll), T_switch the job start, engine start and weight-load overhead
inside all the jobs.</p>
{stage_table(ax)}"""


def stage_table(ax: Axes) -> str:
    """Mu-GRPO's Table 1: accuracy per benchmark and timings of each stage's policy."""
    rows = []
    for k in ax.policies:
        tm = ax.timing.get(k, {})
        row = [f"stage {k}" if k in ax.timing else f"final (policy {k})"]
        row[0] += " (parent)" if any(ax.acc.get((k, b), {}).get("from_parent") for b in ax.benches) else ""
        for b in ax.benches:
            e = ax.acc.get((k, b))
            row.append(f"{e['avg_at_k']:.3f} {ci(e['ci95_low'], e['ci95_high'])}" if e else "-")
            gain = e.get("gain") if e else None
            row.append(f"{gain:+.3f} {ci(e['gain_low'], e['gain_high'])}" if gain is not None else "-")
        row += [tm.get("t_gen", "-"), tm.get("t_train", "-"), tm.get("t_switch", "-"), tm.get("t_total", "-")]
        rows.append(row)
    per_bench = [h for b in ax.benches for h in (f"{b} avg@k [95% CI]", f"{b} gain over stage 0 [paired 95% CI]")]
    head = ["policy", *per_bench, "T_gen s", "T_train s", "T_switch s", "T_total s"]
    return table(head, rows)
