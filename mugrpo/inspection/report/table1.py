"""The per-stage summary as a Markdown table (for Prefect artifacts and terminals)."""

from __future__ import annotations

from mugrpo.inspection.report.data import ReportData
from mugrpo.inspection.report.markup import ci


def table1_markdown(data: ReportData) -> str:
    """The per-stage summary as a Markdown table (for Prefect artifacts and terminals)."""
    timing = {s["stage"]: s for s in data.stages}
    acc = {(e["stage"], e["benchmark"]): e for e in data.evals}
    benches = sorted({b for _, b in acc})
    rewards = {r["stage"]: r["mean_reward"] for r in data.rollouts_by_stage}
    policies = sorted({k for k, _ in acc} | set(timing))
    head = ["policy", "train reward", *[f"{b} avg@k [95% CI]" for b in benches], "T_gen s", "T_train s", "T_total s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in policies:
        t = timing.get(k, {})
        cells = [
            f"stage {k}" if k in timing else f"final ({k})",
            f"{rewards[k]:.3f}" if k in rewards else "-",
            *(
                f"{acc[(k, b)]['avg_at_k']:.3f} {ci(acc[(k, b)]['ci95_low'], acc[(k, b)]['ci95_high'])}"
                if (k, b) in acc
                else "-"
                for b in benches
            ),
            *(f"{t[c]:.0f}" if t.get(c) is not None else "-" for c in ("t_gen", "t_train", "t_total")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
