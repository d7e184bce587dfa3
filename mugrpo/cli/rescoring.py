"""``mugrpo rescore``: re-score a committed stage's rollouts with another reward config
(:mod:`mugrpo.orchestration.rescore`); the rollouts are only read, the result is written beside them."""

from __future__ import annotations

import typer

from mugrpo.cli.app import StorageOptionsOpt, app, console, refuse, refuse_state, storage_options, stored_config

#: The config sections an override of ``mugrpo rescore`` may change: what scores a response and what normalizes it.
RESCORE_SECTIONS = ("reward.", "advantage.")


def rescore_config(cfg, overrides: list[str]):
    """``cfg`` with ``overrides`` (``reward.*`` / ``advantage.*`` keys only) applied and validated.

    Raises:
        ConfigError: an override of another key (named), or one that does not validate.
    """
    from mugrpo.config import ConfigError, apply_overrides, config_from_dict

    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if not key.startswith(RESCORE_SECTIONS):
            raise ConfigError(
                f"override {item!r}: `mugrpo rescore` only changes reward.* and advantage.* keys, not {key!r}; "
                "the rollouts it re-scores were sampled with the run's other settings"
            )
    data = apply_overrides(cfg.to_json_dict(), list(overrides))
    return config_from_dict(data, source="rescore overrides", overrides=list(overrides))


@app.command("rescore")
def rescore_cmd(
    run: str = typer.Argument(..., help="Run id (with --root) or run folder/URL ROOT/RUN_ID."),
    overrides: list[str] | None = typer.Argument(
        None, help="reward.* / advantage.* overrides, e.g. 'reward.components={math_correctness: 1.0}'."
    ),
    stage: int = typer.Option(..., "--stage", help="The committed stage whose rollouts are re-scored."),
    name: str = typer.Option(..., "--name", help="Name of this re-scoring (folder rescores/NAME)."),
    root: str | None = typer.Option(None, help="Storage root holding the run (default: runs)."),
    storage_option: list[str] | None = StorageOptionsOpt,
):
    """Re-score stage K's committed rollouts with the run's reward config changed by the overrides, recompute the
    group advantages, and write them beside the rollouts (rescores/NAME/stage=K/), never over them.

    Prints how many rollouts flip: false_negative (the new reward is higher than the stored one), false_positive
    (lower). Query them with `mugrpo sql RUN "SELECT * FROM reward_flips"`.
    """
    from rich.table import Table

    from mugrpo.config import ConfigError
    from mugrpo.orchestration.rescore import rescore_stage
    from mugrpo.provenance.refusals import RunRefused
    from mugrpo.storage.cli_support import storage_guard
    from mugrpo.storage.layout import RunLayout
    from mugrpo.storage.store import ChecksumError, Store

    cfg = stored_config(run, root, storage_options(storage_option))
    try:
        new = rescore_config(cfg, overrides or [])
    except ConfigError as e:
        refuse(e)
    store = Store(cfg.run.root, cfg.run.storage_options, cfg.run.storage_retry)
    try:
        with storage_guard(store.uri(cfg.run.id), cfg.run.storage_options):
            result = rescore_stage(store, cfg, stage, name, new.reward, new.advantage)
    except RunRefused as e:
        refuse(e)
    except ChecksumError as e:
        refuse_state(f"{e}; the committed rollouts changed since they were written (`mugrpo verify` the run)")
    counts = result.counts
    table = Table(title=f"rescore {name} of run {cfg.run.id} stage {stage}")
    for col in ("rollouts", "false negative", "false positive", "unchanged", "not ok"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_row(*(str(counts.get(k, 0)) for k in ("rows", "false negative", "false positive", "unchanged", "not_ok")))
    console.print(table)
    verb = "already written (identical), at" if result.reused else "written to"
    folder = store.uri(RunLayout(cfg.run.id).rescore_dir(name, stage))
    console.print(
        f"{len(result.manifest.files)} file(s) {verb} {folder}/; manifest {store.uri(result.manifest_path)}",
        markup=False,
        highlight=False,
    )
