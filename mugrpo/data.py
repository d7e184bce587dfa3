"""Prompt datasets: JSON Lines or Parquet files with a configurable field mapping.

Field names differ between public math sets (GSM8K: question/answer with ``#### N``; MATH-500: problem/solution/answer;
AMC23: answer as a float). The mapping lives in :class:`DatasetConfig`, never in code special cases.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import fsspec
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from mugrpo.answers import extract_gold


class DatasetError(ValueError):
    """A dataset row or file is malformed; the message names the file and the line (1-based) or row (0-based)."""


class DatasetConfig(BaseModel):
    """Where a prompt set lives and how its fields map to (question, gold answer)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Short name used in tables and reports, e.g. 'gsm8k'.")
    path: str = Field(
        description="Local path (relative to the working directory) or fsspec URL of a .jsonl/.parquet file."
    )
    format: Literal["auto", "jsonl", "parquet"] = Field("auto", description="'auto' picks by file suffix.")
    question_field: str = Field(
        "question", description="Field holding the problem text (GSM8K 'question', MATH 'problem')."
    )
    answer_field: str = Field("answer", description="Field holding the gold answer or a solution containing it.")
    answer_kind: Literal["auto", "gsm8k", "boxed", "plain"] = Field(
        "auto",
        description="How to extract the gold answer: 'gsm8k' (text after '#### '), 'boxed' (last \\boxed{} of a "
        "solution), 'plain' (the value itself, e.g. amc23's 27.0 -> '27'), 'auto' (try them in that order).",
    )
    on_bad_row: Literal["error", "skip"] = Field(
        "error", description="'error' stops at the first malformed row naming file and line; 'skip' counts it."
    )
    limit: int | None = Field(None, ge=1, description="Keep only the first N problems (after de-duplication).")


@dataclass(frozen=True)
class Problem:
    """One prompt row: ``prompt_id`` is a stable content hash of (question, gold)."""

    prompt_id: str
    question: str
    ground_truth: str
    source: str  # "file:line" for error messages and audits


@dataclass
class LoadReport:
    """What loading a dataset did: rows read, problems kept, skips by reason, duplicates dropped."""

    path: str
    rows: int = 0
    loaded: int = 0
    duplicates: int = 0
    skipped: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        skips = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items())) or "none"
        return f"{self.path}: {self.rows} rows, {self.loaded} problems, {self.duplicates} duplicates, skipped {skips}"


def prompt_id_for(question: str, ground_truth: str) -> str:
    """Stable id of a problem: the first 16 hex digits of sha256(question + NUL + gold)."""
    return hashlib.sha256(f"{question}\x00{ground_truth}".encode()).hexdigest()[:16]


def _iter_rows(cfg: DatasetConfig):
    fmt = cfg.format
    if fmt == "auto":
        fmt = "parquet" if cfg.path.endswith(".parquet") else "jsonl"
    try:
        with fsspec.open(cfg.path, "rb") as f:
            data = f.read()
    except FileNotFoundError as e:
        raise DatasetError(f"dataset {cfg.name!r}: file {cfg.path} does not exist") from e
    if fmt == "parquet":
        for i, row in enumerate(pq.read_table(io.BytesIO(data)).to_pylist()):
            yield f"{cfg.path}:row {i}", row, None
        return
    for lineno, raw in enumerate(data.splitlines(), start=1):
        where = f"{cfg.path}:{lineno}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:  # one bad line is one bad row, named, not a crash of the whole file
            yield where, None, f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
            continue
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            yield where, None, f"invalid JSON ({e.msg})"
            continue
        if not isinstance(row, dict):
            yield where, None, "line is not a JSON object"
            continue
        yield where, row, None


def _parse_row(cfg: DatasetConfig, row: dict[str, Any]) -> tuple[str, str]:
    for key in (cfg.question_field, cfg.answer_field):
        if key not in row or row[key] is None:
            raise ValueError(f"missing field {key!r} (fields present: {sorted(row)})")
    question = row[cfg.question_field]
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"field {cfg.question_field!r} is empty or not text")
    gold = extract_gold(row[cfg.answer_field], cfg.answer_kind)
    return question.strip(), gold


def load_problems(cfg: DatasetConfig) -> tuple[list[Problem], LoadReport]:
    """Load a dataset into problems (file order, exact duplicates dropped).

    Raises:
        DatasetError: a malformed row (bytes that are not UTF-8, invalid JSON, a missing/empty field, no
            extractable gold answer) when ``cfg.on_bad_row == 'error'``; the message names the file and line.
    """
    report = LoadReport(path=cfg.path)
    seen: set[str] = set()
    problems: list[Problem] = []
    for where, row, error in _iter_rows(cfg):
        report.rows += 1
        if error is None:
            try:
                question, gold = _parse_row(cfg, row)
            except ValueError as e:
                error = str(e)
        if error is not None:
            if cfg.on_bad_row == "error":
                raise DatasetError(f"dataset {cfg.name!r}, {where}: {error}")
            report.skipped[error.split(" (")[0]] += 1
            continue
        pid = prompt_id_for(question, gold)
        if pid in seen:
            report.duplicates += 1
            continue
        seen.add(pid)
        problems.append(Problem(prompt_id=pid, question=question, ground_truth=gold, source=where))
        if cfg.limit is not None and len(problems) >= cfg.limit:
            break
    report.loaded = len(problems)
    return problems, report
