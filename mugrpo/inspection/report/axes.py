"""What the stage table and the plots of a report share (:class:`Axes`), computed once per page."""

from __future__ import annotations

from dataclasses import dataclass

from mugrpo.inspection.report.data import ReportData


@dataclass
class Axes:
    """Per-stage timings, benchmarks, accuracies, the policies evaluated, each policy's wall clock and optimizer
    updates."""

    timing: dict[int, dict]
    benches: list[str]
    acc: dict[tuple[int, str], dict]  # rows of a fork's parent carry from_parent
    policies: list[int]
    clock: dict[int, float]
    updates: dict[int, int]
    per_stage_updates: float

    def policy_updates(self, k: int) -> float:
        return self.updates.get(k, k * self.per_stage_updates)


def axes(data: ReportData) -> Axes:
    timing = {s["stage"]: s for s in data.stages}
    # Cumulative wall clock: the policy of stage k exists once stages 0..k-1 are done.
    clock, t = {}, 0.0
    for k in sorted(timing):
        clock[k] = t
        t += timing[k]["t_total"] or 0.0
    clock.setdefault(max(timing) + 1 if timing else 0, t)
    return Axes(
        timing=timing,
        benches=sorted({e["benchmark"] for e in data.evals}),
        acc={(e["stage"], e["benchmark"]): e for e in data.evals},
        policies=sorted({e["stage"] for e in data.evals} | set(timing)),
        clock=clock,
        updates={r["stage"]: r["policy_version"] for r in data.rollouts_by_stage},
        per_stage_updates=(max(s["update"] for s in data.steps) / max(len(timing), 1)) if data.steps else 0,
    )
