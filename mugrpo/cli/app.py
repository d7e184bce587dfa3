"""The ``mugrpo`` Typer app and what its command groups share: the consoles, the config and run arguments, and the
one-block refusal printers."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from mugrpo.common.exit_codes import ExitCode, exit_code_of
from mugrpo.storage.cli_support import storage_guard

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

# soft_wrap: long lines (paths, YAML, commands to copy) are never broken at the terminal width, so piped output
# stays machine-readable.
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

OverridesArg = typer.Argument(None, help="Dotted overrides applied after the file, e.g. train.lr=1e-6 run.id=exp2.")
StorageOptionsOpt = typer.Option(
    None, "--storage-option", "-o", help="fsspec option KEY=VALUE (e.g. endpoint_url=http://127.0.0.1:9000)."
)


def storage_options(pairs: list[str] | None) -> dict:
    from mugrpo.sql.cli import parse_storage_options

    return parse_storage_options(pairs)


def load_or_exit(config: Path | None, overrides: list[str] | None):
    from mugrpo.config import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as e:
        refuse(e)  # "[gym]" in a pip command: printed without markup


def split_run(run: str, root: str | None) -> tuple[str, str]:
    """``RUN`` is a run id (with --root, default 'runs') or a run folder/URL ``ROOT/RUN_ID``. A run id that is not
    one (``../ref`` with --root) is refused: one block naming it, exit 2."""
    from mugrpo.storage.layout import validate_run_id

    if root is None and "/" in run.rstrip("/"):
        parent, _, run_id = run.rstrip("/").rpartition("/")
    else:
        parent, run_id = root or "runs", run
    try:
        validate_run_id(run_id)
    except ValueError as e:
        given = f"{run!r} with --root {root}" if root is not None else repr(run)
        refuse(ValueError(f"{given}: {e}; pass a run id with --root, or the run's folder ROOT/RUN_ID without it"))
    return parent, run_id


def stored_config(run: str, root: str | None, storage_options: dict | None = None):
    """The config in a run's run.json; exits with a clear message when the run or its storage cannot be read."""
    from mugrpo.config import ConfigError
    from mugrpo.orchestration.runs import load_run_config
    from mugrpo.storage.errors import check_store
    from mugrpo.storage.store import Store

    root, run_id = split_run(run, root)
    try:
        with storage_guard(f"{root.rstrip('/')}/{run_id}", storage_options):
            check_store(Store(root, storage_options), f"{root.rstrip('/')}/{run_id}")
            return load_run_config(root, run_id, storage_options)
    except ConfigError as e:  # a key this version no longer has: named with the file
        refuse(e)
    except FileNotFoundError as e:
        folder = Store(root).listdir(run_id) if Store(root).exists(run_id) else []
        inside = [n for n in folder if Store(root).exists(f"{run_id}/{n}/run.json")]
        if inside:
            err.print(
                f"{root}/{run_id} is a folder of runs; pass one of: "
                + ", ".join(f"{root}/{run_id}/{n}" for n in inside)
            )
        else:
            err.print(f"[red]{e}[/red]")
        raise typer.Exit(exit_code_of(e)) from None


def refuse(e: Exception) -> None:
    """Print a refusal (:class:`mugrpo.orchestration.resume.RunRefused`, a config error, another writer) once, as one
    block, and exit with its code in :mod:`mugrpo.common.exit_codes`' table
    (:func:`~mugrpo.common.exit_codes.exit_code_of`): 2 where what was asked is wrong, 3 where the run's state
    refuses it."""
    err.print(f"Error: {e}", style="red", markup=False, highlight=False)
    raise typer.Exit(exit_code_of(e)) from None


def refuse_state(message: str) -> None:
    """Print a refusal the run's state causes (corrupted committed data) once, and exit 3
    (:attr:`~mugrpo.common.exit_codes.ExitCode.STATE_REFUSES`)."""
    err.print(f"Error: {message}", style="red", markup=False, highlight=False)
    raise typer.Exit(ExitCode.STATE_REFUSES)
