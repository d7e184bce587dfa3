"""What a run killed and resumed many times must still satisfy, checked from its committed files against an
uninterrupted run of the same config (docs/design.md, "Resume semantics"; docs/reliability.md):

- the run completed: every stage manifest and the final policy exist;
- every (stage, prompt_id, sample_idx) rollout exists exactly once (AGPO probe rows are keyed apart, by is_probe);
- ``train_steps.update`` numbers are 1..U, contiguous, none repeated;
- each rollout's ``policy_version`` and each update's ``staleness`` equal the uninterrupted run's;
- the final policy's weights are bitwise equal to the uninterrupted run's (CPU);
- every stage has a prompt plan (:mod:`mugrpo.provenance.prompt_plan`), no prompt id is scheduled in two stages of one
  epoch, each stage's rollouts are of exactly its planned prompts, and the plans equal the uninterrupted run's.

Local run folders only (the harness runs on a local store).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from mugrpo.provenance.prompt_plan import PromptPlan, epoch_overlaps

__all__ = ["RunCheck", "check_run", "plan_problems", "rollout_keys", "train_updates"]

RolloutKey = tuple[int, str, int, bool]


def _stage_of(path: Path) -> int:
    return int(next(p for p in path.parts if p.startswith("stage=")).split("=", 1)[1])


def rollout_keys(run_dir: Path) -> Counter[RolloutKey]:
    """Count of each (stage, prompt_id, sample_idx, is_probe) over every committed rollout shard of the run."""
    keys: Counter[RolloutKey] = Counter()
    for f in sorted((run_dir / "rollouts").rglob("shard=*.parquet")):
        t = pq.read_table(f)
        probes = t["is_probe"].to_pylist() if "is_probe" in t.column_names else [None] * t.num_rows
        stage = _stage_of(f)
        keys.update(
            (stage, p, s, bool(q))
            for p, s, q in zip(t["prompt_id"].to_pylist(), t["sample_idx"].to_pylist(), probes, strict=True)
        )
    return keys


def _policy_versions(run_dir: Path) -> dict[RolloutKey, int]:
    out = {}
    for f in sorted((run_dir / "rollouts").rglob("shard=*.parquet")):
        t = pq.read_table(f).to_pylist()
        for r in t:
            out[(_stage_of(f), r["prompt_id"], r["sample_idx"], bool(r.get("is_probe")))] = r["policy_version"]
    return out


def train_updates(run_dir: Path) -> list[tuple[int, int]]:
    """(update, staleness) of every committed train_steps row, sorted by update (repeats kept)."""
    rows = []
    for f in sorted((run_dir / "train_steps").rglob("part-*.parquet")):
        t = pq.read_table(f, columns=["update", "staleness"])
        rows.extend(zip(t["update"].to_pylist(), t["staleness"].to_pylist(), strict=True))
    return sorted(rows)


def _weights_diff(run_dir: Path, ref_dir: Path, num_stages: int) -> list[str]:
    from safetensors.torch import load_file

    name = Path("policies") / f"stage={num_stages}" / "model.safetensors"
    if not (run_dir / name).exists():
        return [f"no final policy {name}"]
    a, b = load_file(str(run_dir / name)), load_file(str(ref_dir / name))
    if a.keys() != b.keys():
        return [f"final policy tensors differ in names: {sorted(a.keys() ^ b.keys())[:5]}"]
    return [f"final weight {k} differs from the uninterrupted run" for k in sorted(a) if not a[k].equal(b[k])]


def _plans(run_dir: Path, num_stages: int) -> dict[int, PromptPlan]:
    out = {}
    for k in range(num_stages):
        f = run_dir / "jobs" / f"stage={k}" / "generate.plan.json"
        if f.exists():
            out[k] = PromptPlan.model_validate_json(f.read_text())
    return out


def plan_problems(run_dir: Path, num_stages: int) -> list[str]:
    """The plan invariants of one run, checked against its own plans: one line per stage without a plan, per prompt
    scheduled twice in an epoch, per stage whose rollouts are not of exactly its planned prompts."""
    plans = _plans(run_dir, num_stages)
    problems = [f"stage {k} has no prompt plan" for k in range(num_stages) if k not in plans]
    problems += epoch_overlaps(plans.values())
    sampled: dict[int, set[str]] = {}
    for stage, prompt_id, _, probe in rollout_keys(run_dir):
        if not probe:
            sampled.setdefault(stage, set()).add(prompt_id)
    for k, plan in sorted(plans.items()):
        got, planned = sampled.get(k, set()), set(plan.prompt_ids)
        if got - planned:
            problems.append(f"stage {k}: rollouts of prompts outside its plan, e.g. {sorted(got - planned)[:3]}")
        if planned - got:
            problems.append(f"stage {k}: planned prompts without rollouts, e.g. {sorted(planned - got)[:3]}")
    return problems


@dataclass
class RunCheck:
    """The invariants' outcome: counts and one line per difference (empty ``problems`` = every invariant holds)."""

    lost: int = 0
    duplicated: int = 0
    weights_equal: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every invariant holds."""
        return not self.problems


def check_run(run_dir: Path, ref_dir: Path, num_stages: int) -> RunCheck:
    """Check the killed-and-resumed run in ``run_dir`` against the uninterrupted ``ref_dir`` (same config, run id).

    Returns:
        A :class:`RunCheck`; ``problems`` names each broken invariant (stage, key, update, tensor).
    """
    out = RunCheck()
    missing = [k for k in range(num_stages) if not (run_dir / "stages" / f"stage={k}.json").exists()]
    if missing:
        out.problems.append(f"run incomplete: no stage manifest for stages {missing}")
    keys, ref = rollout_keys(run_dir), rollout_keys(ref_dir)
    out.lost = sum(1 for k in ref if k not in keys)
    out.duplicated = sum(n - 1 for n in keys.values() if n > 1)
    extra = [k for k in keys if k not in ref]
    if out.lost:
        out.problems.append(f"{out.lost} rollouts lost, e.g. {next(k for k in ref if k not in keys)}")
    if out.duplicated:
        out.problems.append(f"{out.duplicated} duplicated rollouts, e.g. {next(k for k, n in keys.items() if n > 1)}")
    if extra:
        out.problems.append(f"{len(extra)} rollouts the uninterrupted run does not have, e.g. {extra[0]}")
    versions, ref_versions = _policy_versions(run_dir), _policy_versions(ref_dir)
    changed = [k for k, v in ref_versions.items() if k in versions and versions[k] != v]
    if changed:
        out.problems.append(f"policy_version changed by the resumes for {len(changed)} rollouts, e.g. {changed[0]}")
    updates, ref_updates = train_updates(run_dir), train_updates(ref_dir)
    numbers = [u for u, _ in updates]
    if numbers != list(range(1, len(ref_updates) + 1)):
        repeats = sorted(u for u, n in Counter(numbers).items() if n > 1)
        gaps = sorted(set(range(1, len(ref_updates) + 1)) - set(numbers))
        out.problems.append(f"train_steps updates not 1..{len(ref_updates)}: repeated {repeats}, missing {gaps}")
    elif updates != ref_updates:
        diff = [(u, s, r) for (u, s), (_, r) in zip(updates, ref_updates, strict=True) if s != r]
        out.problems.append(f"staleness changed by the resumes at updates {[u for u, _, _ in diff]}")
    out.problems.extend(plan_problems(run_dir, num_stages))
    plans, ref_plans = _plans(run_dir, num_stages), _plans(ref_dir, num_stages)
    differ = [k for k in ref_plans if k in plans and plans[k].prompt_ids != ref_plans[k].prompt_ids]
    if differ:
        out.problems.append(f"prompt plans of stages {differ} differ from the uninterrupted run's")
    weights = _weights_diff(run_dir, ref_dir, num_stages)
    out.weights_equal = not weights
    out.problems.extend(weights[:5])
    return out
