"""Batches ("Probe the Harness", arXiv 2610.02911, the stuck batch: a replay queue served its first batch for 33
updates).

The batch identity of each update, in update order, comes from the first source the run has:

1. ``train_steps.batch_id`` (logged by the trainer);
2. with the replay buffer, the ``replay`` table: the rollouts each update used, fresh and replayed, hashed as
   :func:`mugrpo.audit.plan.batch_id`;
3. else the trainer's minibatch plan rebuilt from the committed rollouts and the stored seed
   (:mod:`mugrpo.audit.plan`): the order the seed plans, which is what the trainer draws (its data order is a pure
   function of seed and data), hashed the same way.

Rules:

- no batch identity repeats more than ``--max-repeat N`` (default 1) times in a row within the run;
- with the replay buffer: the replayed rollouts of an update are not the same set as the previous update's more
  than N times in a row, and every replayed rollout's age is <= ``replay.tau_max`` of the run's config.
"""

from __future__ import annotations

from itertools import groupby

from mugrpo.audit.plan import batch_id, stage_plan
from mugrpo.audit.result import FAIL, NOT_CHECKED, PASS, AuditRun, CheckResult

NAME = "batches"
_KEY_SQL = "rollout_stage || '/' || prompt_id || '/' || sample_idx"


def _longest_run(ids: list[tuple[int, str]]) -> tuple[int, int, str]:
    """(length, first update, id) of the longest run of equal consecutive ids in ``[(update, id), ...]``."""
    best = (0, 0, "")
    for ident, grp in groupby(ids, key=lambda x: x[1]):
        members = list(grp)
        if len(members) > best[0]:
            best = (len(members), members[0][0], ident)
    return best


def _replay_ids(run: AuditRun, replayed_only: bool) -> list[tuple[int, str]]:
    where = "WHERE replayed" if replayed_only else ""
    rows = run.rows(
        f'SELECT "update", list({_KEY_SQL}) AS keys FROM replay {where} GROUP BY "update" ORDER BY "update"'
    )
    return [(r["update"], batch_id(r["keys"])) for r in rows]


def batch_ids(run: AuditRun) -> tuple[list[tuple[int, str]], str]:
    """(``[(update, batch id), ...]`` in update order, the source used) (module docstring)."""
    if run.has_values("train_steps", "batch_id"):
        rows = run.rows('SELECT "update", batch_id FROM train_steps WHERE batch_id IS NOT NULL ORDER BY "update"')
        return [(r["update"], r["batch_id"]) for r in rows], "train_steps.batch_id"
    if run.rows("SELECT count(*) AS n FROM replay")[0]["n"]:
        return _replay_ids(run, replayed_only=False), "replay table"
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
    length, first, ident = _longest_run(ids)
    if length > max_repeat:
        problems.append(f"batch {ident} served {length} times in a row from update {first} (max {max_repeat})")
    detail = [f"{len(ids)} updates ({source}), longest repeat {length}"]
    replay_cfg = getattr(run.cfg, "replay", None)
    if replay_cfg is not None and replay_cfg.enabled:
        drawn = _replay_ids(run, replayed_only=True)
        if drawn:
            rlength, rfirst, rident = _longest_run(drawn)
            if rlength > max_repeat:
                problems.append(f"replay drew the same rollouts {rident} {rlength} times in a row from update {rfirst}")
            old = run.rows(
                f'SELECT "update", max(age) AS age FROM replay WHERE replayed AND age > {int(replay_cfg.tau_max)} '
                'GROUP BY "update" ORDER BY "update"'
            )
            if old:
                problems.append(
                    f"replayed age above tau_max={replay_cfg.tau_max} at {len(old)} update(s) "
                    f"(first: update {old[0]['update']}, age {old[0]['age']})"
                )
            detail.append(f"{len(drawn)} replay draws distinct in a row, ages <= tau_max={replay_cfg.tau_max}")
        else:
            detail.append("replay on but no replayed rollout drawn: draws not checked")
    values = {"source": source, "longest_repeat": length, "batch_ids": [i for _, i in ids]}
    if problems:
        return CheckResult(NAME, run.run_id, FAIL, "; ".join(problems), values)
    return CheckResult(NAME, run.run_id, PASS, "; ".join(detail), values)


def check(runs: list[AuditRun], options) -> list[CheckResult]:
    """One batches row per run."""
    return [check_run(r, options.max_repeat) for r in runs]
