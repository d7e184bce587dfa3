"""Running a bench script as a user does, for the tests of its quick mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_bench(args: list[str], *, timeout: int, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python ARGS`` in the repository root (``args``: the script, e.g. ``bench/fanout.py``, and its flags), its
    output captured as text; ``env``: variables set over this process's environment.

    Raises:
        AssertionError: the script exited non-zero (the message holds the last 3,000 characters of each stream).
        subprocess.TimeoutExpired: it ran past ``timeout`` seconds.
    """
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
