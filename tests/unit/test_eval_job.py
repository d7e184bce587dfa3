"""``run_eval`` directly: k > 1 samples per problem with avg@k and pass@k in the job manifest,
per-benchmark resume after a job killed between two benchmarks, and a no-op re-run of a committed job.
Tiny random policy with the real SmolLM2 tokenizer, real GSM8K rows, the real verifier pool."""

from __future__ import annotations

from collections import Counter
from math import comb
from pathlib import Path

import pyarrow as pa
import pytest

from mugrpo.commits.manifest import read_job_manifest
from mugrpo.commits.tables import read_table, write_table
from mugrpo.config import BenchmarkConfig
from mugrpo.coordination.fanout import worker_job
from mugrpo.data.datasets import DatasetConfig
from mugrpo.evaluation.worker import EvalSpec, run_eval
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store, sha256_bytes

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
RUN, K, PROMPTS = "evaljob", 4, 3


def benchmark(name: str, path: str) -> BenchmarkConfig:
    dataset = DatasetConfig(name=name, path=str(DATA / path), answer_kind="gsm8k")
    return BenchmarkConfig(dataset=dataset, num_prompts=PROMPTS, k=K, temperature=1.0, max_new_tokens=4)


A = benchmark("gsm8k_test", "gsm8k/test.jsonl")
B = benchmark("gsm8k_train", "gsm8k/train.jsonl")


def spec(root: Path, benchmarks: list[BenchmarkConfig]) -> EvalSpec:
    return EvalSpec(
        root=str(root), run_id=RUN, stage=0, seed=1, policy_dir=RunLayout(RUN).policy_dir(0), benchmarks=benchmarks,
        reward_workers=1,
    )  # fmt: skip


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. 2021 (arXiv 2107.03374), eq. 1: 1 - C(n - c, k) / C(n, k), written out here independently."""
    return 1.0 - comb(n - c, k) / comb(n, k)


def test_eval_job_k_samples_metrics_per_benchmark_resume_and_noop_rerun(tmp_path, tiny_model_dir, capfd):
    store, layout = Store(str(tmp_path)), RunLayout(RUN)
    store.upload_dir(tiny_model_dir, layout.policy_dir(0))

    # 1. Benchmark A alone: k samples of each problem, metrics keyed per benchmark in the manifest.
    first = run_eval(spec(tmp_path, [A]))
    # the sampling's progress line, at its start and at its end (the engine counts tokens as it samples them)
    err = capfd.readouterr().err
    assert f"eval policy 0: 0 tokens (0.0 tok/s), 0/{PROMPTS} prompts" in err
    assert f"/{PROMPTS} prompts, ETA" in err and f" {PROMPTS}/{PROMPTS} prompts" in err
    rows_a = read_table(store, layout.eval_file(0, A.dataset.name), "evals").to_pylist()
    assert len(rows_a) == PROMPTS * K and {r["k"] for r in rows_a} == {K}
    per_prompt = Counter(r["prompt_id"] for r in rows_a)
    assert len(per_prompt) == PROMPTS and set(per_prompt.values()) == {K}
    assert sorted(r["sample_idx"] for r in rows_a) == sorted(list(range(K)) * PROMPTS)
    keys = (f"avg@{K}", f"avg@{K}_ci95_low", f"avg@{K}_ci95_high", f"pass@{K}", f"maj@{K}")
    assert set(first.metrics) == {f"{A.dataset.name}/{key}" for key in keys}

    # 2. A job killed after A's file, before B's: no job or worker manifest. A's committed verdicts are set by hand
    #    to a known mix (prompt 1: 1 of 4 correct, prompt 2: 0 of 4, prompt 3: 4 of 4) so the metrics are not all
    #    zero.
    store.delete(layout.job_manifest(0, "eval"))
    store.delete(layout.job_manifest(0, worker_job("eval", 0, 1)))  # the (only) worker's own commit (fan-out)
    correct = {pid: n for pid, n in zip(sorted(per_prompt), (1, 0, 4), strict=True)}
    for r in rows_a:
        r["correct"] = r["sample_idx"] < correct[r["prompt_id"]]
    table = pa.Table.from_pylist(rows_a, schema=read_table(store, layout.eval_file(0, A.dataset.name), "evals").schema)
    write_table(store, layout.eval_file(0, A.dataset.name), table, "evals")
    a_bytes = store.read_bytes(layout.eval_file(0, A.dataset.name))

    resumed = run_eval(spec(tmp_path, [A, B]))
    assert store.read_bytes(layout.eval_file(0, A.dataset.name)) == a_bytes  # A was not evaluated again
    assert resumed.metrics[f"{A.dataset.name}/avg@{K}"] == (1 + 0 + 4) / (PROMPTS * K)
    expected_pass = sum(pass_at_k(K, c, K) for c in (1, 0, 4)) / PROMPTS
    assert resumed.metrics[f"{A.dataset.name}/pass@{K}"] == expected_pass == 2 / 3
    # 95% CI clustered by problem over the per-problem scores 1/4, 0, 1 (arXiv 2411.00640), cut to [0, 1]:
    # 5/12 -+ 1.96 * 0.3005 = [-0.17, 1.006]
    scores = [0.25, 0.0, 1.0]
    se = (sum((x - 5 / 12) ** 2 for x in scores) / (3 * 2)) ** 0.5
    assert 5 / 12 - 1.959964 * se < 0 and 5 / 12 + 1.959964 * se > 1
    assert resumed.metrics[f"{A.dataset.name}/avg@{K}_ci95_low"] == 0.0
    assert resumed.metrics[f"{A.dataset.name}/avg@{K}_ci95_high"] == 1.0
    rows_b = read_table(store, layout.eval_file(0, B.dataset.name), "evals").to_pylist()
    assert len(rows_b) == PROMPTS * K and {r["benchmark"] for r in rows_b} == {B.dataset.name}
    b_correct = Counter(r["prompt_id"] for r in rows_b if r["correct"])
    assert resumed.metrics[f"{B.dataset.name}/avg@{K}"] == sum(b_correct.values()) / (PROMPTS * K)
    assert {f.path for f in resumed.files} == {layout.rel(layout.eval_file(0, b.dataset.name)) for b in (A, B)}
    for record in resumed.files:
        assert record.sha256 == sha256_bytes(store.read_bytes(layout.abs(record.path)))
    assert resumed.counts == {f"{A.dataset.name}/samples": PROMPTS * K, f"{B.dataset.name}/samples": PROMPTS * K}

    # 3. A re-run of the committed job changes nothing.
    files_before = {f.path: store.read_bytes(layout.abs(f.path)) for f in resumed.files}
    again = run_eval(spec(tmp_path, [A, B]))
    assert again.created_at == resumed.created_at and again == read_job_manifest(store, RUN, 0, "eval")
    assert {p: store.read_bytes(layout.abs(p)) for p in files_before} == files_before
