"""Continuing a run: what may differ from how it started, what is refused, and what run.json records.

A run's ``run.json`` holds the config it runs with, the fingerprints of every input it reads
(:mod:`mugrpo.provenance.fingerprint`) and a ``history``: one entry per start and resume, with the stage it began at,
the code version, and every accepted config change. Re-running a run id (``mugrpo run CONFIG``, ``mugrpo resume RUN
[key=value ...]``) first checks, in this order:

1. **config**: a changed semantic key (:mod:`mugrpo.config_keys`) is refused; changed operational keys are accepted
   and recorded with the stage they take effect at (the first stage not committed);
   ``auto`` precision keys take the run's recorded values (:mod:`mugrpo.config.precision`), so a run keeps the
   precision it started with on any machine; a new run resolves them on this machine;
2. **inputs**: every input is fingerprinted again (every byte is read: size and mtime never decide that a file is
   unchanged); one whose content changed, or that is gone, is refused, naming the file, the recorded and current
   sha256 and the way out (restore the file, or start a new run id);
3. **moments**: the training the run continues with does not start from AdamW moments that
   ``train.keep_optimizer_state`` pruned (after a rollback; :func:`refuse_pruned_moments`).

Refusals are :class:`RunRefused` errors: one block of text, nothing written. The command line checks before it
starts Prefect (:func:`check_resume`), so a refusal is printed once with exit code 2 (3 for pruned moments, the
run's state); the run flow checks again
under the run lease (:func:`mugrpo.orchestration.runs.init_run`) and only then writes run.json (:func:`record_resume`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mugrpo.common.exit_codes import ExitCode, exit_code_for
from mugrpo.common.version import code_version
from mugrpo.config import Config, apply_overrides, config_from_dict
from mugrpo.config.precision import CHOICES as PRECISION_KEYS
from mugrpo.config.precision import ResolvedPrecision, resolve_precision
from mugrpo.config_keys import ConfigChange, config_changes, format_changes
from mugrpo.provenance.fingerprint import InputFingerprint, changed_inputs_message, run_inputs
from mugrpo.provenance.refusals import InputChangedError as InputChangedError  # re-exported: callers catch it from here
from mugrpo.provenance.refusals import RunRefused as RunRefused
from mugrpo.provenance.refusals import plural as _n
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store


class ConfigMismatchError(RunRefused):
    """A run id already exists with a config that differs in a semantic key; the message lists the changed keys
    by class."""


@dataclass
class ResumeCheck:
    """What :func:`check_resume` found: the stored run.json (None for a new run), the accepted operational
    changes, the inputs' current fingerprints, the first stage not committed, and the precision the run computes
    in (the concrete config, with ``auto`` resolved or kept from run.json)."""

    doc: dict[str, Any] | None
    changes: list[ConfigChange] = field(default_factory=list)
    inputs: dict[str, InputFingerprint] = field(default_factory=dict)
    stage: int = 0
    precision: ResolvedPrecision | None = None

    @property
    def config(self) -> Any:
        """The concrete config the run continues with (None before precision was resolved)."""
        return self.precision.config if self.precision is not None else None

    @property
    def new(self) -> bool:
        return self.doc is None


def first_open_stage(store: Store, run_id: str, num_stages: int) -> int:
    """The first stage without a stage manifest (``num_stages`` when every stage is committed)."""
    from mugrpo.commits.verify import open_stage

    return open_stage(store, RunLayout(run_id), num_stages)


def stored_config(store: Store, run_id: str) -> dict[str, Any]:
    """run.json's config as this version of the code reads it: keys added since it was written get defaults.

    Raises:
        mugrpo.config.ConfigError: the stored config no longer validates (a key was removed); names key and file.
    """

    rel = RunLayout(run_id).run_json
    return config_from_dict(store.read_json(rel)["config"], source=store.uri(rel)).to_json_dict()


def check_resume(store: Store, cfg: Any, *, forking: bool = False) -> ResumeCheck:
    """Check that run ``cfg.run.id`` can start or continue with config ``cfg`` (a :class:`mugrpo.config.Config`);
    reads only. A fork (``run.parent``) is also checked against what it references of its parent
    (:func:`mugrpo.orchestration.fork.check_lineage`); ``forking``: the check of ``mugrpo fork`` itself, before the
    fork's run.json exists.

    Raises:
        ConfigMismatchError: a semantic key differs from run.json's config.
        InputChangedError: an input's content differs from its recorded fingerprint, or an input is missing.
        mugrpo.orchestration.fork.ForkRefused: a new run names a parent (only ``mugrpo fork`` makes forks), or a
            fork's parent files are gone or changed.
    """
    from mugrpo.orchestration.fork import check_lineage

    layout = cfg.layout
    uri = store.uri(layout.run_dir)
    if not store.exists(layout.run_json):
        if not forking:
            check_lineage(store, cfg, None)  # a new run naming a parent by hand: refused
        inputs = _fingerprints(cfg, {}, uri, starting=True)
        return ResumeCheck(doc=None, inputs=inputs, precision=resolve_precision(cfg))
    doc = store.read_json(layout.run_json)
    check_lineage(store, cfg, doc)
    stored = stored_config(store, cfg.run.id)
    precision = resolve_precision(cfg, stored=config_from_dict(stored, source=store.uri(layout.run_json)))
    cfg = precision.config
    changes = config_changes(stored, cfg.to_json_dict(), Config)
    semantic = [c for c in changes if c.semantic]
    if semantic:
        kept = [k for k in PRECISION_KEYS if any(c.key == k for c in semantic)]
        raise ConfigMismatchError(
            "\n".join(
                [
                    f"run {cfg.run.id!r} at {uri} cannot continue with this config: {_n(semantic, 'semantic key')} "
                    f"{'differs' if len(semantic) == 1 else 'differ'} from its run.json:",
                    *format_changes(changes),
                    *(
                        [
                            "Precision is fixed for the life of a run: leave "
                            + ", ".join(kept)
                            + " at auto (the run keeps what it recorded at its start)."
                        ]
                        if kept
                        else []
                    ),
                    f"Nothing was changed. Continue it with its stored config (`mugrpo resume {uri}`, which accepts "
                    "operational key=value overrides), or start a new run with another run.id.",
                ]
            )
        )
    recorded = {role: InputFingerprint.model_validate(fp) for role, fp in (doc.get("inputs") or {}).items()}
    current = _fingerprints(cfg, recorded, uri, starting=False)
    changed = [(recorded[r], current[r]) for r in recorded if r in current and _differs(recorded[r], current[r])]
    if changed:
        raise InputChangedError(changed_inputs_message(cfg.run.id, uri, changed))
    stage = first_open_stage(store, cfg.run.id, cfg.run.num_stages)
    refuse_pruned_moments(store, cfg, stage)
    return ResumeCheck(doc=doc, changes=changes, inputs=current, stage=stage, precision=precision)


class MomentsPrunedError(RunRefused):
    """The training a resume begins with would start from AdamW moments that ``train.keep_optimizer_state`` pruned
    (after a rollback to before an older stage); the message names the checkpoint, the key and the way out."""

    @property
    def exit_code(self) -> ExitCode:
        """3, STATE_REFUSES: the run's state refuses it (this class's row in :mod:`mugrpo.common.exit_codes`)."""
        return exit_code_for(type(self))


def refuse_pruned_moments(store: Store, cfg: Any, stage: int) -> None:
    """Refuse to continue run ``cfg`` at ``stage`` (its first stage not committed) when the checkpoint its training
    starts from has had its optimizer state pruned (:mod:`mugrpo.commits.retention`): the stage's own latest
    checkpoint, else the previous stage's final one (the moments it carries over). Fresh moments are never taken
    silently in their place: a fork with ``--fresh-optimizer`` is how a user asks for them. A fork's first stage
    reads its parent's checkpoint, checked by :func:`mugrpo.orchestration.fork.check_lineage`. Reads one or two
    folder listings and markers.

    Raises:
        MomentsPrunedError: names the checkpoint, the reason recorded and the ways out.
    """
    from mugrpo.commits.manifest import latest_checkpoint
    from mugrpo.commits.retention import KEY, optimizer_pruned

    if stage >= cfg.run.num_stages:
        return
    layout, first = cfg.layout, (cfg.run.parent.stage if cfg.run.parent is not None else 0)
    own = latest_checkpoint(store, layout, stage)
    source = (stage, own) if own is not None else None
    if source is None and stage > first:
        previous = latest_checkpoint(store, layout, stage - 1)
        source = (stage - 1, previous) if previous is not None else None
    if source is None:
        return
    rel = layout.checkpoint_dir(*source)
    record = optimizer_pruned(store, rel)
    if record is None:
        return
    uri = store.uri(layout.run_dir)
    raise MomentsPrunedError(
        f"run {cfg.run.id!r} at {uri} cannot continue at stage {stage}: its training starts from the AdamW moments "
        f"of {store.uri(rel)}, which were pruned ({record.get('reason', KEY)}; its _COMPLETE marker records it), "
        "as happens after a rollback to before a stage whose moments the retention no longer kept. Nothing was "
        f"written. To redo stage {stage} from fresh moments, fork the run there: `mugrpo fork {uri} --at-stage "
        f"{stage} --id NEW --fresh-optimizer` (recorded in the fork's run.json). A run keeps the moments a rollback "
        f"or a fork needs with {KEY}=all (or a larger N), set before the later stages commit."
    )


def _differs(old: InputFingerprint, new: InputFingerprint) -> bool:
    """The input's bytes differ, or (the training set) the problems it yields do."""
    if old.sha256 != new.sha256:
        return True
    return None not in (old.problems_sha256, new.problems_sha256) and old.problems_sha256 != new.problems_sha256


