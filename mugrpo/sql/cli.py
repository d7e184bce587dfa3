"""The ``mugrpo sql`` command: one query, or an interactive shell when no query is given.

Wire it into a typer app with :func:`register_cli` (``mugrpo/cli.py`` does ``register_cli(app)``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import typer

from mugrpo.common.exit_codes import ExitCode

if TYPE_CHECKING:  # the command imports DuckDB and pyarrow when it runs, so `mugrpo --help` stays fast
    from mugrpo.sql.catalog import RunCatalog
    from mugrpo.sql.output import RenderOptions

SHELL_HELP = """Statements end with ';'. Commands:
  .tables            list the views
  .schema [VIEW]     columns and types of a view (all views without an argument)
  .format NAME       output format: table, csv or json
  .help              this text
  .quit / .exit      leave (or end of input)"""


def parse_storage_options(pairs: list[str] | None) -> dict:
    """``KEY=VALUE`` pairs; values are YAML (``anon=true``), except credentials, which stay strings verbatim."""
    import yaml

    from mugrpo.sql.redact import SECRET_KEY_HINTS

    opts: dict = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--storage-option")
        opts[key] = value if any(h in key.lower() for h in SECRET_KEY_HINTS) else yaml.safe_load(value)
    return opts


def _config_options(config: Path) -> dict:
    from mugrpo.config import ConfigError, load_config

    try:
        return dict(load_config(config, []).run.storage_options)
    except ConfigError as e:
        raise typer.BadParameter(str(e), param_hint="--config") from None


def _inside(export: str, catalog: RunCatalog) -> bool:
    """True if ``export`` would land inside the queried target (refused: the target is read-only)."""
    root = catalog.target.url
    if "://" not in export and "://" not in root:
        export_path, root_path = Path(export).resolve(), Path(root).resolve()
        return export_path == root_path or root_path in export_path.parents
    return export.rstrip("/").startswith(root.rstrip("/") + "/")


class _Session:
    """State of one ``mugrpo sql`` invocation: the catalog, the output format and where results go."""

    def __init__(self, catalog: RunCatalog, fmt: str, opts: RenderOptions, out: TextIO, err: TextIO):
        self.catalog, self.fmt, self.opts, self.out, self.err = catalog, fmt, opts, out, err

    def run(self, query: str, parquet: str | None = None, storage_options: dict | None = None) -> bool:
        """Run every statement of ``query`` and print each result (or export the one result to ``parquet``).

        Returns False after printing an error; nothing runs if any statement is refused.
        """
        from mugrpo.sql.output import export_parquet, render
        from mugrpo.sql.readonly import SqlError
        from mugrpo.storage.store import StorageError

        try:
            if parquet:
                table = self.catalog.arrow(query)  # exactly one statement
                export_parquet(table, parquet, storage_options)
                self.err.write(f"wrote {table.num_rows} rows to {parquet}\n")
                return True
            for _, table in self.catalog.run_script(query):
                render(table, self.fmt, self.out, self.opts)
        except (SqlError, StorageError, OSError, ValueError) as e:
            self.err.write(f"Error: {e}\n")
            return False
        return True

    def command(self, line: str) -> bool | None:
        """Handle a dot command; None means quit."""
        from mugrpo.sql.catalog import VIEWS
        from mugrpo.sql.output import FORMATS

        name, _, arg = line.strip().partition(" ")
        arg = arg.strip().rstrip(";")
        if name in (".quit", ".exit"):
            return None
        if name == ".help":
            self.out.write(SHELL_HELP + "\n")
        elif name == ".tables":
            self.out.write("  ".join(VIEWS) + "\n")
        elif name == ".schema":
            views = self.catalog.views()
            if arg and arg not in views:
                self.err.write(f"Error: no view {arg!r}; views: {', '.join(VIEWS)}\n")
                return False
            for view in [arg] if arg else list(views):
                cols = ",\n  ".join(f"{c} {t}" for c, t in views[view])
                self.out.write(f"{view}(\n  {cols}\n)\n")
        elif name == ".format":
            if arg not in FORMATS:
                self.err.write(f"Error: unknown format {arg!r}; choose one of {', '.join(sorted(FORMATS))}\n")
                return False
            self.fmt = arg
        else:
            self.err.write(f"Error: unknown command {name!r}; try .help\n")
            return False
        return True

    def shell(self, stdin: TextIO) -> bool:
        """Read statements from ``stdin`` until EOF or .quit; True if every one succeeded."""
        interactive = stdin.isatty()
        if interactive:
            runs = ", ".join(self.catalog.run_ids)
            self.err.write(f"mugrpo sql: {self.catalog.target.url} (runs: {runs}). Read-only. .help for help.\n")
        ok, buffer = True, ""
        while True:
            if interactive:
                self.err.write("mugrpo> " if not buffer else "   ...> ")
                self.err.flush()
            line = stdin.readline()
            if not line:
                break
            if not buffer and line.lstrip().startswith("."):
                result = self.command(line)
                if result is None:
                    return ok
                ok &= result
                continue
            buffer += line
            if buffer.rstrip().endswith(";"):
                ok &= self.run(buffer)
                buffer = ""
        if buffer.strip():
            ok &= self.run(buffer)
        return ok


def sql_command(
    target: str = typer.Argument(..., help="A run folder (ROOT/RUN_ID) or a root of runs; local path or s3://..."),
    query: str | None = typer.Argument(None, help="SQL to run; omit it to read statements from stdin (a shell)."),
    fmt: str = typer.Option("table", "--format", "-f", help="Output format: table, csv or json."),
    parquet: str | None = typer.Option(None, "--parquet", help="Write the result to this Parquet file instead."),
    storage_option: list[str] | None = typer.Option(
        None, "--storage-option", "-o", help="fsspec option KEY=VALUE (e.g. endpoint_url=http://127.0.0.1:9000)."
    ),
    config: Path | None = typer.Option(None, "--config", help="Take storage options from this run config."),
    max_rows: int = typer.Option(100, "--max-rows", min=1, help="Rows shown by the table format."),
    max_width: int = typer.Option(60, "--max-width", min=8, help="Characters per cell in the table format."),
) -> None:
    """Query rollouts, train steps, evals, stages and runs with SQL (DuckDB), read-only.

    Views: rollouts, train_steps, evals, replay, stages, runs, lineage, eval_problems, eval_scores, verifier_audit,
    verifier_audit_samples, stage_corrections, rescores, reward_flips (docs/sql.md). Example:

        mugrpo sql runs/exp1 "SELECT stage, avg(reward) FROM rollouts GROUP BY ALL ORDER BY stage"
    """
    from mugrpo.sql.catalog import connect
    from mugrpo.sql.discover import TargetError
    from mugrpo.sql.output import FORMATS, RenderOptions

    if fmt not in FORMATS:
        raise typer.BadParameter(f"{fmt!r} is not one of {', '.join(sorted(FORMATS))}", param_hint="--format")
    options = {**(_config_options(config) if config else {}), **parse_storage_options(storage_option)}
    from mugrpo.storage.cli_support import storage_guard
    from mugrpo.storage.errors import check_store
    from mugrpo.storage.store import Store

    try:
        with storage_guard(target, options):
            if "://" in target and not target.startswith("file://"):  # a local Store would create the folder
                check_store(Store(target, options))
            catalog = connect(target, options)
    except TargetError as e:
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(ExitCode.ASKED_WRONG) from None
    with catalog, storage_guard(target, options):
        from mugrpo.sql.schema_check import skipped

        for misfit in catalog.misfits:  # a root's files that do not fit their table: left out of the views
            typer.echo(skipped(misfit, catalog.target.store.uri(misfit.run_id)), err=True)
        if parquet and _inside(parquet, catalog):
            typer.echo(f"Error: --parquet {parquet} is inside {catalog.target.url}, which is read-only", err=True)
            raise typer.Exit(ExitCode.ASKED_WRONG)
        session = _Session(catalog, fmt, RenderOptions(max_rows=max_rows, max_width=max_width), sys.stdout, sys.stderr)
        if query is None:
            ok = session.shell(sys.stdin)
        else:
            ok = session.run(query, parquet, options)
    if not ok:  # a query failed
        raise typer.Exit(ExitCode.FAILED)


def register_cli(app: typer.Typer) -> None:
    """Add the ``sql`` command to ``app``."""
    # A query that starts with a comment ("-- ...") is not an option: unknown "options" are kept as arguments
    app.command("sql", context_settings={"ignore_unknown_options": True})(sql_command)
