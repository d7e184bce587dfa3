"""Datasets: all five shared sets load with config-only field mapping; bad rows name file and line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from mugrpo.data.datasets import DatasetConfig, DatasetError, load_problems, prompt_id_for

#: prompt_id_for("What is 2+2?", "4"), pinned when the id was defined: it must never change.
PINNED_PROMPT_ID = "0aac1a47b77bf866"

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
if not DATA.exists():  # CI clones into another folder with shared/ beside it
    DATA = Path.cwd().parent / "shared" / "data"

SETS = [
    ("gsm8k/train.jsonl", dict(question_field="question", answer_field="answer", answer_kind="gsm8k"), 7473),
    ("gsm8k/test.jsonl", dict(question_field="question", answer_field="answer", answer_kind="gsm8k"), 1319),
    ("math500/test.jsonl", dict(question_field="problem", answer_field="answer", answer_kind="plain"), 500),
    ("aime24/test.jsonl", dict(question_field="problem", answer_field="answer", answer_kind="plain"), 30),
    ("amc23/test.jsonl", dict(question_field="question", answer_field="answer", answer_kind="plain"), 40),
]


def _count_rows(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


@pytest.mark.parametrize("rel,mapping,rows", SETS, ids=[s[0] for s in SETS])
def test_shared_datasets_load_with_a_gold_answer_for_every_row(rel, mapping, rows):
    path = DATA / rel
    assert _count_rows(path) == rows
    problems, report = load_problems(DatasetConfig(name=rel.split("/")[0], path=str(path), **mapping))
    assert report.rows == rows
    assert report.loaded + report.duplicates == rows and not report.skipped
    assert all(p.ground_truth.strip() for p in problems)
    assert len({p.prompt_id for p in problems}) == len(problems)


def test_math500_solutions_yield_boxed_golds():
    problems, report = load_problems(
        DatasetConfig(
            name="math",
            path=str(DATA / "math500/test.jsonl"),
            question_field="problem",
            answer_field="solution",
            answer_kind="boxed",
        )
    )
    assert report.loaded == 500 and all(p.ground_truth for p in problems)


def test_gold_extraction_per_kind():
    gsm8k = DatasetConfig(name="g", path=str(DATA / "gsm8k/test.jsonl"), answer_kind="gsm8k", limit=1)
    problems, _ = load_problems(gsm8k)
    assert problems[0].ground_truth == "18"  # first GSM8K test answer ends with '#### 18'
    amc, _ = load_problems(DatasetConfig(name="a", path=str(DATA / "amc23/test.jsonl"), answer_kind="plain"))
    assert all("." not in p.ground_truth for p in amc if float(p.ground_truth).is_integer())


def test_prompt_ids_are_stable_content_hashes():
    # Pinned: sha256("What is 2+2?\x00" + "4")[:16]. A changed id orphans every committed rollout of old runs.
    assert prompt_id_for("What is 2+2?", "4") == PINNED_PROMPT_ID
    assert hashlib.sha256(b"What is 2+2?\x004").hexdigest()[:16] == PINNED_PROMPT_ID  # the documented formula
    assert prompt_id_for("What is 2+2?", "4") != prompt_id_for("What is 2+3?", "4")
    assert len(prompt_id_for("q", "a")) == 16


def _write(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_malformed_row_names_file_and_line(tmp_path):
    f = _write(tmp_path / "d.jsonl", [{"question": "q1", "answer": "#### 1"}, "{not json", {"question": "q3"}])
    with pytest.raises(DatasetError, match=r"d\.jsonl:2: invalid JSON"):
        load_problems(DatasetConfig(name="d", path=str(f), answer_kind="gsm8k"))
    f2 = _write(tmp_path / "e.jsonl", [{"question": "q1", "answer": "#### 1"}, {"question": "q3"}])
    with pytest.raises(DatasetError, match=r"e\.jsonl:2: missing field 'answer'"):
        load_problems(DatasetConfig(name="e", path=str(f2), answer_kind="gsm8k"))


def test_skip_mode_counts_skips_in_the_summary(tmp_path):
    f = _write(
        tmp_path / "d.jsonl",
        [
            {"question": "q1", "answer": "#### 1"},
            "{not json",
            {"question": "q3"},
            {"question": " ", "answer": "#### 2"},
            {"question": "q1", "answer": "#### 1"},
            {"question": "q5", "answer": "no marker"},
        ],
    )
    problems, report = load_problems(DatasetConfig(name="d", path=str(f), answer_kind="gsm8k", on_bad_row="skip"))
    assert [p.question for p in problems] == ["q1"]
    assert report.rows == 6 and report.duplicates == 1 and sum(report.skipped.values()) == 4
    assert "skipped" in report.summary()


def test_new_benchmark_needs_config_only(tmp_path):
    # A file with other field names (question + integer ground_truth) loads through the mapping alone.
    f = _write(tmp_path / "new.jsonl", [{"q": "1+1?", "ground_truth": 2}, {"q": "2+2?", "ground_truth": 4}])
    problems, _ = load_problems(
        DatasetConfig(name="new", path=str(f), question_field="q", answer_field="ground_truth", answer_kind="plain")
    )
    assert [p.ground_truth for p in problems] == ["2", "4"]


def test_parquet_input(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"problem": ["x?"], "answer": ["\\frac{1}{2}"]}), tmp_path / "p.parquet")
    problems, _ = load_problems(
        DatasetConfig(name="p", path=str(tmp_path / "p.parquet"), question_field="problem", answer_kind="plain")
    )
    assert problems[0].ground_truth == "\\frac{1}{2}"