def _fingerprints(cfg: Any, recorded: dict[str, InputFingerprint], uri: str, *, starting: bool):
    from mugrpo.data.datasets import DatasetError

    try:
        return run_inputs(cfg, recorded)
    except DatasetError as e:  # a bad training row: names the file and line
        raise RunRefused(
            f"{'cannot start' if starting else 'cannot continue'} run {cfg.run.id!r} at {uri}: {e}"
        ) from None
    except FileNotFoundError as e:
        if starting:
            raise InputChangedError(f"cannot start run {cfg.run.id!r} at {uri}: an input is missing: {e}") from None
        raise InputChangedError(
            f"run {cfg.run.id!r} at {uri} cannot continue: an input it was started with is missing: {e}\n"
            "Nothing was changed. Restore it where the run's config names it (run.json holds its recorded "
            "sha256), or start a new run with another run.id."
        ) from None


def record_resume(store: Store, cfg: Any, check: ResumeCheck, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write run.json after a passed :func:`check_resume`: a new run's document (config, code version, input
    fingerprints, a ``start`` history entry), or, for an existing run, the config with the accepted operational
    changes, the inputs' current fingerprints and a ``resume``
    history entry with the stage it begins at and the changes. The config written is the concrete one (``auto``
    precision resolved); a new run also records the ``precision`` block (choice, reason, probe figures), and each
    resume records the resuming machine's verdict in its history entry. Returns the document."""
    if check.precision is not None:
        cfg = check.precision.config
    now = datetime.now(UTC).isoformat()
    inputs = {role: fp.model_dump(mode="json") for role, fp in check.inputs.items()}
    event = {
        "event": "start" if check.new else "resume",
        "at": now,
        "stage": check.stage,
        "code_version": code_version(),
    }
    if check.new:
        doc = {"run_id": cfg.run.id, "created_at": now, "code_version": code_version(), "config": cfg.to_json_dict()}
        if check.precision is not None:
            doc["precision"] = check.precision.record
        doc.update(inputs=inputs, history=[event])
        doc.update({k: v for k, v in (extra or {}).items() if v is not None})  # a fork's lineage (and precision)
    else:
        doc = dict(check.doc)
        if check.changes:
            event["changes"] = [c.record() for c in check.changes]
        if check.precision is not None and check.precision.record.get("hardware") is not None:
            event["precision"] = {"hardware": check.precision.record["hardware"], "warning": check.precision.warning}
        if not doc.get("inputs"):
            event["inputs_recorded"] = True  # a run started before inputs were fingerprinted: recorded from here
        doc["config"] = cfg.to_json_dict()
        doc["inputs"] = {**(doc.get("inputs") or {}), **inputs}
        doc["history"] = [*(doc.get("history") or []), event]
    store.write_json(cfg.layout.run_json, doc)
    return doc


def resume_config(stored: Any, overrides: list[str], uri: str) -> Any:
    """The config to resume a run with: its stored config ``stored`` with ``key=value`` overrides, each of which
    must be operational.

    Raises:
        mugrpo.config.ConfigError: an override is malformed, names no key or gives an invalid value.
        ConfigMismatchError: an override changes a semantic key (the message lists every override by class).
    """

    if not overrides:
        return stored
    data = apply_overrides(stored.model_dump(mode="json"), list(overrides))
    new = config_from_dict(data, source=f"{uri}/run.json", overrides=list(overrides))
    changes = config_changes(stored.to_json_dict(), new.to_json_dict(), Config)
    semantic = [c for c in changes if c.semantic]
    if semantic:
        raise ConfigMismatchError(
            "\n".join(
                [
                    f"cannot resume run {stored.run.id!r} at {uri} with {_n(semantic, 'semantic override')}:",
                    *format_changes(changes),
                    "Nothing was changed. Semantic keys are fixed for the life of a run: drop those overrides (the "
                    "operational ones are accepted), or start a new run with another run.id.",
                ]
            )
        )
    return new
