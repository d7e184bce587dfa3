"""An operational override on resume: a run started with ``generation.workers: 1`` is SIGKILLed (the whole
process tree) in the middle of stage 1's generation, with one shard of the stage committed and the next one half
written, then resumed with ``mugrpo resume RUN generation.workers=2``. Its rollouts (every column but created_at)
and final weights equal an uninterrupted ``workers: 1`` run's, and run.json's history records the change with the
stage it took effect.

Real CLI (`mugrpo run`, `mugrpo resume`), real Prefect flows on a local Prefect server, real job subprocesses, the
tiny policy. The kill lands at a fixed point: the shard's write pauses between its temporary file and the rename
(``MUGRPO_FAULT_PAUSE``) and the test kills the tree while it waits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from safetensors.torch import load_file

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
RUN = "workers"

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_data_dir")]


def config(root: Path, model_dir: Path) -> dict:
    return {
        "run": {"id": RUN, "root": str(root), "seed": 5, "num_stages": 2},
        "model": {"source": str(model_dir), "max_context": 512},
        "data": {
            "train": {"name": "gsm8k", "path": str(DATA / "gsm8k/train.jsonl"), "answer_kind": "gsm8k", "limit": 40}
        },
        "generation": {
            "prompts_per_stage": 8,
            "shard_size": 2,
            "workers": 1,
            "engine_kwargs": {"num_threads": 1},
            "sampling": {"temperature": 1.0, "max_new_tokens": 6, "n": 2},
        },
        "reward": {"components": {"math_correctness": 1.0, "format": 0.5}, "num_workers": 1},
        "train": {
            "updates_per_stage": 2,
            "rollouts_per_update": 4,
            "micro_batch_size": 2,
            "checkpoint_every": 1,
            "skip_zero_variance_groups": False,
            "lr": 1e-3,
        },
        "eval": {"benchmarks": []},
        "orchestration": {"retries": 0},
    }


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (jobs run in their own sessions, so a process group is not enough)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def mugrpo(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mugrpo.cli", *args], env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )


def rollouts(run: Path) -> list[dict]:
    tables = [pq.read_table(f) for f in sorted((run / "rollouts").rglob("shard=*.parquet"))]
    table = pa.concat_tables(tables).drop_columns(["created_at"])
    return sorted(table.to_pylist(), key=lambda r: (r["stage"], r["prompt_id"], r["sample_idx"]))


def test_workers_1_to_2_mid_stage_gives_the_uninterrupted_rollouts_and_weights(tmp_path, tiny_model_dir, prefect_api):
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PYTHONUNBUFFERED": "1", "MUGRPO_RUN_SLOT": "off"}

    ref_yaml = tmp_path / "ref.yaml"
    ref_yaml.write_text(yaml.safe_dump(config(tmp_path / "ref", tiny_model_dir)))
    proc = mugrpo(["run", str(ref_yaml)], env, tmp_path / "ref.log")
    assert proc.wait(timeout=1800) == 0, (tmp_path / "ref.log").read_text()[-4000:]

    killed_yaml = tmp_path / "killed.yaml"
    killed_yaml.write_text(yaml.safe_dump(config(tmp_path / "killed", tiny_model_dir)))
    run = tmp_path / "killed" / RUN
    log = tmp_path / "killed.log"
    proc = mugrpo(["run", str(killed_yaml)], {**env, "MUGRPO_FAULT_PAUSE": "stage=1/shard=00001.parquet:900"}, log)
    stage1 = run / "rollouts" / "stage=1"
    deadline = time.monotonic() + 1800
    while not (stage1.is_dir() and any(p.name.startswith(".shard=00001.parquet.tmp-") for p in stage1.iterdir())):
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.05)
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)
    assert sorted(p.name for p in stage1.glob("shard=*.parquet")) == ["shard=00000.parquet"]  # mid-stage
    # stage 1's generation ran beside the end of stage 0's train job (orchestration.overlap_checkpoint), so stage 0's
    # training is committed and its stage manifest is written by the resume
    assert (run / "jobs/stage=0/train.manifest.json").exists() and not (run / "stages/stage=0.json").exists()
    assert not (run / "jobs/stage=1/generate.manifest.json").exists()

    proc = mugrpo(["resume", str(run), "generation.workers=2"], env, log)
    assert proc.wait(timeout=1800) == 0, log.read_text()[-4000:]

    gen = json.loads((run / "jobs/stage=1/generate.manifest.json").read_text())
    assert gen["counts"]["workers"] == 2 and gen["counts"]["rows"] == 8 * 2
    assert rollouts(run) == rollouts(tmp_path / "ref" / RUN)
    final, reference = (load_file(str(r / "policies/stage=2/model.safetensors")) for r in (run, tmp_path / "ref" / RUN))
    assert final.keys() == reference.keys() and all(final[k].equal(reference[k]) for k in final)

    doc = json.loads((run / "run.json").read_text())
    assert doc["config"]["generation"]["workers"] == 2
    resumed = [e for e in doc["history"] if e.get("changes")]
    # the first stage not committed when the resume began: stage 0 (its manifest waited for stage 1's generation)
    assert len(resumed) == 1 and resumed[0]["stage"] == 0
    assert resumed[0]["changes"] == [{"key": "generation.workers", "from": 1, "to": 2, "class": "operational"}]
