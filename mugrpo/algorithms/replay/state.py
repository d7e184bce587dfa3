"""The replay buffer's state in object storage: compact Parquet of rollout references (docs/design.md,
"Algorithms"), written with every checkpoint (``replay_buffer.parquet`` inside the checkpoint folder, covered by its
marker) and at each stage's train commit (``replay_buffer/stage=k/buffer.parquet``, listed in the job manifest).
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from mugrpo.algorithms.replay.buffer import ReplayBuffer
from mugrpo.algorithms.replay.config import ReplayConfig
from mugrpo.commits.manifest import read_job_manifest
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import FileRecord

#: File name of the buffer state inside a checkpoint folder.
CHECKPOINT_FILE = "replay_buffer.parquet"


def stage_buffer_path(layout: RunLayout, stage: int) -> str:
    """``replay_buffer/stage=k/buffer.parquet``: the buffer after the last update of ``stage``."""
    return layout.stage_state("replay_buffer", stage, "buffer.parquet")


def buffer_to_bytes(buffer: ReplayBuffer) -> bytes:
    """The buffer's state as Parquet bytes (zstd)."""
    out = io.BytesIO()
    pq.write_table(buffer.to_table(), out, compression="zstd")
    return out.getvalue()


def buffer_from_bytes(data: bytes, config: ReplayConfig, where: str) -> ReplayBuffer:
    """A buffer with the state in ``data`` (see :func:`buffer_to_bytes`).

    Raises:
        ValueError: not a buffer state (names ``where``).
    """
    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{where}: not a replay buffer state: {e}") from None
    buffer = ReplayBuffer(config)
    buffer.load_table(table, where)
    return buffer


def write_stage_buffer(store: Store, layout: RunLayout, stage: int, buffer: ReplayBuffer) -> FileRecord:
    """Write the buffer as it is after the last update of ``stage`` (atomically); returns its FileRecord."""
    rel = stage_buffer_path(layout, stage)
    data = buffer_to_bytes(buffer)
    digest = store.write_bytes(rel, data)
    return FileRecord(path=layout.rel(rel), sha256=digest, bytes=len(data), rows=len(buffer))


def read_stage_buffer(store: Store, layout: RunLayout, stage: int, config: ReplayConfig) -> ReplayBuffer:
    """The buffer committed by the train job of ``stage`` (verified against its job manifest's sha256); an empty
    buffer for ``stage < 0`` (before the first stage).

    Raises:
        FileNotFoundError: the stage's train job has not committed, or committed without a buffer state (a run
            whose earlier stages trained without replay).
        mugrpo.storage.store.ChecksumError: the file changed after the manifest was written.
    """
    if stage < 0:
        return ReplayBuffer(config)
    rel = stage_buffer_path(layout, stage)
    manifest = read_job_manifest(store, layout.run_id, stage, "train")
    if manifest is None:
        raise FileNotFoundError(f"stage {stage}: the train job has not committed; its replay buffer is unknown")
    owner = RunLayout(manifest.run_id)  # a fork's inherited stage: the parent's manifest, paths in its run
    record = next((f for f in manifest.files if f.path == owner.rel(rel)), None)
    if record is None:
        raise FileNotFoundError(
            f"{store.uri(layout.job_manifest(stage, 'train'))} lists no replay buffer ({layout.rel(rel)}): "
            f"stage {stage} was trained without replay.enabled"
        )
    return buffer_from_bytes(store.read_bytes(rel, expected_sha256=record.sha256), config, store.uri(rel))
