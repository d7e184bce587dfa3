"""The fork part of the run report and of ``mugrpo status`` (``mugrpo fork``, docs/branching.md).

A fork's folder holds data of stages >= K only; the policies of stages 0..K are its parent's (the sibling run
``{root}/{parent_run_id}``). The report shows the parent's held-out accuracy curve (avg@k) for stages <= K and the
fork's own after, and for each policy version both evaluated (the same stage index > K, and the two final
policies) the paired difference fork - parent with its 95% CI clustered by problem
(:func:`mugrpo.evaluation.metrics.paired_difference_ci`, arXiv 2411.00640).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from mugrpo.evaluation.metrics import paired_difference_ci
from mugrpo.sql import connect
from mugrpo.sql.lineage import change_lines
from mugrpo.storage.store import Store

#: Per-problem scores (avg@k of each problem) of every evaluated policy of a run.
SCORES_QUERY = "SELECT stage, benchmark, prompt_id, score FROM eval_problems"


@dataclass
class ForkInfo:
    """What the report shows of a fork: its parent, K, the changed keys and options, and the paired differences
    fork - parent per policy and benchmark (``child_stage``, ``parent_stage``, ``benchmark``, ``problems``,
    ``diff``, ``ci95_low``, ``ci95_high``, ``final``; accuracy in [0, 1])."""

    parent_run_id: str
    parent_uri: str
    stage: int
    changed: list[str]
    reuse_rollouts: bool
    fresh_optimizer: bool
    eval_inherited: bool
    diffs: list[dict] = field(default_factory=list)


def _split(target: str) -> tuple[str, str]:
    parent, _, run_id = target.rstrip("/").rpartition("/")
    return parent or ".", run_id


def read_run_json(target: str, storage_options: dict | None = None) -> dict[str, Any]:
    """The run.json of run folder ``target`` (``ROOT/RUN_ID``), or ``{}`` when it has none.

    Raises:
        OSError: the storage cannot be read; ValueError: run.json is not JSON.
    """
    root, run_id = _split(target)
    store = Store(root, storage_options)
    rel = f"{run_id}/run.json"
    return store.read_json(rel) if store.exists(rel) else {}


def fork_line(lineage: dict[str, Any]) -> str:
    """``mugrpo status``'s line for a fork: ``fork of P at stage K (stages 0..K-1 referenced; changed: train.lr
    5e-06 -> 1e-05)``, from run.json's ``lineage`` block.

    Raises:
        KeyError: the block lacks ``parent_run_id`` or ``stage``.
    """
    k = int(lineage["stage"])
    changed = ", ".join(change_lines(lineage, sep=" ")) or "nothing"
    flags = [name for name in ("reuse_rollouts", "fresh_optimizer") if lineage.get(name)]
    extra = f"; {', '.join(flags)}" if flags else ""
    return f"fork of {lineage['parent_run_id']} at stage {k} (stages 0..{k - 1} referenced; changed: {changed}{extra})"


def _final_stage(doc: dict[str, Any], scores: dict) -> int | None:
    """The stage index of a run's final policy: ``run.num_stages`` of its config, else its last evaluated stage."""
    n = ((doc.get("config") or {}).get("run") or {}).get("num_stages")
    return int(n) if n is not None else max((k for k, _ in scores), default=None)


def _scores(target: str, storage_options: dict | None) -> dict[tuple[int, str], dict[str, float]]:
    with connect(target, storage_options) as cat:
        rows = cat.arrow(SCORES_QUERY).to_pylist()
    out: dict[tuple[int, str], dict[str, float]] = {}
    for r in rows:
        out.setdefault((r["stage"], r["benchmark"]), {})[r["prompt_id"]] = r["score"]
    return out


def _diff(a: dict[str, float], b: dict[str, float]) -> dict | None:
    try:
        ci = paired_difference_ci(a, b)
    except ValueError:  # no problem in common
        return None
    return {"problems": ci.n, "diff": ci.mean, "ci95_low": ci.low, "ci95_high": ci.high}


