"""The ``mugrpo`` command line. Each command imports its machinery lazily so ``mugrpo --help`` stays fast."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(
    help=(
        "mugrpo: staged RL with verifiable rewards (Mu-GRPO). A run is K stages; each stage samples a large rollout "
        "set from the frozen policy, stores it as Parquet, then trains many updates on it.\n\n"
        "Start with `mugrpo config show CONFIG` to see every setting, then `mugrpo run CONFIG`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect and validate configs.", no_args_is_help=True)
data_app = typer.Typer(help="Inspect prompt datasets.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(data_app, name="data")

console = Console()
err = Console(stderr=True)

OverridesArg = typer.Argument(None, help="Dotted overrides applied after the file, e.g. train.lr=1e-6 run.id=exp2.")


def _load(config: Path | None, overrides: list[str] | None):
    from mugrpo.config import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None


@config_app.command("show")
def config_show(
    config: Path | None = typer.Argument(None, help="YAML config; omit for the defaults."),
    overrides: list[str] | None = OverridesArg,
):
    """Print the fully resolved config (defaults + file + overrides) as YAML."""
    import yaml

    cfg = _load(config, overrides)
    console.print(yaml.safe_dump(cfg.to_json_dict(), sort_keys=False), end="", markup=False, highlight=False)


@data_app.command("check")
def data_check(
    config: Path | None = typer.Argument(None, help="YAML config whose train and eval datasets to load."),
    overrides: list[str] | None = OverridesArg,
):
    """Load the train set and every eval benchmark; print rows, problems, duplicates and skips."""
    from mugrpo.data import DatasetError, load_problems

    cfg = _load(config, overrides)
    sets = [cfg.data.train] + [b.dataset for b in cfg.eval.benchmarks]
    for ds in sets:
        try:
            problems, report = load_problems(ds)
        except DatasetError as e:
            err.print(f"[red]{e}[/red]")
            raise typer.Exit(1) from None
        console.print(f"[bold]{ds.name}[/bold] {report.summary()}")
        if problems:
            console.print(f"  first: {problems[0].question[:80]!r} -> gold {problems[0].ground_truth!r}", markup=False)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
