"""Seeds derived from the run seed: one per purpose (a stage's data order, a shard's sampling, replay draws)."""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed derived from ``parts`` (e.g. run seed, stage, shard) with sha256: stable across processes."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
