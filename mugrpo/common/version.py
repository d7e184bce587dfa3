"""The code version that writes a run's files: recorded in run.json (the first writer), in its history (each
start and resume) and in every job and stage manifest, so an audit can tell which code wrote what."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from mugrpo import __version__


@functools.cache
def code_version() -> str:
    """The package version plus the git commit of the source tree when there is one (``0.1.0+gabc1234``); the bare
    package version in an installed wheel or an image without git. Computed once per process."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{__version__}+g{sha}" if sha else __version__
