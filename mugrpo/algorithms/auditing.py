"""What an algorithm gives the harness audit (:mod:`mugrpo.audit`): a query over its run, its findings, and a
helper for repeated draws."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

# ----------------------------------------------------------------------------------------------------------- audit

#: ``rows(sql) -> [row dict, ...]``: a DuckDB query over one run's views (rollouts, train_steps, evals, and each
#: algorithm's tables), as :mod:`mugrpo.audit` runs it.
RunQuery = Callable[[str], list[dict[str, Any]]]


@dataclass(frozen=True)
class AuditFindings:
    """An algorithm's evidence for the harness audit's batches check (:mod:`mugrpo.audit.batches`; "Probe the
    Harness", arXiv 2610.02911), read from its own tables.

    Attributes:
        problems: failing findings (e.g. a replay queue drawing the same rollouts update after update).
        notes: passing evidence, shown in the check's detail.
    """

    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def longest_repeat(ids: Sequence[tuple[int, str]]) -> tuple[int, int, str]:
    """(length, first update, id) of the longest run of equal consecutive ids in ``[(update, id), ...]``
    ((0, 0, "") when empty)."""
    best: tuple[int, int, str] = (0, 0, "")
    for ident, members in groupby(ids, key=lambda x: x[1]):
        members = list(members)
        if len(members) > best[0]:
            best = (len(members), members[0][0], ident)
    return best
