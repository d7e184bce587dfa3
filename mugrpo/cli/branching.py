"""``mugrpo fork``: branch a run at a stage (:mod:`mugrpo.orchestration.fork`, docs/branching.md)."""

from __future__ import annotations

import typer

from mugrpo.cli.app import StorageOptionsOpt, app, console, refuse, storage_options, stored_config


@app.command("fork")
def fork_cmd(
    parent: str = typer.Argument(..., help="The parent run: its folder/URL ROOT/RUN_ID, or a run id with --root."),
    overrides: list[str] | None = typer.Argument(
        None, help="Overrides of the parent's config, from stage K on, e.g. train.lr=1e-5 (docs/branching.md)."
    ),
    at_stage: int = typer.Option(..., "--at-stage", help="K: the first stage the fork computes itself (>= 1)."),
    child_id: str = typer.Option(..., "--id", help="The fork's run id (under the parent's root)."),
    reuse_rollouts: bool = typer.Option(
        False, "--reuse-rollouts", help="Re-score the parent's stage-K responses instead of sampling stage K again."
    ),
    fresh_optimizer: bool = typer.Option(
        False, "--fresh-optimizer", help="Start stage K from fresh AdamW moments (the parent's were pruned)."
    ),
    no_start: bool = typer.Option(False, "--no-start", help="Write the fork, do not run it (`mugrpo resume` it)."),
    root: str | None = typer.Option(None, help="Storage root holding the parent (default: runs)."),
    storage_option: list[str] | None = StorageOptionsOpt,
):
    """Branch a run at stage K: a new run whose stages below K are the parent's committed stages, referenced, not
    copied, and which trains on from the parent's policy and final checkpoint of stage K-1.

    Overrides may change what the fork computes from stage K on (loss, lr, reward, advantage, updates through
    run.stage_schedule, number of stages, eval); with --reuse-rollouts only keys that leave the behavior distribution
    unchanged. The fork's run.json records the lineage: parent, K, the parent's config digest, the changed keys.
    Then the fork runs, as `mugrpo resume` would.
    """
    from mugrpo.cli.run import execute
    from mugrpo.config import ConfigError
    from mugrpo.orchestration.fork import plan_fork
    from mugrpo.orchestration.resume import RunRefused
    from mugrpo.orchestration.runs import create_fork, load_run_config, open_store
    from mugrpo.storage.layout import validate_run_id

    options = storage_options(storage_option)
    parent_cfg = stored_config(parent, root, options)
    store = open_store(parent_cfg)
    try:
        validate_run_id(child_id)
        plan = plan_fork(
            store,
            parent_cfg,
            at_stage,
            child_id,
            overrides or [],
            reuse_rollouts=reuse_rollouts,
            fresh_optimizer=fresh_optimizer,
        )
        create_fork(store, plan)
    except (RunRefused, ConfigError, ValueError) as e:
        refuse(e)
    changed = ", ".join(c.line() for c in plan.changes) or "none"
    console.print(
        f"fork {child_id} of {parent_cfg.run.id} at stage {at_stage} written at {store.uri(child_id)}: stages "
        f"0..{at_stage - 1} referenced from the parent; changed keys: {changed}"
        + ("; stage rollouts reused (re-scored)" if reuse_rollouts else "")
        + ("; the parent's evaluation of the stage's policy reused" if plan.eval_inherited else ""),
        markup=False,
        highlight=False,
    )
    if no_start:
        console.print(f"run it with: mugrpo resume {store.uri(child_id)}", markup=False, highlight=False)
        return
    execute(load_run_config(parent_cfg.run.root, child_id, options))
