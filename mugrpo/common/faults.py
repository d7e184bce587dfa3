"""Fault injection for crash and preemption tests: named pause points (:func:`fault_pause`).

With ``MUGRPO_FAULT_PAUSE="SUBSTRING:SECONDS"`` set, a pause point whose name contains SUBSTRING prints
``MUGRPO_FAULT_PAUSE {name}`` to stderr and sleeps SECONDS, so a test can signal the process at that moment; several
``;``-separated ``SUBSTRING:SECONDS`` entries hold several points (the first that matches counts). The
points: a store write between its temporary file and the rename (its path), a hash of a stored file before it reads
(its path), a train job's update after it is composed and before its first micro-batch
(``train/stage=k/update=u``). Unset (always, outside tests), a pause point does nothing.
"""

from __future__ import annotations

import os
import sys
import time

FAULT_ENV = "MUGRPO_FAULT_PAUSE"


def fault_pause(name: str) -> None:
    """Pause at the point ``name`` when :data:`FAULT_ENV` names it (module docstring); else nothing."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    for entry in spec.split(";"):
        needle, _, seconds = entry.rpartition(":")
        if needle and needle in name:
            print(f"{FAULT_ENV} {name}", file=sys.stderr, flush=True)
            time.sleep(float(seconds))
            return
