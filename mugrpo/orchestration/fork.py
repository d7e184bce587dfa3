"""Branching a run at a stage (``mugrpo fork PARENT --at-stage K --id CHILD``, docs/branching.md).

A fork is a run whose stages below K are its parent's committed stages, referenced, never copied, and which computes
stage K on from the parent's policy of stage K and the parent's final checkpoint of stage K-1 (AdamW moments; the LR
schedule and the RNG follow from the stage as in any run; algorithm state from the parent's commits). It lives beside
its parent under the same root. What it holds of its parent:

- **metadata, verbatim**: for each stage k < K, the parent's stage manifest and its job manifests and prompt plan,
  byte for byte, in the fork's own folder (a few KB a stage). A manifest names the run whose files it lists
  (``run_id``), so every reader resolves its files in the parent's folder and checks each against its sha256. The
  sha256 of each copy is recorded in run.json's ``lineage`` block.
- **folders, by reference**: the fork's layout (:class:`mugrpo.storage.layout.RunLayout` with ``parent``) resolves the
  policies of stages 0..K, the checkpoints of stages below K and the algorithms' state files of stages below K into
  the parent's folder.
- **the evaluation of the policy of stage K**, when nothing that decides it changed (the eval, reward, data, model and
  generation keys): the parent's stage-K eval job manifest, verbatim; that policy is the parent's, bit for bit.

With ``reuse_rollouts`` the fork does not sample stage K: its generate job serves the parent's stored stage-K
responses (:mod:`mugrpo.generation.stored`) to the same worker code, which re-scores them with the fork's reward
config and recomputes the group advantages.

Every start of a fork (:func:`check_lineage`) re-reads what it references: the verbatim copies against run.json's
record, the parent's originals (a rolled-back parent is refused), and the folders it builds on (the policy of stage K
and, unless ``fresh_optimizer``, until the fork's stage K has trained, the final checkpoint of stage K-1 with its
AdamW moments, which the parent's ``train.keep_optimizer_state`` may prune once later stages of the parent commit).
``orchestration.verify_on_resume`` then checks every referenced file through the manifests, as for any run
(:mod:`mugrpo.commits.verify`: what the fork's next work reads is re-hashed, the rest checked by the store's word).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mugrpo.commits.manifest import behavior_policy_dir, latest_checkpoint, read_job_manifest, read_manifest
from mugrpo.common.exit_codes import ExitCode
from mugrpo.config_keys import ConfigChange, config_changes
from mugrpo.provenance.refusals import RunRefused
from mugrpo.schedules.stages import stage_plan
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store, sha256_bytes

#: Keys whose change makes the evaluation of the fork stage's policy differ from the parent's: with none of them
#: changed, the fork takes the parent's evaluation of that policy instead of computing it again.
EVAL_KEYS = ("eval.", "reward.", "data.", "model.", "generation.")
#: Keys that decide the behavior distribution a stage samples from (the policy is the parent's): a fork that reuses
#: the parent's rollouts may change none of them (the plan of the fork stage is checked as well).
BEHAVIOR_KEYS = ("model.", "data.", "generation.", "run.seed")
#: Keys no fork may change: the inherited stages were computed with them (the initial policy, the training set and
#: its seeded order; the plan of every inherited stage is checked as well).
INHERITED_KEYS = ("model.", "data.train.", "run.seed")


class ForkRefused(RunRefused):
    """A fork that cannot be made or continued; ``exit_code`` its :class:`~mugrpo.common.exit_codes.ExitCode`
    (ASKED_WRONG, 2: what was asked is wrong; STATE_REFUSES, 3: the parent's state refuses it)."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.ASKED_WRONG) -> None:
        super().__init__(message)
        self.exit_code = ExitCode(exit_code)


@dataclass
class ForkPlan:
    """What :func:`plan_fork` found: the fork's config, the changes against the parent's, and the parent's files
    the fork copies verbatim (run-relative path -> bytes)."""

    config: Any
    parent: Any
    changes: list[ConfigChange]
    copies: dict[str, bytes] = field(default_factory=dict)
    eval_inherited: bool = False


def _starts(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p.rstrip(".") or key.startswith(p) for p in prefixes)


def _refuse_keys(changes: list[ConfigChange], prefixes: tuple[str, ...], why: str, parent_uri: str) -> None:
    bad = [c for c in changes if c.semantic and _starts(c.key, prefixes)]
    if bad:
        lines = "\n".join(f"  {c.line()}" for c in bad)
        raise ForkRefused(
            f"cannot fork {parent_uri}: {why}; {'this key differs' if len(bad) == 1 else 'these keys differ'} from the "
            f"parent:\n{lines}\nNothing was written. Drop the override, or start a new run (`mugrpo run`)."
        )


def plan_fork(
    store: Store,
    parent: Any,
    stage: int,
    child_id: str,
    overrides: list[str],
    *,
    reuse_rollouts: bool = False,
    fresh_optimizer: bool = False,
) -> ForkPlan:
    """Check that run ``parent`` (its stored :class:`mugrpo.config.Config`) can be forked at stage ``stage`` into run
    ``child_id`` with ``overrides``, and compute the fork's config; reads only.

    Raises:
        ForkRefused: one block naming what is wrong: a fork stage out of range, a parent stage below it not
            committed, a parent final checkpoint pruned (without ``fresh_optimizer``), the parent's rollouts of stage
            K not committed (with ``reuse_rollouts``), an existing child run, a parent that is itself a fork, or an
            override of a key the fork cannot change (named).
        mugrpo.config.ConfigError: an override is malformed or invalid.
    """
    from mugrpo.config import Config, apply_overrides, config_from_dict

    playout = parent.layout
    uri = store.uri(playout.run_dir)
    if parent.run.parent is not None:
        raise ForkRefused(
            f"cannot fork {uri}: it is itself a fork of {parent.run.parent.run_id!r} (at stage "
            f"{parent.run.parent.stage}); fork the root run instead. Nothing was written."
        )
    if not 1 <= stage <= parent.run.num_stages:
        raise ForkRefused(
            f"cannot fork {uri} at stage {stage}: the fork stage must be 1..{parent.run.num_stages} (stage 0 is a new "
            "run: `mugrpo run`). Nothing was written."
        )
    if store.exists(RunLayout(child_id).run_json):
        raise ForkRefused(
            f"cannot fork {uri} into {child_id!r}: {store.uri(RunLayout(child_id).run_json)} exists. Pick another "
            f"--id, or continue that run with `mugrpo resume {store.uri(child_id)}`. Nothing was written.",
            ExitCode.STATE_REFUSES,
        )
    missing = [k for k in range(stage) if read_manifest(store, parent.run.id, k) is None]
    if missing:
        raise ForkRefused(
            f"cannot fork {uri} at stage {stage}: its stage {missing[0]} is not committed "
            f"({store.uri(playout.stage_manifest(missing[0]))} is missing); a fork builds on committed stages only. "
            "Nothing was written.",
            ExitCode.STATE_REFUSES,
        )
    data = apply_overrides(parent.model_dump(mode="json"), list(overrides))
    data["run"]["id"] = child_id
    data["run"]["parent"] = {
        "run_id": parent.run.id,
        "stage": stage,
        "reuse_rollouts": reuse_rollouts,
        "fresh_optimizer": fresh_optimizer,
    }
    child = config_from_dict(data, source=f"mugrpo fork {uri}", overrides=list(overrides))
    changes = [c for c in config_changes(parent.to_json_dict(), child.to_json_dict(), Config) if c.key != "run.id"]
    changes = [c for c in changes if not c.key.startswith("run.parent")]
    if child.run.num_stages <= stage:
        raise ForkRefused(
            f"cannot fork {uri} at stage {stage} with run.num_stages={child.run.num_stages}: the fork would have no "
            f"stage of its own; give run.num_stages > {stage}. Nothing was written."
        )
    _refuse_keys(changes, INHERITED_KEYS, f"its stages below {stage} were computed with them", uri)
    if reuse_rollouts:
        _refuse_keys(changes, BEHAVIOR_KEYS, "--reuse-rollouts reuses responses sampled with them", uri)
    _check_plans(parent, child, stage, reuse_rollouts, uri)
    try:
        behavior_policy_dir(store, playout, stage)
    except FileNotFoundError as e:
        raise ForkRefused(
            f"cannot fork {uri} at stage {stage}: {e}. Nothing was written.", ExitCode.STATE_REFUSES
        ) from None
    if not fresh_optimizer and moments_gone(store, parent.run.id, playout, stage - 1):
        raise ForkRefused(
            f"cannot fork {uri} at stage {stage}: the final checkpoint of its stage {stage - 1} (the AdamW moments the "
            f"fork's stage {stage} starts from): {_gone_why(store, playout, stage - 1)}. Fork with --fresh-optimizer "
            "to start the stage from fresh moments (recorded in run.json), or fork at a stage whose checkpoint is kept "
            "(train.keep_optimizer_state=all keeps every stage's). Nothing was written.",
            ExitCode.STATE_REFUSES,
        )
    if reuse_rollouts:
        _refuse_generation_algorithms(parent, uri)  # its shards hold their extra groups
        _refuse_generation_algorithms(child, uri)
        if read_job_manifest(store, parent.run.id, stage, "generate") is None:
            raise ForkRefused(
                f"cannot fork {uri} at stage {stage} with --reuse-rollouts: its stage {stage} has no committed "
                f"rollouts ({store.uri(playout.job_manifest(stage, 'generate'))} is missing). Fork without "
                "--reuse-rollouts to sample the stage. Nothing was written.",
                ExitCode.STATE_REFUSES,
            )
    plan = ForkPlan(config=child, parent=parent, changes=changes)
    for k in range(stage):
        plan.copies.update(_stage_metadata(store, parent.run.id, k))
    eval_job = playout.job_manifest(stage, "eval")
    if not any(_starts(c.key, EVAL_KEYS) for c in changes if c.semantic) and store.exists(eval_job):
        plan.copies[playout.rel(eval_job)] = store.read_bytes(eval_job)
        plan.eval_inherited = True
    return plan


def _check_plans(parent: Any, child: Any, stage: int, reuse: bool, uri: str) -> None:
    """Refuse a fork whose stage plan differs from the parent's for an inherited stage (or, reusing rollouts, for
    the fork stage's prompts)."""
    for k in range(stage + (1 if reuse else 0)):
        mine, theirs = stage_plan(child, k), stage_plan(parent, k)
        same = (mine.prompt_start, mine.num_prompts) == (theirs.prompt_start, theirs.num_prompts)
        if k < stage:
            same = same and (mine.updates, mine.policy_version) == (theirs.updates, theirs.policy_version)
        if not same:
            raise ForkRefused(
                f"cannot fork {uri} at stage {stage}: with these overrides stage {k} would be planned as "
                f"{mine.num_prompts} prompts from {mine.prompt_start} and {mine.updates} updates after "
                f"{mine.policy_version}, but the parent's was {theirs.num_prompts} prompts from {theirs.prompt_start} "
                f"and {theirs.updates} updates after {theirs.policy_version}. A fork may change the sizes of its own "
                "stages only: use run.stage_schedule.name=per_stage with run.stage_schedule.prompts / .updates lists "
                "that keep the parent's entries below the fork stage. Nothing was written."
            )


def moments_gone(store: Store, run_id: str, layout: RunLayout, stage: int) -> bool:
    """Whether stage ``stage`` made updates but its final checkpoint (the AdamW moments the next stage starts from)
    is no longer committed, or holds no moments any more (pruned by ``train.keep_optimizer_state``,
    :func:`moments_pruned`). A stage without updates has no moments: the next stage starts fresh, as its run did."""
    train = read_job_manifest(store, run_id, stage, "train")
    updates = train.counts.get("updates", 0) if train is not None else None
    if updates == 0:
        return False
    return (
        updates is None
        or latest_checkpoint(store, layout, stage) != updates
        or bool(moments_pruned(store, layout, stage))
    )


def moments_pruned(store: Store, layout: RunLayout, stage: int) -> str | None:
    """The reason recorded when the optimizer state of stage ``stage``'s latest committed checkpoint was pruned
    (``train.keep_optimizer_state=...``, :mod:`mugrpo.commits.retention`), else None."""
    from mugrpo.commits.retention import KEY, optimizer_pruned

    step = latest_checkpoint(store, layout, stage)
    record = optimizer_pruned(store, layout.checkpoint_dir(stage, step)) if step is not None else None
    return None if record is None else str(record.get("reason") or KEY)


def _gone_why(store: Store, layout: RunLayout, stage: int) -> str:
    """Why stage ``stage``'s final checkpoint holds no moments: pruned by the retention (its reason), or gone."""
    reason = moments_pruned(store, layout, stage)
    if reason is not None:
        marker = f"{store.uri(layout.checkpoint_dir(stage, latest_checkpoint(store, layout, stage)))}/_COMPLETE"
        return f"its optimizer state was pruned by {reason} (recorded in {marker})"
    return f"it is not under {store.uri(layout.checkpoints_dir(stage))}: it was pruned"


def _refuse_generation_algorithms(cfg: Any, uri: str) -> None:
    """Refuse reuse when ``cfg`` (the parent's or the fork's) turns on an algorithm whose generation hooks sample:
    their extra groups cannot be served from, nor told apart in, stored responses."""
    from mugrpo.algorithms import make_generation_hooks, sections_of

    sections = sections_of(cfg, "generate")
    on = [name for name, section in sections.items() if make_generation_hooks({name: section})]
    if on:
        raise ForkRefused(
            f"cannot fork {uri} with --reuse-rollouts: the algorithm section(s) {', '.join(on)} plan the shards they "
            "sample (extra groups, per-prompt temperatures) and stored responses cannot answer them. Fork without "
            "--reuse-rollouts. Nothing was written."
        )


def _stage_metadata(store: Store, run_id: str, stage: int) -> dict[str, bytes]:
    """The parent's stage manifest, job manifests and prompt plan of ``stage`` (run-relative path -> bytes)."""
    layout = RunLayout(run_id)
    out = {layout.rel(layout.stage_manifest(stage)): store.read_bytes(layout.stage_manifest(stage))}
    folder = layout.jobs_dir(stage)
    for name in store.listdir(folder):
        if name.endswith(".manifest.json") or name == "generate.plan.json":
            out[layout.rel(f"{folder}/{name}")] = store.read_bytes(f"{folder}/{name}")
    return out


def config_digest(config: Any) -> str:
    """sha256 of a config's canonical JSON (run.json's lineage records the parent's)."""
    return hashlib.sha256(json.dumps(config.to_json_dict(), sort_keys=True).encode()).hexdigest()


def lineage_record(store: Store, plan: ForkPlan) -> dict[str, Any]:
    """run.json's ``lineage`` block of the fork ``plan`` describes: the parent (URI, run id, config sha256), K, the
    changed keys, the fork's options and the sha256 of each metadata file copied verbatim from the parent."""
    fork = plan.config.run.parent
    return {
        "parent": store.uri(plan.parent.run.id),
        "parent_run_id": plan.parent.run.id,
        "stage": fork.stage,
        "parent_config_sha256": config_digest(plan.parent),
        "changed_keys": [c.record() for c in plan.changes],
        "reuse_rollouts": fork.reuse_rollouts,
        "fresh_optimizer": fork.fresh_optimizer,
        "eval_inherited": plan.eval_inherited,
        "references": {rel: sha256_bytes(data) for rel, data in sorted(plan.copies.items())},
        "created_at": datetime.now(UTC).isoformat(),
    }


def write_copies(store: Store, plan: ForkPlan) -> None:
    """Write the verbatim copies of the parent's metadata into the fork's folder (before its run.json, the fork's
    commit point: :func:`mugrpo.orchestration.runs.create_fork`)."""
    layout = RunLayout(plan.config.run.id)
    for rel, data in sorted(plan.copies.items()):
        store.write_bytes(layout.abs(rel), data)


def check_lineage(store: Store, cfg: Any, doc: dict[str, Any] | None) -> None:
    """Refuse to start or continue fork ``cfg`` when what it references is gone or changed (module docstring).
    A run that is not a fork passes.

    Raises:
        ForkRefused: (exit 3) one block naming the parent and the file.
    """
    fork = cfg.run.parent
    if fork is None:
        return
    layout, uri = cfg.layout, store.uri(cfg.run.id)
    lineage = (doc or {}).get("lineage")
    if lineage is None:
        raise ForkRefused(
            f"run {cfg.run.id!r} at {uri} names a parent (run.parent: {fork.run_id!r} at stage {fork.stage}) but has "
            "no fork record in run.json: run.parent is written by `mugrpo fork`, never by hand. Nothing was written."
        )
    parent = RunLayout(fork.run_id)
    broken = []
    for rel, digest in lineage["references"].items():
        for where in (layout.abs(rel), parent.abs(rel)):
            if not store.exists(where):
                broken.append(f"{store.uri(where)} is missing")
            elif sha256_bytes(store.read_bytes(where)) != digest:
                broken.append(f"{store.uri(where)} changed (sha256 differs from the one recorded at the fork)")
    needs_moments = read_job_manifest(store, cfg.run.id, fork.stage, "train") is None  # read by stage K's training
    if not fork.fresh_optimizer and needs_moments and moments_gone(store, cfg.run.id, layout, fork.stage - 1):
        broken.append(f"the final checkpoint of stage {fork.stage - 1}: {_gone_why(store, layout, fork.stage - 1)}")
    try:
        behavior_policy_dir(store, layout, fork.stage)
    except FileNotFoundError:
        broken.append(f"the policy of stage {fork.stage}, {store.uri(layout.policy_dir(fork.stage))}, is gone")
    if broken:
        raise ForkRefused(
            "\n".join(
                [
                    f"fork {cfg.run.id!r} at {uri} cannot continue: what it references of its parent "
                    f"{fork.run_id!r} ({store.uri(fork.run_id)}, stages below {fork.stage}) is gone or changed:",
                    *(f"  {b}" for b in broken),
                    "Nothing was written. Restore the parent's files (its manifests hold their sha256), or fork "
                    "again from a parent that holds them.",
                ]
            ),
            3,
        )
