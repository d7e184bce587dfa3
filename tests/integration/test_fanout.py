"""Fan-out of a stage's generation and evaluation over N worker jobs (mugrpo.jobs.fanout).

Real generate/eval job processes (``python -m mugrpo.jobs.generate SPEC``) on the tiny test model with the real
SmolLM2 tokenizer and real Parquet: N = 1 and N = 2 workers give identical rollouts, the stage's generate manifest
appears only once both workers committed, and a SIGKILLed worker resumes its own missing shards only.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import _tiny
import pyarrow as pa
import pytest

from mugrpo.commits.manifest import read_job_manifest, verify_manifest
from mugrpo.commits.tables import read_table
from mugrpo.coordination.fanout import missing_workers, owned, worker_job, worker_spec_paths
from mugrpo.data.datasets import DatasetConfig
from mugrpo.evaluation.worker import EvalSpec
from mugrpo.generation import GenerateSpec
from mugrpo.rewards import RewardConfig
from mugrpo.scoring.verifiers import VerifierPoolOwner
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store

RUN = "fan"
#: Rollout columns compared between N = 1 and N = 2: every column but ``created_at`` (a wall-clock stamp).
VOLATILE = {"created_at"}


def gen_spec(root: Path, **over) -> GenerateSpec:
    fields = dict(
        seed=11,
        num_prompts=7,
        shard_size=2,  # 4 shards, the last one short: worker 0 owns 0 and 2, worker 1 owns 1 and 3
        engine_kwargs={"num_threads": 1},
    )
    return _tiny.generate_spec(root, RUN, **{**fields, **over})


def with_policy(root: Path, tiny_model_dir: Path) -> Store:
    return _tiny.with_policy(root, tiny_model_dir, RUN)


def start(store: Store, rel: str, log: Path, **env: str) -> subprocess.Popen:
    return _tiny.start_job("generate", store.uri(rel), log, env=_tiny.job_env(**env))


def write_specs(store: Store, spec: GenerateSpec) -> list[str]:
    store.write_bytes(RunLayout(RUN).job_spec(0, "generate"), spec.model_dump_json().encode())
    return worker_spec_paths(store, RUN, 0, "generate", spec, spec.workers)


def rollouts(store: Store) -> pa.Table:
    layout = RunLayout(RUN)
    manifest = read_job_manifest(store, RUN, 0, "generate")
    tables = [read_table(store, layout.abs(f.path), "rollouts") for f in manifest.files]
    table = pa.concat_tables(tables).sort_by([("prompt_id", "ascending"), ("sample_idx", "ascending")])
    return table.drop_columns(sorted(VOLATILE))


def test_worker_ownership_is_disjoint_and_complete():
    for shards in range(0, 9):
        for n in range(1, 5):
            parts = [owned(shards, w, n) for w in range(n)]
            assert sorted(s for p in parts for s in p) == list(range(shards))
    assert owned(7, 1, 3) == [1, 4]
    with pytest.raises(ValueError, match=r"worker 2 of 2"):
        owned(4, 2, 2)
    with pytest.raises(ValueError, match="worker 3 of 2"):
        gen_spec(Path("/tmp/x"), workers=2, worker=3)
    assert worker_job("generate", 1, 2) == "generate.worker-001-of-002"


def test_agpo_probes_refuse_several_workers():
    from mugrpo.algorithms.agpo.config import AGPOConfig

    with pytest.raises(ValueError, match="workers = 1"):
        gen_spec(Path("/tmp/x"), workers=2, agpo=AGPOConfig(probe=True))


def test_verifier_pool_is_waited_ready_shared_and_restarted_on_a_new_config(monkeypatch):
    """The base both workers use (generate waited for its pool, eval did not): one pool per config, started and
    waited ready on first use, restarted on a new config, stopped on close."""
    from mugrpo.evaluation.worker import EvalWorker
    from mugrpo.generation import GenerationWorker
    from mugrpo.rewards import RewardScorer

    waited = []
    real_wait = RewardScorer.wait_ready
    monkeypatch.setattr(RewardScorer, "wait_ready", lambda self: (waited.append(self), real_wait(self))[1])
    a = RewardConfig(components={"format": 1.0}, num_workers=1)
    b = RewardConfig(components={"math_correctness": 1.0}, num_workers=1)
    assert issubclass(GenerationWorker, VerifierPoolOwner) and issubclass(EvalWorker, VerifierPoolOwner)
    with VerifierPoolOwner() as owner:
        first = owner.verifier_pool(a)
        assert owner.verifier_pool(a) is first and waited == [first]
        second = owner.verifier_pool(b)
        assert second is not first and first._pool._closed and waited == [first, second]
        assert second.score([]) == []
    assert second._pool._closed


def test_one_and_two_workers_give_identical_rollouts(tmp_path, tiny_model_dir):
    """N = 1 and N = 2 through the same job functions; rollout columns equal value for value (created_at aside).
    The generate manifest is written once both workers have committed, by the last one."""
    one = with_policy(tmp_path / "one", tiny_model_dir)
    two = with_policy(tmp_path / "two", tiny_model_dir)
    (path1,) = write_specs(one, gen_spec(tmp_path / "one"))
    paths2 = write_specs(two, gen_spec(tmp_path / "two", workers=2))
    assert paths2 == [f"{RUN}/jobs/stage=0/generate.worker-000-of-002.spec.json", paths2[0].replace("000-of", "001-of")]
    log = tmp_path / "jobs.log"
    procs = [start(one, path1, log)]
    # worker 0 of 2 alone first: its manifest is written, the stage's is not
    assert start(two, paths2[0], log).wait(timeout=600) == 0, log.read_text()[-3000:]
    assert read_job_manifest(two, RUN, 0, "generate") is None
    assert missing_workers(two, RUN, 0, "generate", 2) == [1]
    w0 = read_job_manifest(two, RUN, 0, worker_job("generate", 0, 2))
    assert [f.path for f in w0.files] == [f"rollouts/stage=0/shard={s:05d}.parquet" for s in (0, 2)]
    procs.append(start(two, paths2[1], log))
    for p in procs:
        assert p.wait(timeout=600) == 0, log.read_text()[-3000:]

    m1, m2 = read_job_manifest(one, RUN, 0, "generate"), read_job_manifest(two, RUN, 0, "generate")
    assert m1.counts["workers"] == 1 and m2.counts["workers"] == 2
    assert {k: v for k, v in m1.counts.items() if k != "workers"} == {
        k: v for k, v in m2.counts.items() if k != "workers"
    }
    assert m2.counts["rows"] == 7 * 3 and m2.counts["shards"] == 4
    assert [f.sha256 for f in m1.files] != [] and [f.path for f in m1.files] == [f.path for f in m2.files]
    verify_manifest(two, m2)
    t1, t2 = rollouts(one), rollouts(two)
    assert t1.num_rows == t2.num_rows == 21
    assert t1.column_names == t2.column_names
    for name in t1.column_names:
        assert t1[name].to_pylist() == t2[name].to_pylist(), name
    assert "from 2 worker(s)" in log.read_text()


def test_a_killed_worker_resumes_its_own_missing_shards_only(tmp_path, tiny_model_dir):
    """Worker 1 of 2 is SIGKILLed after its first shard, in the middle of writing its second (a fault pause before
    the rename): its re-run samples only that shard, worker 0's files are untouched, and the stage's generation
    commit follows."""
    store = with_policy(tmp_path / "run", tiny_model_dir)
    paths = write_specs(store, gen_spec(tmp_path / "run", workers=2, num_prompts=8))
    log = tmp_path / "jobs.log"
    assert start(store, paths[0], log).wait(timeout=600) == 0, log.read_text()[-3000:]
    layout = RunLayout(RUN)
    w0_before = {s: store.read_bytes(layout.rollout_shard(0, s)) for s in (0, 2)}

    proc = start(store, paths[1], log, MUGRPO_FAULT_PAUSE="shard=00003.parquet:120")
    first = Path(store.local_path(layout.rollout_shard(0, 1)))
    deadline = time.monotonic() + 600
    while not (first.exists() and "MUGRPO_FAULT_PAUSE" in log.read_text()):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert missing_workers(store, RUN, 0, "generate", 2) == [1]
    shard1 = first.read_bytes()
    log2 = tmp_path / "rerun.log"
    assert start(store, paths[1], log2).wait(timeout=600) == 0, log2.read_text()[-3000:]
    out = log2.read_text()
    assert "worker 1 of 2 owns 2 (1 already written)" in out
    assert first.read_bytes() == shard1  # a committed shard is never re-sampled
    assert {s: store.read_bytes(layout.rollout_shard(0, s)) for s in (0, 2)} == w0_before
    manifest = read_job_manifest(store, RUN, 0, "generate")
    assert manifest is not None and manifest.counts["rows"] == 8 * 3
    verify_manifest(store, manifest)


def test_eval_workers_split_the_benchmarks(tmp_path, tiny_model_dir):
    """eval.workers: worker w runs benchmarks w, w + N, ...; the eval manifest holds every benchmark's avg@k."""
    store = with_policy(tmp_path / "run", tiny_model_dir)
    benches = [
        {
            "dataset": {"name": name, "path": str(_tiny.DATA_DIR / path), "answer_kind": kind},
            "num_prompts": 2,
            "max_new_tokens": 4,
        }
        for name, path, kind in [
            ("gsm8k", "gsm8k/test.jsonl", "gsm8k"),
            ("gsm8k_train", "gsm8k/train.jsonl", "gsm8k"),
            ("gsm8k_b", "gsm8k/test.jsonl", "gsm8k"),
        ]
    ]
    spec = EvalSpec(
        root=str(tmp_path / "run"),
        run_id=RUN,
        stage=0,
        policy_dir=RunLayout(RUN).policy_dir(0),
        benchmarks=benches,
        reward_workers=1,
        workers=2,
        engine_kwargs={"num_threads": 1},
    )
    store.write_bytes(RunLayout(RUN).job_spec(0, "eval"), spec.model_dump_json().encode())
    paths = worker_spec_paths(store, RUN, 0, "eval", spec, 2)
    log = tmp_path / "eval.log"
    procs = [_tiny.start_job("eval", store.uri(p), log) for p in paths]
    for p in procs:
        assert p.wait(timeout=600) == 0, log.read_text()[-3000:]
    w0 = read_job_manifest(store, RUN, 0, worker_job("eval", 0, 2))
    w1 = read_job_manifest(store, RUN, 0, worker_job("eval", 1, 2))
    assert [f.path for f in w0.files] == ["evals/stage=0/gsm8k.parquet", "evals/stage=0/gsm8k_b.parquet"]
    assert [f.path for f in w1.files] == ["evals/stage=0/gsm8k_train.parquet"]
    manifest = read_job_manifest(store, RUN, 0, "eval")
    metrics = ("avg@1", "avg@1_ci95_low", "avg@1_ci95_high", "pass@1", "maj@1")  # the eval contract, per benchmark
    assert sorted(manifest.metrics) == sorted(f"{b}/{m}" for b in ("gsm8k", "gsm8k_train", "gsm8k_b") for m in metrics)
    assert manifest.counts == {"gsm8k/samples": 2, "gsm8k_train/samples": 2, "gsm8k_b/samples": 2}
    # the same benchmark on the same policy with the same seed, from two workers: the same answers
    a = read_table(store, RunLayout(RUN).eval_file(0, "gsm8k"), "evals")
    b = read_table(store, RunLayout(RUN).eval_file(0, "gsm8k_b"), "evals")
    assert a["prompt_id"].to_pylist() == b["prompt_id"].to_pylist()


def test_config_refuses_several_workers_with_agpo_probes_or_warm_execution(tmp_path):
    from mugrpo.config import config_from_dict

    base = {
        "run": {"id": "c", "root": str(tmp_path)},
        "data": {"train": {"name": "gsm8k", "path": str(_tiny.DATA_DIR / "gsm8k/train.jsonl"), "answer_kind": "gsm8k"}},
        "generation": {"workers": 2},
    }
    assert config_from_dict(base).generation.workers == 2
    with pytest.raises(ValueError, match="agpo.probe, so its probes need generation.workers = 1|its probes need"):
        config_from_dict({**base, "agpo": {"probe": True}})
    with pytest.raises(ValueError, match="execution = cold"):
        config_from_dict({**base, "orchestration": {"execution": "warm"}})
