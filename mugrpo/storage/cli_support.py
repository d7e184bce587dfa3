"""What the ``mugrpo`` command and its sub-commands (``mugrpo sql``) share: turning a storage fault a user can fix
into one error line and exit code 2."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console

from mugrpo.common.exit_codes import ExitCode

err = Console(stderr=True, soft_wrap=True)


@contextmanager
def storage_guard(url: str, storage_options: dict | None = None) -> Iterator[None]:
    """Turn a storage fault a user can fix (endpoint, credentials, bucket) into one line and exit code 2
    (:attr:`~mugrpo.common.exit_codes.ExitCode.ASKED_WRONG`: what was asked cannot be reached as given)."""
    from mugrpo.storage.errors import StorageUnavailable, explain_storage_error

    try:
        yield
    except StorageUnavailable as e:
        err.print(f"Error: {e}", markup=False, highlight=False)
        raise typer.Exit(ExitCode.ASKED_WRONG) from None
    except Exception as e:
        message = explain_storage_error(e, url, storage_options)
        if message is None:
            raise
        err.print(f"Error: {message}", markup=False, highlight=False)
        raise typer.Exit(ExitCode.ASKED_WRONG) from None
