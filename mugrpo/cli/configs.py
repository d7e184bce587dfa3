"""``mugrpo config`` and ``mugrpo data``: inspect and validate configs and prompt datasets."""

from __future__ import annotations

from pathlib import Path

import typer

from mugrpo.cli.app import OverridesArg, config_app, console, data_app, err, load_or_exit
from mugrpo.common.exit_codes import ExitCode


@config_app.command("show")
def config_show(
    config: Path | None = typer.Argument(None, help="YAML config; omit for the defaults."),
    overrides: list[str] | None = OverridesArg,
):
    """Print the fully resolved config (defaults + file + overrides) as YAML."""
    import yaml

    cfg = load_or_exit(config, overrides)
    typer.echo(yaml.safe_dump(cfg.to_json_dict(), sort_keys=False, width=10_000), nl=False)


@config_app.command("reference")
def config_reference_cmd():
    """Print the config reference (every key with type, default and description) as Markdown."""
    from mugrpo.config.docs import config_reference

    typer.echo(config_reference())


@data_app.command("check")
def data_check(
    config: Path | None = typer.Argument(None, help="YAML config whose train and eval datasets to load."),
    overrides: list[str] | None = OverridesArg,
):
    """Load the train set and every eval benchmark; print rows, problems, duplicates and skips."""
    from mugrpo.data.datasets import DatasetError, load_problems

    cfg = load_or_exit(config, overrides)
    sets = [cfg.data.train] + [b.dataset for b in cfg.eval.benchmarks]
    for ds in sets:
        try:
            problems, report = load_problems(ds)
        except DatasetError as e:
            err.print(f"[red]{e}[/red]")
            raise typer.Exit(ExitCode.FAILED) from None  # the check found a dataset it cannot read
        console.print(f"[bold]{ds.name}[/bold] {report.summary()}")
        if problems:
            console.print(f"  first: {problems[0].question[:80]!r} -> gold {problems[0].ground_truth!r}", markup=False)
