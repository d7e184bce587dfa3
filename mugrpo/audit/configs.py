"""Configs ("Probe the Harness", arXiv 2610.02911): compared runs must differ only in what the comparison varies.

Rule: the resolved configs stored in the runs' run.json are compared with the first run given, key by key
(:func:`mugrpo.config_keys.config_changes`). Operational keys (where and how a run executes, never its results:
:mod:`mugrpo.config_keys`) and the run's identity (``run.id``) are ignored. Every other differing key must be named by
``--vary KEY`` (a key or a section above it: ``--vary train`` covers ``train.lr``); each other one is reported with
both values. One run alone is not checked.
"""

from __future__ import annotations

import json

from mugrpo.audit.result import FAIL, NOT_CHECKED, PASS, AuditRun, CheckResult

NAME = "configs"
#: Semantic keys that name a run rather than what it computes.
IDENTITY_KEYS = frozenset({"run.id"})


def _named(key: str, vary: list[str]) -> bool:
    return any(key == v or key.startswith(v + ".") for v in vary)


def _show(value) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def check(runs: list[AuditRun], options) -> list[CheckResult]:
    """One configs row per run: its unexpected semantic differences from the first run."""
    from mugrpo.config import Config
    from mugrpo.config_keys import config_changes

    if len(runs) == 1:
        return [CheckResult(NAME, runs[0].run_id, NOT_CHECKED, "one run: nothing to compare")]
    base = runs[0]
    base_json = base.cfg.to_json_dict()
    out = [CheckResult(NAME, base.run_id, PASS, "the reference the other runs are compared with")]
    vary = list(options.vary)
    for run in runs[1:]:
        changes = [
            c
            for c in config_changes(base_json, run.cfg.to_json_dict(), Config)
            if c.semantic and c.key not in IDENTITY_KEYS
        ]
        varied = [c.key for c in changes if _named(c.key, vary)]
        unexpected = [c for c in changes if not _named(c.key, vary)]
        values = {
            "varied": varied,
            "unexpected": [{"key": c.key, base.run_id: c.old, run.run_id: c.new} for c in unexpected],
        }
        if unexpected:
            shown = "; ".join(f"{c.key}: {_show(c.old)} ({base.run_id}) vs {_show(c.new)}" for c in unexpected)
            out.append(
                CheckResult(NAME, run.run_id, FAIL, f"differs from {base.run_id} beyond --vary: {shown}", values)
            )
        else:
            what = ", ".join(varied) or "nothing"
            out.append(CheckResult(NAME, run.run_id, PASS, f"differs from {base.run_id} in {what} only", values))
    return out
