"""Re-score a committed stage's rollouts with another reward config (``mugrpo rescore``): what would the rewards and
group advantages have been under a different verifier, and which rollouts flip?

The rollouts are never rewritten. A re-scoring named ``NAME`` writes, beside them (:class:`RunLayout`):

- ``{run}/rescores/NAME/stage={k}/shard=NNNNN.parquet``: one file per rollout shard (same number), one row per
  rollout (:data:`RESCORE_SCHEMA`): the new reward, its components, status and extracted answer, the group advantage
  recomputed with the given advantage config, and the rollout's stored (old) reward;
- ``{run}/rescores/NAME/stage={k}.json``: its commit point, written last (:class:`RescoreManifest`): the files with
  their sha256, the rollout shards they were computed from (with theirs), the reward and advantage configs used, and
  the counts.

A **flip** is a rollout whose new reward differs from its stored one (both float32): ``false_negative`` where the
new reward is higher (the old verifier under-credited it, e.g. refused a correct answer), ``false_positive`` where
it is lower (the old verifier over-credited it). Rows whose rewards are equal are not flips. The SQL view
``reward_flips`` (:mod:`mugrpo.sql.views.rescores`) joins these rows with the rollouts' texts.

Groups are re-normalized as generation normalized them (:func:`mugrpo.generation.shards.rollout_rows`): the
rollouts of one prompt of one shard, rows not trained on (an algorithm's extra groups, :mod:`mugrpo.commits.exclusion`)
apart from the training rows, each with its
own ``group_size``.
"""

from __future__ import annotations

import io
import json
import posixpath
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, Field, ValidationError

from mugrpo.provenance.refusals import RunRefused
from mugrpo.storage.layout import RunLayout, parse_shard
from mugrpo.storage.store import Store
from schemas import FileRecord

__all__ = [
    "RESCORE_SCHEMA",
    "RescoreManifest",
    "RescoreResult",
    "flip_kind",
    "read_rescore_shard",
    "rescore_stage",
    "validate_rescore_name",
]

_ts = pa.timestamp("us", tz="UTC")

#: File metadata of a rescore shard (same keys as the versioned tables of ``schemas``).
RESCORE_TABLE, RESCORE_VERSION = "rescores", 1

