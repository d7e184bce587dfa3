"""Seeds and data order ("Probe the Harness", arXiv 2610.02911, the lost seed: one arm's "three seeds" replayed one
data order).

The data-order fingerprint of a run is sha256 over what the run committed about its order, stage by stage:

- the stage's prompt plan (``jobs/stage={k}/generate.plan.json``: the prompts sampled, in shard order); for a stage
  without a plan (an older run), its distinct rollout prompt ids, sorted;
- when the run logs a batch identity per update (``train_steps.batch_id``), the sequence of batch ids;
- the lines each algorithm on in the run adds about the order it decides
  (:meth:`mugrpo.algorithms.Algorithm.audit_order`; e.g. the replay buffer: the rollout keys each update used, in
  update order).

Rule, across the runs given: two runs whose resolved ``run.seed`` differs must differ in fingerprint; with
``--same-order``, all runs must share one fingerprint. One run alone is not checked (its fingerprint is shown).
"""

from __future__ import annotations

import hashlib

from mugrpo.algorithms import ALGORITHMS, excluding_columns, sections_of
from mugrpo.audit.result import FAIL, NOT_CHECKED, PASS, AuditRun, CheckResult
from mugrpo.commits.exclusion import training_rows_sql

NAME = "data-order"


def fingerprint(run: AuditRun) -> tuple[str, list[str]]:
    """(sha256 hex of the run's data order, the sources it covers) (module docstring).

    Raises:
        mugrpo.sql.SqlError: a view cannot be read.
    """
    from mugrpo.provenance.prompt_plan import read_plan

    digest = hashlib.sha256()
    sources = set()
    stages = [r["stage"] for r in run.rows("SELECT DISTINCT stage FROM rollouts ORDER BY stage")]
    for stage in stages:
        plan = read_plan(run.store, run.run_id, stage)
        if plan is not None:
            ids, sources = plan.prompt_ids, sources | {"prompt plans"}
        else:
            ids = [
                r["prompt_id"]
                for r in run.rows(
                    f"SELECT DISTINCT prompt_id FROM rollouts WHERE stage = {int(stage)} "
                    f"AND {training_rows_sql(excluding_columns(), run.columns('rollouts'))} ORDER BY prompt_id"
                )
            ]
            sources.add("rollout prompt ids")
        digest.update(f"stage {stage}: {','.join(ids)}\n".encode())
    if run.has_values("train_steps", "batch_id"):
        for r in run.rows('SELECT "update", batch_id FROM train_steps ORDER BY "update"'):
            digest.update(f"update {r['update']}: {r['batch_id']}\n".encode())
        sources.add("batch ids")
    for name, section in sections_of(run.cfg).items():
        lines = ALGORITHMS[name].audit_order(section, run.rows)
        for line in lines:
            digest.update(f"{line}\n".encode())
        if lines:
            sources.add(f"{name} draws")
    return digest.hexdigest(), sorted(sources)


def check(runs: list[AuditRun], options) -> list[CheckResult]:
    """One data-order row per run, with its fingerprint (``values["fingerprint"]``)."""
    prints = {r.run_id: fingerprint(r) for r in runs}
    seeds = {r.run_id: r.cfg.run.seed for r in runs}
    out = []
    for run in runs:
        fp, sources = prints[run.run_id]
        values = {"fingerprint": fp, "seed": seeds[run.run_id], "sources": sources}
        short = f"fingerprint {fp[:16]} (seed {seeds[run.run_id]}; {', '.join(sources) or 'no data'})"
        if len(runs) == 1:
            out.append(CheckResult(NAME, run.run_id, NOT_CHECKED, f"{short}; one run: nothing to compare", values))
            continue
        problems = []
        for other in runs:
            if other.run_id == run.run_id:
                continue
            ofp = prints[other.run_id][0]
            if seeds[other.run_id] != seeds[run.run_id] and ofp == fp:
                problems.append(
                    f"same data order as {other.run_id} although the seeds differ "
                    f"({seeds[run.run_id]} vs {seeds[other.run_id]}): lost seed"
                )
            if options.same_order and ofp != fp:
                problems.append(f"--same-order: order differs from {other.run_id} ({ofp[:16]})")
        status = FAIL if problems else PASS
        out.append(CheckResult(NAME, run.run_id, status, "; ".join([short, *problems]), values))
    return out
