"""Answer extraction on hand cases and on every row of the real datasets (../shared/data)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mugrpo.data.answers import (
    extract_answer,
    extract_answer_loose,
    extract_boxed,
    extract_gold,
    extract_gsm8k_gold,
    split_answers,
)

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_data = pytest.mark.usefixtures("shared_data_dir")  # skipped without the data; a failure under CI


def _rows(relative: str) -> list[dict]:
    with open(DATA_DIR / relative, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# --- extract_boxed -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so $x = \boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"\boxed{ 42 }", "42"),
        (r"\fbox{7}", "7"),
        (r"\boxed {\sqrt{\frac{a}{b}}}", r"\sqrt{\frac{a}{b}}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are literal
        (r"\boxed{\left\{ x \right.}", r"\left\{ x \right."),
        (r"\boxed{}", ""),
    ],
)
def test_extract_boxed(text: str, expected: str) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "no box here, 42",
        r"\boxed{\frac{1}{2}",  # unbalanced
        r"\boxed{1} and finally \boxed{\frac{2}",  # last box truncated: earlier complete one is not used
        r"\boxed 5",  # no brace group
    ],
)
def test_extract_boxed_absent_or_unbalanced(text: str) -> None:
    assert extract_boxed(text) is None


# --- gold answers ------------------------------------------------------------------------------------


def test_gsm8k_gold_removes_thousands_separators() -> None:
    assert extract_gsm8k_gold("He pays 1,000 + 234 = <<1000+234=1234>>1,234\n#### 1,234") == "1234"
    assert extract_gsm8k_gold("#### 1,000,000") == "1000000"
    assert extract_gsm8k_gold("#### -3.5") == "-3.5"


def test_gsm8k_gold_missing_marker_names_the_source() -> None:
    with pytest.raises(ValueError, match=r"gsm8k/train.jsonl row 3.*no '#### <answer>'"):
        extract_gsm8k_gold("The answer is 5.", source="gsm8k/train.jsonl row 3")
    with pytest.raises(ValueError, match="empty answer"):
        extract_gsm8k_gold("reasoning\n####   \n")


@pytest.mark.parametrize(
    ("raw", "kind", "expected"),
    [
        (27.0, "plain", "27"),
        (2.5, "plain", "2.5"),
        (-4.0, "plain", "-4"),
        (204, "plain", "204"),
        ("  025 ", "plain", "025"),
        (r"\frac{14}{3}", "plain", r"\frac{14}{3}"),
        (r"so $\boxed{\frac{\sqrt{3}}{2}}$.", "boxed", r"\frac{\sqrt{3}}{2}"),
        ("steps\n#### 72", "gsm8k", "72"),
        ("steps\n#### 72", "auto", "72"),
        (r"hence $\boxed{7}$", "auto", "7"),
        ("p - q", "auto", "p - q"),
        (36.0, "auto", "36"),
    ],
)
def test_extract_gold_kinds(raw: object, kind: str, expected: str) -> None:
    assert extract_gold(raw, kind) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "kind", "message"),
    [
        ("no answer here", "gsm8k", "no '#### <answer>'"),
        ("no box here", "boxed", r"no \\boxed"),
        (r"so \boxed{1", "boxed", "never closed"),
        (r"so \boxed{1", "auto", "never closed"),
        (r"\boxed{}", "boxed", "empty"),
        ("   ", "plain", "empty"),
        (None, "plain", "str, int or float"),
        (True, "auto", "str, int or float"),
        (float("nan"), "plain", "finite"),
        (3, "gsm8k", "needs a str"),
        ("72", "latex", "unknown gold kind 'latex'; known kinds"),
    ],
)
def test_extract_gold_errors(raw: object, kind: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        extract_gold(raw, kind)  # type: ignore[arg-type]


# --- real datasets: every row yields a non-empty gold ------------------------------------------------


@needs_data
@pytest.mark.parametrize("split", ["train", "test"])
def test_every_gsm8k_row_has_a_numeric_gold(split: str) -> None:
    rows = _rows(f"gsm8k/{split}.jsonl")
    assert len(rows) == {"train": 7473, "test": 1319}[split]
    for i, row in enumerate(rows):
        gold = extract_gold(row["answer"], "gsm8k", source=f"gsm8k/{split}.jsonl row {i}")
        assert gold == extract_gold(row["answer"], "auto")
        float(gold)  # every GSM8K gold is a plain number once separators are gone
        assert "," not in gold


@needs_data
def test_every_math500_row_has_a_gold_and_its_solution_box_agrees() -> None:
    rows = _rows("math500/test.jsonl")
    assert len(rows) == 500
    for i, row in enumerate(rows):
        gold = extract_gold(row["answer"], "plain", source=f"math500 row {i}")
        boxed = extract_boxed(row["solution"])
        assert boxed, f"math500 row {i}: no box in solution"
        # The dataset's `answer` field is exactly its solution's last box (checked on all 500 rows); the solution's
        # gold is the set of its boxes: 7 rows box the answer twice (one answer), row 451 boxes two forms of it.
        assert boxed == gold
        assert gold in split_answers(extract_gold(row["solution"], "boxed"))
        assert len(split_answers(extract_gold(row["solution"], "boxed"))) == (2 if i == 451 else 1)


@needs_data
@pytest.mark.parametrize(("relative", "count"), [("aime24/test.jsonl", 30), ("amc23/test.jsonl", 40)])
def test_every_competition_row_has_an_integer_gold(relative: str, count: int) -> None:
    rows = _rows(relative)
    assert len(rows) == count
    for i, row in enumerate(rows):
        gold = extract_gold(row["answer"], "plain", source=f"{relative} row {i}")
        # AIME/AMC answers are integers: "27", never "27.0" (AMC23 stores floats).
        assert re.fullmatch(r"-?\d+", gold), (relative, i, gold)


# --- predicted answers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "strict", "loose"),
    [
        (r"First 2+2=4. So the answer is \boxed{\frac{1}{2}}.", r"\frac{1}{2}", r"\frac{1}{2}"),
        ("Natalia sold 48+24 = 72 clips.\n#### 72", "72", "72"),
        ("#### 1,234 dollars\nextra line", "1234 dollars", "1234 dollars"),
        ("She earns 12 * 5 = 60 dollars, so 1,060 in total.", None, "1060"),
        ("  I do NOT   know ", None, "i do not know"),
        (r"\boxed{\text{Evelyn}}", r"\text{Evelyn}", r"\text{evelyn}"),
        (r"maybe \boxed{3} but then \boxed{\frac{1}{", None, "1"),  # truncated last box: no strict answer
    ],
)
def test_extract_answer_strict_and_loose(response: str, strict: str | None, loose: str) -> None:
    assert extract_answer(response) == strict
    assert extract_answer_loose(response) == loose


def test_loose_keys_group_equal_final_answers() -> None:
    keys = {extract_answer_loose(r) for r in [r"... \boxed{ 72 }", "so\n#### 72", "the total is 72"]}
    assert keys == {"72"}
