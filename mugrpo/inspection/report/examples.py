"""Example rollouts: the first sample of the first prompts of each stage."""

from __future__ import annotations

from mugrpo.inspection.report.axes import Axes
from mugrpo.inspection.report.data import EXAMPLES_PER_STAGE, ReportData
from mugrpo.inspection.report.markup import table


def section(data: ReportData, ax: Axes) -> str:
    examples = table(
        ["stage", "prompt", "response", "gold", "correctness", "reward"],
        [
            [
                e["stage"],
                e["prompt_text"][-300:],
                e["response_text"][:300],
                e["ground_truth"],
                e["correctness"],
                e["reward"],
            ]
            for e in data.examples
        ],
    )
    return f"""<h2>Example rollouts</h2>
<p>The first sample of {EXAMPLES_PER_STAGE} prompts per stage.</p>
{examples}"""
