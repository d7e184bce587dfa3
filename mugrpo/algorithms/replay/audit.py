"""The replay buffer's evidence for the harness audit ("Probe the Harness", arXiv 2610.02911, the stuck batch: a
replay queue served its first batch for 33 updates), read from the ``replay`` table (one row per rollout an update
used, fresh or replayed, with its age: :mod:`mugrpo.algorithms.replay.records`).

Rules (:class:`mugrpo.algorithms.auditing.AuditFindings`):

- the set of replayed rollouts an update draws is not the previous update's set more than ``max_repeat`` times in a
  row (the draw's identity is :func:`schemas.tables.batch_identity` of its rollout keys);
- every replayed rollout's age (updates since its behavior policy) is <= ``replay.tau_max``.

The data-order fingerprint gets one line per update: the keys of every rollout it used, in key order.
"""

from __future__ import annotations

from mugrpo.algorithms.auditing import AuditFindings, RunQuery, longest_repeat
from mugrpo.algorithms.replay.config import ReplayConfig
from schemas.tables import batch_identity

_KEY_SQL = "rollout_stage || '/' || prompt_id || '/' || sample_idx"


def audit_batches(config: ReplayConfig, rows: RunQuery, max_repeat: int) -> AuditFindings | None:
    """The two rules of the module docstring over the run's ``replay`` table; None when replay is off."""
    if not config.enabled:
        return None
    drawn = [
        (r["update"], batch_identity(r["keys"]))
        for r in rows(
            f'SELECT "update", list({_KEY_SQL}) AS keys FROM replay WHERE replayed GROUP BY "update" ORDER BY "update"'
        )
    ]
    if not drawn:
        return AuditFindings(notes=("replay on but no replayed rollout drawn: draws not checked",))
    problems = []
    length, first, ident = longest_repeat(drawn)
    if length > max_repeat:
        problems.append(f"replay drew the same rollouts {ident} {length} times in a row from update {first}")
    old = rows(
        f'SELECT "update", max(age) AS age FROM replay WHERE replayed AND age > {int(config.tau_max)} '
        'GROUP BY "update" ORDER BY "update"'
    )
    if old:
        problems.append(
            f"replayed age above tau_max={config.tau_max} at {len(old)} update(s) "
            f"(first: update {old[0]['update']}, age {old[0]['age']})"
        )
    note = f"{len(drawn)} replay draws from the replay table, longest repeat {length}, ages <= tau_max={config.tau_max}"
    return AuditFindings(problems=tuple(problems), notes=() if problems else (note,))


def audit_order(config: ReplayConfig, rows: RunQuery) -> list[str]:
    """One fingerprint line per update of the ``replay`` table ([] when replay is off)."""
    if not config.enabled:
        return []
    keyed = rows(
        f"SELECT \"update\", string_agg({_KEY_SQL}, ',' ORDER BY rollout_stage, prompt_id, sample_idx) AS keys "
        'FROM replay GROUP BY "update" ORDER BY "update"'
    )
    return [f"replay {r['update']}: {r['keys']}" for r in keyed]
