"""The ``mugrpo`` command line: one command group per module, each importing its machinery lazily so ``mugrpo --help``
stays fast.

- :mod:`~mugrpo.cli.app`: the Typer app, the consoles and the one-block refusal printers the groups share;
- :mod:`~mugrpo.cli.configs`: ``mugrpo config``, ``mugrpo data``;
- :mod:`~mugrpo.cli.run`: ``mugrpo run``, ``mugrpo resume`` (preflight in :mod:`mugrpo.orchestration.preflight`);
- :mod:`~mugrpo.cli.lifecycle`: the stop controller, the temporary Prefect server, the console filter of a run;
- :mod:`~mugrpo.cli.inspecting`: ``mugrpo status``, ``verify``, ``report``, ``audit``;
- :mod:`~mugrpo.cli.branching`: ``mugrpo fork`` (:mod:`mugrpo.orchestration.fork`);
- :mod:`~mugrpo.cli.rescoring`: ``mugrpo rescore`` (:mod:`mugrpo.orchestration.rescore`);
- the subsystems' own groups: ``mugrpo sql`` (:mod:`mugrpo.sql.cli`), ``mugrpo lab`` (:mod:`mugrpo.lab.cli`),
  ``mugrpo env`` (:mod:`mugrpo.inspection.environment`).
"""

from __future__ import annotations

from mugrpo.cli import branching, configs, inspecting, rescoring, run  # noqa: F401  (importing registers the commands)
from mugrpo.cli.app import app, console, err, split_run

__all__ = ["app", "console", "err", "main", "split_run"]


def _register_subsystems() -> None:
    from mugrpo.inspection.environment import register_cli as register_env
    from mugrpo.lab.cli import register_cli as register_lab
    from mugrpo.sql.cli import register_cli as register_sql

    register_sql(app)
    register_lab(app)
    register_env(app)


_register_subsystems()


#: Commands that only read a run (or the machine) and print: they end with :func:`os._exit` once their output is
#: flushed, skipping the interpreter's teardown of native thread pools. pyarrow's and DuckDB's pools can abort a
#: process there ("terminate called without an active exception", exit -6, after every line was printed:
#: apache/arrow#34314, duckdb/duckdb#13904; seen once in CI after ``mugrpo status``). ``run`` and ``resume`` keep
#: the normal exit: Prefect's exit handlers and the temporary server's stop run there.
READ_ONLY_COMMANDS = frozenset({"status", "verify", "report", "audit", "sql", "env", "config", "data"})


def _command(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main() -> None:  # pragma: no cover - console entry
    import os
    import sys

    if _command(sys.argv[1:]) not in READ_ONLY_COMMANDS:
        app()
        return
    try:
        app()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
