"""The ``replay`` audit table (``schemas.tables.REPLAY_SCHEMA``): one row per rollout an update used, fresh or
replayed, written in parts aligned with checkpoints like ``train_steps`` (:func:`mugrpo.commits.tables.write_part`), and
listed in the stage's train job manifest; the ``replay`` SQL view reads it."""

from __future__ import annotations

from mugrpo.commits.tables import delete_parts_after, read_parts, write_part
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import FileRecord

#: Name of the audit table (and of its folder in the run).
TABLE = "replay"


def write_audit_part(store: Store, layout: RunLayout, stage: int, part: int, rows: list[dict]) -> FileRecord:
    """Write the audit rows of the updates up to ``part`` (a checkpoint's stage update), atomically."""
    return write_part(store, layout, TABLE, stage, part, rows)


def delete_audit_parts_after(store: Store, layout: RunLayout, stage: int, step: int) -> list[int]:
    """Delete audit parts of updates after ``step`` (left by a run killed before their checkpoint)."""
    return delete_parts_after(store, layout, TABLE, stage, step)


def audit_part_records(store: Store, layout: RunLayout, stage: int) -> list[FileRecord]:
    """A FileRecord (with sha256, verified as a ``replay`` table) for each committed audit part of a stage."""
    return read_parts(store, layout, TABLE, stage)[1]
