"""Batches ("Probe the Harness", arXiv 2610.02911, the stuck batch: a replay queue served its first batch for 33
updates).

The batch identity of each update, in update order, comes from the first source the run has:

1. ``train_steps.batch_id`` (logged by the trainer: fresh and replayed rollouts);
2. else (runs before train_steps v4) the trainer's minibatch plan rebuilt from the committed rollouts and the stored
   seed (:mod:`mugrpo.audit.plan`): the order the seed plans, which is what the trainer draws (its data order is a
   pure function of seed and data), hashed the same way (:func:`schemas.tables.batch_identity`); fresh rollouts only.

Rules:

- no batch identity repeats more than ``--max-repeat N`` (default 1) times in a row within the run;
- each algorithm on in the run adds its own evidence from its own tables
  (:meth:`mugrpo.algorithms.Algorithm.audit_batches`; e.g. the replay buffer: its draws distinct in a row, every
  replayed age <= ``replay.tau_max``).
"""

from __future__ import annotations

from mugrpo.algorithms import ALGORITHMS, longest_repeat, sections_of
from mugrpo.audit.plan import stage_plan
from mugrpo.audit.result import FAIL, NOT_CHECKED, PASS, AuditRun, CheckResult
from schemas.tables import batch_identity as batch_id

NAME = "batches"


def batch_ids(run: AuditRun) -> tuple[list[tuple[int, str]], str]:
    """(``[(update, batch id), ...]`` in update order, the source used) (module docstring)."""
    if run.has_values("train_steps", "batch_id"):
        rows = run.rows('SELECT "update", batch_id FROM train_steps WHERE batch_id IS NOT NULL ORDER BY "update"')
        return [(r["update"], r["batch_id"]) for r in rows], "train_steps.batch_id"
    steps = run.rows('SELECT stage, stage_update, "update" FROM train_steps ORDER BY "update"')
    ids, plans = [], {}
    for r in steps:
        if r["stage"] not in plans:
            plans[r["stage"]] = stage_plan(run, r["stage"])
        ids.append((r["update"], batch_id(plans[r["stage"]].keys(r["stage_update"]))))
    return ids, "minibatch plan rebuilt from seed and rollouts"


def check_run(run: AuditRun, max_repeat: int) -> CheckResult:
    """The batch rules (module docstring) on one run."""
    ids, source = batch_ids(run)
    if not ids:
        return CheckResult(NAME, run.run_id, NOT_CHECKED, "no updates logged")
    problems = []
    length, first, ident = longest_repeat(ids)
    if length > max_repeat:
        problems.append(f"batch {ident} served {length} times in a row from update {first} (max {max_repeat})")
    detail = [f"{len(ids)} updates ({source}), longest repeat {length}"]
    for name, section in sections_of(run.cfg).items():
        found = ALGORITHMS[name].audit_batches(section, run.rows, max_repeat)
        if found is not None:
            problems += found.problems
            detail += found.notes
    values = {"source": source, "longest_repeat": length, "batch_ids": [i for _, i in ids]}
    if problems:
        return CheckResult(NAME, run.run_id, FAIL, "; ".join(problems), values)
    return CheckResult(NAME, run.run_id, PASS, "; ".join(detail), values)


def check(runs: list[AuditRun], options) -> list[CheckResult]:
    """One batches row per run."""
    return [check_run(r, options.max_repeat) for r in runs]
