"""The ``mugrpo`` command line: one command group per module, each importing its machinery lazily so ``mugrpo --help``
stays fast.

- :mod:`~mugrpo.cli.app`: the Typer app, the consoles and the one-block refusal printers the groups share;
- :mod:`~mugrpo.cli.configs`: ``mugrpo config``, ``mugrpo data``;
- :mod:`~mugrpo.cli.run`: ``mugrpo run``, ``mugrpo resume`` (preflight in :mod:`mugrpo.orchestration.preflight`);
- :mod:`~mugrpo.cli.lifecycle`: the stop controller, the temporary Prefect server, the console filter of a run;
- :mod:`~mugrpo.cli.inspecting`: ``mugrpo status``, ``verify``, ``report``, ``audit``;
- the subsystems' own groups: ``mugrpo sql`` (:mod:`mugrpo.sql.cli`), ``mugrpo lab`` (:mod:`mugrpo.lab.cli`),
  ``mugrpo env`` (:mod:`mugrpo.inspection.environment`).
"""

from __future__ import annotations

from mugrpo.cli import configs, inspecting, run  # noqa: F401  (importing registers the commands)
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


def main() -> None:  # pragma: no cover - console entry
    app()
