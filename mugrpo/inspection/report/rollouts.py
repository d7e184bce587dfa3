"""The rollouts of each stage: reward, correctness and response-length statistics."""

from __future__ import annotations

from mugrpo.inspection.report.axes import Axes
from mugrpo.inspection.report.data import ReportData
from mugrpo.inspection.report.markup import table

#: Columns of the rollouts table (header, rollouts_by_stage key).
LENGTH_COLUMNS = [
    ("stage", "stage"),
    ("rollouts", "rollouts"),
    ("mean reward", "mean_reward"),
    ("correctness", "correctness"),
    ("correct", "accuracy"),
    ("boxed rate", "boxed_rate"),
    ("mean len", "mean_len"),
    ("p50", "p50_len"),
    ("p90", "p90_len"),
    ("max", "max_len"),
    ("truncated", "truncated"),
    ("zero-var groups", "zero_var_frac"),
]


def section(data: ReportData, ax: Axes) -> str:
    lengths = table([h for h, _ in LENGTH_COLUMNS], [[r[k] for _, k in LENGTH_COLUMNS] for r in data.rollouts_by_stage])
    return f"""<h2>Rollouts and response lengths</h2>
{lengths}
<p>mean reward = the weighted sum of the components; correctness = the mean correctness component
(math_correctness, reasoning_gym_exact or the reasoning-gym task's score); correct = share of rollouts with
correctness 1; boxed rate =
share with a boxed answer (the format component).</p>"""