def collect_fork(
    target: str, storage_options: dict | None, evals: list[dict], evals_query: str
) -> tuple[list[dict], ForkInfo] | None:
    """For a fork: the report's per-policy eval rows with the parent's for stages <= K (marked ``from_parent``) and
    the fork's own after (their gain over stage 0 paired against the parent's base policy), and the
    :class:`ForkInfo`. None for a run that is not a fork.

    Args:
        target: the fork's folder ``ROOT/RUN_ID``; its parent is read at ``ROOT/{parent_run_id}``.
        evals: the fork's own rows of ``evals_query`` (the report's per-policy eval query).

    Raises:
        TargetError: the parent's folder is missing or unreadable.
    """
    doc = read_run_json(target, storage_options)
    lineage = doc.get("lineage")
    if not lineage:
        return None
    root, _ = _split(target)
    parent_id, k = str(lineage["parent_run_id"]), int(lineage["stage"])
    parent_target = f"{root.rstrip('/')}/{parent_id}"
    with connect(parent_target, storage_options) as cat:
        parent_evals = cat.arrow(evals_query).to_pylist()
        parent_uri = cat.target.url
    parent_scores, child_scores = _scores(parent_target, storage_options), _scores(target, storage_options)
    rows = [{**e, "from_parent": True} for e in parent_evals if e["stage"] <= k]
    for e in evals:
        if e["stage"] > k:
            row = {**e, "from_parent": False}
            if row.get("gain") is None and (0, e["benchmark"]) in parent_scores:
                gain = _diff(child_scores.get((e["stage"], e["benchmark"]), {}), parent_scores[(0, e["benchmark"])])
                if gain:
                    row.update(gain=gain["diff"], gain_low=gain["ci95_low"], gain_high=gain["ci95_high"])
            rows.append(row)
    rows.sort(key=lambda r: (r["stage"], r["benchmark"]))
    info = ForkInfo(
        parent_id,
        parent_uri,
        k,
        change_lines(lineage),
        bool(lineage.get("reuse_rollouts")),
        bool(lineage.get("fresh_optimizer")),
        bool(lineage.get("eval_inherited")),
    )
    child_final = _final_stage(doc, child_scores)
    parent_final = _final_stage(read_run_json(parent_target, storage_options), parent_scores)
    pairs = {(s, s) for s, _ in child_scores if s > k and any(p == s for p, _ in parent_scores)}
    if child_final is not None and parent_final is not None:
        pairs.add((child_final, parent_final))
    for cs, ps in sorted(pairs):
        for bench in sorted({b for s, b in child_scores if s == cs} & {b for s, b in parent_scores if s == ps}):
            d = _diff(child_scores[(cs, bench)], parent_scores[(ps, bench)])
            if d:
                final = cs == child_final and ps == parent_final
                info.diffs.append({"child_stage": cs, "parent_stage": ps, "benchmark": bench, **d, "final": final})
    return rows, info


def lineage_section(info: ForkInfo | None, table) -> str:
    """The report's "Lineage" section (HTML) of a fork, '' for a run of its own; ``table(headers, rows)`` renders
    a table as the rest of the report does."""
    if info is None:
        return ""
    rows = [
        [
            "final" if d["final"] else f"stage {d['child_stage']}",
            d["child_stage"],
            d["parent_stage"],
            d["benchmark"],
            d["problems"],
            f"{d['diff']:+.3f} [{d['ci95_low']:.3f}, {d['ci95_high']:.3f}]",
        ]
        for d in info.diffs
    ]
    changed = "".join(f"<li><code>{html.escape(c)}</code></li>" for c in info.changed) or "<li>nothing</li>"
    diffs = (
        table(["policy", "fork stage", "parent stage", "benchmark", "problems", "fork - parent [paired 95% CI]"], rows)
        if rows
        else "<p>No policy version evaluated by both runs yet.</p>"
    )
    return (
        f"<h2>Lineage</h2>\n<p>Fork of <code>{html.escape(info.parent_run_id)}</code> "
        f"(<code>{html.escape(info.parent_uri)}</code>) at stage {info.stage}: stages 0..{info.stage - 1} are the "
        f"parent's, referenced, and the per-stage rows marked (parent) come from its evals. Rollouts reused: "
        f"{'yes' if info.reuse_rollouts else 'no'}; fresh optimizer: {'yes' if info.fresh_optimizer else 'no'}; "
        f"evaluation of stage {info.stage} inherited: {'yes' if info.eval_inherited else 'no'}.</p>\n"
        f"<p>Changed keys:</p><ul>{changed}</ul>\n<p>Held-out accuracy (avg@k) of each policy version evaluated by "
        "both, fork - parent on the problems both evaluated, with its 95% CI clustered by problem (paired, arXiv "
        "2411.00640): an interval that excludes 0 is a difference beyond the eval's noise.</p>\n" + diffs
    )
