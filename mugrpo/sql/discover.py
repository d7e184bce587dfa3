"""Find what a ``mugrpo sql`` target holds: one run, or a root of runs, and the committed files of each.

A folder is a run when ``rollouts/``, ``train_steps/``, ``stages/`` or ``run.json`` sits directly below it; any other
folder is a root whose sub-folders are runs. One recursive listing (a single paginated LIST on S3) finds every file;
a file counts only if :class:`mugrpo.storage.layout.RunLayout` rebuilds exactly its path, so temporary files of atomic
writes (``.NAME.tmp-<uuid>``), stray files and the non-table folders (``policies/``, ``checkpoints/``, ``jobs/``) are
skipped.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fsspec

from mugrpo.orchestration.rescore import validate_rescore_name
from mugrpo.provenance.refusals import RunRefused
from mugrpo.storage.layout import RunLayout, parse_shard, validate_run_id
from mugrpo.storage.store import Store
from schemas import TABLES

#: Entries whose presence directly under a folder makes it a run.
RUN_MARKERS = ("rollouts", "train_steps", "stages", "run.json")

_STAGE_DIR = re.compile(r"stage=(\d+)")
_STAGE_JSON = re.compile(r"stage=(\d+)\.json")
_PART = re.compile(r"part-(\d{5,})\.parquet")


class TargetError(ValueError):
    """The target is missing, is not a folder, or holds no run."""


def _rollout_file(layout: RunLayout, stage: int, name: str) -> str | None:
    shard = parse_shard(name)
    return None if shard is None else layout.rollout_shard(stage, shard)


def _part_file(table: str) -> Callable[[RunLayout, int, str], str | None]:
    """A table written in parts per stage (``train_steps``, an algorithm's audit table): ``part-NNNNN.parquet``."""

    def path(layout: RunLayout, stage: int, name: str) -> str | None:
        m = _PART.fullmatch(name)
        return None if m is None else layout.table_part(table, stage, int(m.group(1)))

    return path


def _eval_file(layout: RunLayout, stage: int, name: str) -> str | None:
    if name.startswith(".") or not name.endswith(".parquet"):
        return None
    return layout.eval_file(stage, name[: -len(".parquet")])


#: Parquet table -> rebuilds the layout path of a file named ``name`` in stage ``stage`` (None if the name is foreign).
#: Every table of ``schemas.TABLES`` other than rollouts and evals is written in parts per stage.
TABLE_FILES: dict[str, Callable[[RunLayout, int, str], str | None]] = {
    table: {"rollouts": _rollout_file, "evals": _eval_file}.get(table) or _part_file(table) for table in TABLES
}


@dataclass
class RunFiles:
    """The committed files of one run, as paths relative to the store root."""

    run_id: str
    run_json: str | None = None
    manifests: dict[int, str] = field(default_factory=dict)  # stage -> stages/stage={k}.json
    tables: dict[str, list[str]] = field(default_factory=lambda: {t: [] for t in TABLE_FILES})
    rescores: list[str] = field(default_factory=list)  # rescores/NAME/stage={k}/shard=NNNNN.parquet


@dataclass
class Target:
    """A resolved target: the store holding the runs, which runs, and whether the user named a single run."""

    url: str
    store: Store
    single_run: bool
    runs: dict[str, RunFiles]

    @property
    def scope(self) -> str:
        """The folder DuckDB may read, relative to the store root ('' for a whole root)."""
        return next(iter(self.runs)) if self.single_run else ""


def _classify(rel: str, runs: dict[str, RunFiles]) -> None:
    parts = rel.split("/")
    try:
        layout = RunLayout(parts[0])
    except ValueError:
        return
    if len(parts) == 2 and rel == layout.run_json:
        runs.setdefault(layout.run_id, RunFiles(layout.run_id)).run_json = rel
    elif len(parts) == 3 and (m := _STAGE_JSON.fullmatch(parts[2])) and rel == layout.stage_manifest(int(m.group(1))):
        runs.setdefault(layout.run_id, RunFiles(layout.run_id)).manifests[int(m.group(1))] = rel
    elif len(parts) == 4 and parts[1] in TABLE_FILES and (m := _STAGE_DIR.fullmatch(parts[2])):
        if rel == TABLE_FILES[parts[1]](layout, int(m.group(1)), parts[3]):
            runs.setdefault(layout.run_id, RunFiles(layout.run_id)).tables[parts[1]].append(rel)
    elif len(parts) == 5 and parts[1] == "rescores" and _is_rescore_shard(layout, parts):
        runs.setdefault(layout.run_id, RunFiles(layout.run_id)).rescores.append(rel)


def _is_rescore_shard(layout: RunLayout, parts: list[str]) -> bool:
    """``{run}/rescores/NAME/stage={k}/shard=NNNNN.parquet`` exactly as :meth:`RunLayout.rescore_shard` builds it (a
    re-scoring of ``mugrpo rescore``, :mod:`mugrpo.orchestration.rescore`)."""
    m, shard = _STAGE_DIR.fullmatch(parts[3]), parse_shard(parts[4])
    if m is None or shard is None:
        return False
    try:
        return "/".join(parts) == layout.rescore_shard(validate_rescore_name(parts[2]), int(m.group(1)), shard)
    except RunRefused:  # not a name mugrpo rescore writes
        return False


def _split_parent(url: str) -> tuple[str, str]:
    url = url.rstrip("/")
    head, _, name = url.rpartition("/")
    if not head and "://" not in url and not url.startswith("/"):  # a bare relative folder: its parent is here
        head = "."
    if not head or head.endswith(":/") or head.endswith(":"):
        raise TargetError(f"{url} looks like a run but has no parent folder to serve as its root; move it into one")
    return head, name


def _find(fs: fsspec.AbstractFileSystem, store: Store, base: str) -> dict[str, RunFiles]:
    """The committed files below ``base`` (relative to the store root: a run, or '' for the whole root), by run."""
    runs: dict[str, RunFiles] = {}
    for full in fs.find(store.full(base), withdirs=False):
        rel = posixpath.relpath(full, store.root) if store.is_local else full[len(store.root) :].lstrip("/")
        _classify(rel, runs)
    return runs


def run_files(store: Store, run_id: str) -> RunFiles:
    """The committed files of run ``run_id`` of ``store``, found as :func:`resolve_target` finds them."""
    files = _find(store.fs, store, run_id).get(run_id, RunFiles(run_id))
    for paths in files.tables.values():
        paths.sort()
    return files


def resolve_target(target: str, storage_options: dict[str, Any] | None = None) -> Target:
    """Decide whether ``target`` is a run or a root and list the committed files of every run in it.

    Args:
        target: a local folder or fsspec URL (``s3://bucket/prefix`` or ``s3://bucket/prefix/RUN_ID``).
        storage_options: fsspec options (endpoint_url...); credentials are best left to the environment.

    Raises:
        TargetError: the target does not exist, or is a root that holds no run.
    """
    opts = dict(storage_options or {})
    url = str(target).rstrip("/") or "/"
    fs, path = fsspec.core.url_to_fs(url, **opts)
    fs.invalidate_cache()  # listings cached by an earlier catalog in this process may miss new files
    if not fs.isdir(path):  # checked before Store(), which would create a missing local folder
        raise TargetError(f"{url} does not exist or is not a folder")
    below = {posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)}
    single_run = any(m in below for m in RUN_MARKERS)
    if single_run:
        root_url, run_id = _split_parent(url)
        try:
            validate_run_id(run_id)
        except ValueError as e:
            raise TargetError(f"{url} looks like a run, but its folder name is not a run id: {e}") from None
    else:
        root_url, run_id = url, ""
    store = Store(root_url, opts)
    runs = _find(fs, store, run_id)
    if single_run:
        runs.setdefault(run_id, RunFiles(run_id))
    elif not runs:
        raise TargetError(
            f"{url} holds no run: a run folder has rollouts/, train_steps/, stages/ or run.json directly below it"
        )
    for files in runs.values():
        for paths in files.tables.values():
            paths.sort()
        files.rescores.sort()
    return Target(url=url, store=store, single_run=single_run, runs=dict(sorted(runs.items())))