#: One row per re-scored rollout. ``reward_components`` has the rollouts' type (map<string, float32>).
RESCORE_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("stage", pa.int32(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("sample_idx", pa.int32(), nullable=False),
        pa.field("excluded", pa.bool_(), nullable=False),  # a row not trained on (mugrpo.commits.exclusion)
        pa.field("name", pa.string(), nullable=False),  # the re-scoring's name
        pa.field("reward", pa.float32(), nullable=False),  # new weighted reward
        pa.field("reward_components", pa.map_(pa.string(), pa.float32()), nullable=False),
        pa.field("reward_status", pa.string(), nullable=False),  # "ok" | "timeout" | "error: ..."
        pa.field("extracted_answer", pa.string()),  # the answer the new reward graded
        pa.field("advantage", pa.float32(), nullable=False),  # group advantage under the new rewards
        pa.field("zero_variance", pa.bool_(), nullable=False),
        pa.field("old_reward", pa.float32(), nullable=False),  # the rollout's stored reward
        pa.field("created_at", _ts, nullable=False),
    ]
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ROLLOUT_COLUMNS = ["prompt_id", "sample_idx", "group_size", "response_text", "ground_truth", "task"]


class RescoreManifest(BaseModel):
    """The commit point of a re-scoring (``rescores/NAME/stage={k}.json``), written after its shards."""

    manifest_version: int = 1
    run_id: str
    stage: int = Field(ge=0)
    name: str
    created_at: datetime
    source: list[FileRecord] = Field(description="The rollout shards re-scored, as the generate manifest lists them.")
    files: list[FileRecord] = Field(description="The rescore shards, paths relative to the run directory.")
    reward: dict[str, Any] = Field(description="The RewardConfig used, as JSON.")
    advantage: dict[str, Any] = Field(description="The AdvantageConfig used, as JSON.")
    counts: dict[str, int] = Field(description="rows, 'false negative', 'false positive', unchanged, not_ok.")


@dataclass(frozen=True)
class RescoreResult:
    """What :func:`rescore_stage` wrote (or found already written, identical).

    Attributes:
        manifest_path: the manifest's path relative to the store root.
        manifest: its content.
        reused: True when an identical re-scoring of that name already existed and nothing was written.
    """

    manifest_path: str
    manifest: RescoreManifest
    reused: bool = False

    @property
    def counts(self) -> dict[str, int]:
        return self.manifest.counts


def validate_rescore_name(name: str) -> str:
    """Return ``name`` if it is a safe single path component (``^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$``).

    Raises:
        RunRefused: it is not.
    """
    if not _NAME.match(name or ""):
        raise RunRefused(
            f"rescore name {name!r} is not allowed: use 1-64 characters from letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return name


def flip_kind(old_reward: float, new_reward: float) -> str | None:
    """``'false negative'`` (new > old: the old verifier under-credited the rollout), ``'false positive'``
    (new < old) or None (equal), comparing both as float32 (the rollouts' reward type)."""
    old, new = np.float32(old_reward), np.float32(new_reward)
    return "false negative" if new > old else "false positive" if new < old else None


def _rollout_files(store: Store, layout: RunLayout, stage: int) -> list[tuple[int, FileRecord]]:
    from mugrpo.commits.manifest import read_job_manifest

    manifest = read_job_manifest(store, layout.run_id, stage, "generate")
    if manifest is None:
        raise RunRefused(
            f"stage {stage} of run {layout.run_id!r} has not committed its rollouts: "
            f"{store.uri(layout.job_manifest(stage, 'generate'))} is missing; re-score a committed stage "
            "(`mugrpo status` lists them)"
        )
    owner = RunLayout(manifest.run_id)  # a fork's inherited stage: the parent's manifest, its files in the parent
    prefix = owner.rel(owner.rollouts_dir(stage)) + "/"
    out = []
    for rec in manifest.files:
        shard = parse_shard(posixpath.basename(rec.path)) if rec.path.startswith(prefix) else None
        if shard is not None:  # the path relative to this run (``../PARENT/...`` for a fork's inherited stage)
            out.append((shard, rec.model_copy(update={"path": layout.rel(owner.abs(rec.path))})))
    return sorted(out, key=lambda sr: sr[0])


def _existing(store: Store, rel: str) -> RescoreManifest | None:
    if not store.exists(rel):
        return None
    try:
        return RescoreManifest.model_validate_json(store.read_bytes(rel))
    except ValidationError as e:
        raise RunRefused(
            f"{store.uri(rel)} is not a valid rescore manifest ({e}); delete its folder or pick another --name"
        ) from None


def _task_refs(cfg) -> dict[str, str | None]:
    """prompt_id -> task_ref of the run's training problems: a reasoning-gym rollout is scored by its task entry,
    which the rollouts do not reference, so it is rebuilt from the run's dataset."""
    from mugrpo.data.datasets import load_problems

    problems, _ = load_problems(cfg.data.train)
    return {p.prompt_id: p.task_ref for p in problems}


def _reward_inputs(cfg, rows: list[dict], refs: dict[str, str | None], where: str) -> list:
    from mugrpo.rewards import RewardInput

    inputs = []
    for r in rows:
        ref = None
        if r.get("task"):
            if r["prompt_id"] not in refs:
                raise RunRefused(
                    f"{where}: prompt {r['prompt_id']} (task {r['task']!r}) is not in the run's training set "
                    f"{cfg.data.train.name!r} any more, so its reasoning-gym entry cannot be rebuilt to score it"
                )
            ref = refs[r["prompt_id"]]
        inputs.append(RewardInput(r["response_text"], r["ground_truth"], ref))
    return inputs


def _group_advantages(rows: list[dict], rewards: np.ndarray, advantage_cfg) -> tuple[np.ndarray, np.ndarray]:
    """Advantages [N] float32 and zero-variance flags [N] bool of one shard's rows: groups keyed by prompt and
    probe flag, normalized per distinct group size (each group must hold exactly its ``group_size`` rows)."""
    from mugrpo.scoring.advantages import compute_advantages

    adv = np.zeros(len(rows), dtype=np.float32)
    zero = np.zeros(len(rows), dtype=bool)
    ids = np.array([f"{r['prompt_id']}/{'extra' if r['excluded'] else 'train'}" for r in rows])
    sizes = np.array([r["group_size"] for r in rows])
    for g in np.unique(sizes):
        mask = sizes == g
        a, z = compute_advantages(rewards[mask], ids[mask], advantage_cfg, expected_group_size=int(g))
        adv[mask], zero[mask] = a, z
    return adv, zero


def _shard_bytes(rows: list[dict]) -> bytes:
    table = pa.Table.from_pylist(rows, schema=RESCORE_SCHEMA).replace_schema_metadata(
        {b"mugrpo.table": RESCORE_TABLE.encode(), b"mugrpo.schema_version": str(RESCORE_VERSION).encode()}
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def rescore_stage(store: Store, cfg, stage: int, name: str, reward_cfg=None, advantage_cfg=None) -> RescoreResult:
    """Re-score every committed rollout of stage ``stage`` with ``reward_cfg``, recompute the group advantages with
    ``advantage_cfg``, and write the result beside the rollouts (module docstring); the rollouts are only read.

    Args:
        store: the store holding the run (``cfg.run.root``).
        cfg: the run's config (``run.json``): its run id, and its training set to rebuild reasoning-gym entries.
        stage: the stage whose rollouts (``generate`` job committed) are re-scored.
        name: the re-scoring's name, a path component (:func:`validate_rescore_name`).
        reward_cfg: a :class:`mugrpo.rewards.RewardConfig`; default the run's ``cfg.reward``.
        advantage_cfg: a :class:`mugrpo.scoring.advantages.AdvantageConfig`; default the run's ``cfg.advantage``.

    Returns:
        the manifest written; with the name already taken by an identical re-scoring (same rollout shards, same
        reward and advantage configs), that one, nothing written (``reused``).

    Raises:
        RunRefused: a bad name; the stage's generation is not committed; the name is taken by a different
            re-scoring; a reasoning-gym prompt is no longer in the training set. Each names the path or prompt.
        mugrpo.storage.store.ChecksumError: a rollout shard differs from the sha256 its manifest recorded.
        ValueError: a group whose row count differs from its ``group_size``.
    """
    from mugrpo.algorithms import declared_columns, excluding_columns
    from mugrpo.commits.exclusion import excluded
    from mugrpo.commits.tables import read_table
    from mugrpo.rewards import RewardScorer

    validate_rescore_name(name)
    reward_cfg = reward_cfg if reward_cfg is not None else cfg.reward
    advantage_cfg = advantage_cfg if advantage_cfg is not None else cfg.advantage
    layout = RunLayout(cfg.run.id)
    shards = _rollout_files(store, layout, stage)
    source = [rec for _, rec in shards]
    reward_json = reward_cfg.model_dump(mode="json")
    advantage_json = advantage_cfg.model_dump(mode="json")
    manifest_rel = layout.rescore_manifest(name, stage)
    old = _existing(store, manifest_rel)
    if old is not None:
        if old.source == source and old.reward == reward_json and old.advantage == advantage_json:
            for rec in old.files:  # identical: still check it is intact
                store.read_bytes(layout.abs(rec.path), expected_sha256=rec.sha256)
            return RescoreResult(manifest_rel, old, reused=True)
        raise RunRefused(
            f"rescore {name!r} of stage {stage} already exists at {store.uri(manifest_rel)} with another reward "
            "config, advantage config or set of rollouts; pick another --name, or delete "
            f"{store.uri(layout.rescore_dir(name, stage))} and that manifest to redo it"
        )
    counts = {"rows": 0, "false negative": 0, "false positive": 0, "unchanged": 0, "not_ok": 0}
    files: list[FileRecord] = []
    refs: dict[str, str | None] | None = None
    with RewardScorer(reward_cfg) as scorer:
        for shard, rec in shards:
            rollout_rel = layout.abs(rec.path)
            fields = [c.field for c in declared_columns()]
            table = read_table(store, rollout_rel, "rollouts", expected_sha256=rec.sha256, extra=fields)
            old_rewards = table.column("reward").to_numpy().astype(np.float32)
            excluding = [c for c in excluding_columns() if c in table.column_names]
            rows = table.select(_ROLLOUT_COLUMNS + excluding).to_pylist()
            for row in rows:  # rows not trained on (an algorithm's extra groups) are normalized apart
                row["excluded"] = excluded(row, excluding)
            if refs is None and any(r.get("task") for r in rows):
                refs = _task_refs(cfg)
            results = scorer.score(_reward_inputs(cfg, rows, refs or {}, store.uri(rollout_rel))) if rows else []
            rewards = np.array([r.reward for r in results], dtype=np.float32)
            adv, zero = _group_advantages(rows, rewards, advantage_cfg) if rows else ([], [])
            now = datetime.now(UTC)
            out = []
            for i, (row, res) in enumerate(zip(rows, results, strict=True)):
                kind = flip_kind(old_rewards[i], rewards[i])
                counts[kind or "unchanged"] += 1
                counts["not_ok"] += res.status != "ok"
                out.append(
                    {
                        "run_id": layout.run_id,
                        "stage": stage,
                        "prompt_id": row["prompt_id"],
                        "sample_idx": row["sample_idx"],
                        "excluded": row["excluded"],
                        "name": name,
                        "reward": float(rewards[i]),
                        "reward_components": dict(sorted(res.components.items())),
                        "reward_status": res.status,
                        "extracted_answer": res.extracted_answer,
                        "advantage": float(adv[i]),
                        "zero_variance": bool(zero[i]),
                        "old_reward": float(old_rewards[i]),
                        "created_at": now,
                    }
                )
            counts["rows"] += len(out)
            data = _shard_bytes(out)
            rel = layout.rescore_shard(name, stage, shard)
            digest = store.write_bytes(rel, data)
            files.append(FileRecord(path=layout.rel(rel), sha256=digest, bytes=len(data), rows=len(out)))
    manifest = RescoreManifest(
        run_id=layout.run_id,
        stage=stage,
        name=name,
        created_at=datetime.now(UTC),
        source=source,
        files=files,
        reward=reward_json,
        advantage=advantage_json,
        counts=counts,
    )
    store.write_bytes(manifest_rel, (json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n").encode())
    return RescoreResult(manifest_rel, manifest)


def read_rescore_shard(store: Store, rel: str, expected_sha256: str | None = None) -> pa.Table:
    """A rescore shard (:data:`RESCORE_SCHEMA`), its sha256 checked when given.

    Raises:
        ValueError: the file is not a rescore table of this version.
        mugrpo.storage.store.ChecksumError: its bytes differ from ``expected_sha256``.
    """
    data = store.read_bytes(rel, expected_sha256=expected_sha256)
    table = pq.read_table(pa.BufferReader(data))
    meta = table.schema.metadata or {}
    if meta.get(b"mugrpo.table") != RESCORE_TABLE.encode() or meta.get(b"mugrpo.schema_version") != b"1":
        raise ValueError(f"{store.uri(rel)} is not a mugrpo rescore table (version {RESCORE_VERSION})")
    return table
