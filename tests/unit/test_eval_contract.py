"""The eval contract in SQL (``eval_problems``, ``eval_scores``) gives the figures the eval job's manifest holds
(mugrpo.evaluation.worker.bench_metrics): avg@k with its 95% CI clustered by problem, pass@k and maj@k. Real Parquet
files written with the real schema and committed with a real stage manifest, real DuckDB."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from mugrpo.commits.manifest import new_manifest, write_manifest
from mugrpo.commits.tables import write_table
from mugrpo.evaluation.worker import bench_metrics
from mugrpo.sql import connect
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store, sha256_bytes
from schemas import EVAL_SCHEMA, FileRecord, StageTimings

K, PROBLEMS = 4, 30


def eval_rows(stage: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for p in range(PROBLEMS):
        truth = str(p)
        for i in range(K):
            roll = rng.random()
            answer = truth if roll < 0.3 + 0.1 * stage else (None if roll > 0.9 else str(p + rng.randint(1, 2)))
            rows.append(
                dict(
                    run_id="ev", stage=stage, benchmark="gsm8k", prompt_id=f"q{p:02d}", sample_idx=i, k=K,
                    prompt_text="q", response_text=f"\\boxed{{{answer}}}", num_tokens=5, finish_reason="stop",
                    ground_truth=truth, extracted_answer=answer, correct=answer == truth, reward_status="ok",
                    temperature=0.6, top_p=0.95, created_at=datetime(2026, 1, 1, tzinfo=UTC), task=None,
                    task_metadata=None,
                )
            )  # fmt: skip
    rng.shuffle(rows)  # the views and the job must not depend on row order
    return rows


@pytest.fixture
def run_root(tmp_path: Path) -> tuple[Path, dict[int, list[dict]]]:
    store = Store(str(tmp_path))
    layout = RunLayout("ev")
    store.write_json(layout.run_json, {"config": {}})
    written = {}
    for stage in (0, 1):
        rows = eval_rows(stage, seed=stage)
        rel = layout.eval_file(stage, "gsm8k")
        write_table(store, rel, pa.Table.from_pylist(rows, schema=EVAL_SCHEMA), "evals")
        data = store.read_bytes(rel)
        record = FileRecord(path=layout.rel(rel), sha256=sha256_bytes(data), bytes=len(data), rows=len(rows))
        write_manifest(
            store,
            new_manifest(
                "ev",
                stage,
                [record],
                counts={},
                timings=StageTimings(t_gen=1.0, t_train=1.0, t_eval=1.0, t_switch=0.0, t_total=3.0),
            ),
        )
        written[stage] = rows
    return tmp_path, written


def test_sql_eval_scores_equal_the_eval_jobs_metrics(run_root):
    root, written = run_root
    with connect(str(root / "ev")) as cat:
        scores = cat.arrow("SELECT * FROM eval_scores ORDER BY stage").to_pylist()
        problems = cat.arrow("SELECT count(*) AS n FROM eval_problems").to_pylist()[0]["n"]
    assert problems == 2 * PROBLEMS and [s["stage"] for s in scores] == [0, 1]
    for row in scores:
        job = bench_metrics(written[row["stage"]], K)
        assert row["problems"] == PROBLEMS and row["k"] == K
        assert row["avg_at_k"] == pytest.approx(job[f"avg@{K}"], abs=1e-12)
        assert row["ci95_low"] == pytest.approx(job[f"avg@{K}_ci95_low"], abs=1e-12)
        assert row["ci95_high"] == pytest.approx(job[f"avg@{K}_ci95_high"], abs=1e-12)
        assert row["maj_at_k"] == pytest.approx(job[f"maj@{K}"], abs=1e-12)
        assert row["pass_at_k"] == pytest.approx(job[f"pass@{K}"], abs=1e-12)
        assert row["ci95_low"] < row["avg_at_k"] < row["ci95_high"]


def test_verifier_audit_counts_wrong_responses_a_looser_reading_accepts(tmp_path: Path):
    """The false-negative audit (arXiv 2505.22203) over hand-made eval rows: the reward called them all wrong."""
    cases = [  # (response, gold, a looser reading accepts)
        ("2 * 7 = 14 + 7 = 21. So, the answer is 21.", "21", True),  # unboxed: the strict format refuses it
        ("The total is 1,000 dollars.", "1000", True),  # thousands separator
        ("So we get \\boxed{12} apples, or 13 if we count the core.", "12", False),  # last number 13
        ("I cannot solve this.", "5", False),  # no number
        ("x = 3", "\\frac{1}{2}", False),  # a gold that is not a number: not checkable
    ]
    rows = [
        dict(
            run_id="va", stage=1, benchmark="gsm8k", prompt_id=f"q{i}", sample_idx=0, k=1, prompt_text="q",
            response_text=text, num_tokens=5, finish_reason="stop", ground_truth=gold, extracted_answer=None,
            correct=False, reward_status="ok", temperature=0.0, top_p=1.0,
            created_at=datetime(2026, 1, 1, tzinfo=UTC), task=None, task_metadata=None,
        )
        for i, (text, gold, _) in enumerate(cases)
    ]  # fmt: skip
    store, layout = Store(str(tmp_path)), RunLayout("va")
    store.write_json(layout.run_json, {"config": {}})
    rel = layout.eval_file(1, "gsm8k")
    write_table(store, rel, pa.Table.from_pylist(rows, schema=EVAL_SCHEMA), "evals")
    data = store.read_bytes(rel)
    record = FileRecord(path=layout.rel(rel), sha256=sha256_bytes(data), bytes=len(data), rows=len(rows))
    timings = StageTimings(t_gen=1.0, t_train=1.0, t_eval=1.0, t_switch=0.0, t_total=3.0)
    write_manifest(store, new_manifest("va", 1, [record], counts={}, timings=timings))
    with connect(str(tmp_path / "va")) as cat:
        audit = cat.arrow("SELECT * FROM verifier_audit").to_pylist()
        samples = cat.arrow(
            "SELECT prompt_id, loose_accepts FROM verifier_audit_samples ORDER BY prompt_id"
        ).to_pylist()
    assert [s["loose_accepts"] for s in samples] == [c[2] for c in cases]
    assert audit == [
        dict(source="evals", run_id="va", stage=1, wrong=5, numeric_gold=4, loose_accepts=2, loose_accept_rate=0.5)
    ]
