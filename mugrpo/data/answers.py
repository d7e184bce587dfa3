"""Answer extraction for gold solutions and model responses.

One module, used twice:

* the dataset loader turns a dataset's answer field into a gold string (:func:`extract_gold`);
* the rewards turn a sampled response into a predicted answer (:func:`extract_answer`), and AGPO's vote
  entropy groups responses by a looser key (:func:`extract_answer_loose`).

Conventions
-----------
* ``\\boxed{...}`` (and ``\\fbox{...}``) content is found by brace matching, so nested groups such as
  ``\\boxed{\\frac{1}{2}}`` are kept whole. Escaped braces ``\\{`` / ``\\}`` are literal characters and do not
  open or close a group.
* "Last" means the box whose command starts last in the text: the final answer of a solution or response.
* Several final answers ("find all solutions"): a response's answer is its LAST CONTIGUOUS RUN of boxes, boxes
  separated only by connective text (whitespace, punctuation, math delimiters, LaTeX spacing, "and"/"or", a
  variable assignment such as ``x =``); a box followed by reasoning starts a new run, so boxed intermediate
  values are not graded. A gold solution's answer is ALL its boxes (a reference solution boxes only answers).
  Several answers are encoded in one string as ``\\boxed{a}, \\boxed{b}`` (:func:`join_answers`), read back
  by :func:`split_answers`; the reward grades them as a set that must EQUAL the gold set (a superset scores 0).
* GSM8K answers end in ``#### N``; thousands separators are removed ("1,000" -> "1000"); a comma that is not a
  thousands separator (a tuple "(1, 2)") is kept.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Callable
from typing import Literal

__all__ = [
    "GOLD_KINDS",
    "GoldKind",
    "extract_all_boxed",
    "extract_answer",
    "extract_answer_loose",
    "extract_boxed",
    "extract_final_boxes",
    "extract_gold",
    "extract_gsm8k_gold",
    "join_answers",
    "split_answers",
]

GoldKind = Literal["auto", "gsm8k", "boxed", "plain"]

# A box command followed by its opening brace (LaTeX allows spaces between them).
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# The GSM8K final-answer marker; the answer is the rest of that line.
_HASH_ANSWER = re.compile(r"####[ \t]*([^\n]*)")
# A signed decimal or integer, optionally a fraction a/b (AGPO's vote-key number pattern, read after commas go).
_NUMBER = re.compile(r"[-+]?\d*\.?\d+(?:/[1-9]\d*)?")
_WHITESPACE = re.compile(r"\s+")
# A comma between a digit and exactly three digits: a thousands separator.
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _preview(text: str, limit: int = 80) -> str:
    """Short repr of ``text`` for error messages (its tail, where the final answer lives)."""
    return repr(text if len(text) <= limit else "..." + text[-limit:])


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    """Last non-overlapping match of ``pattern`` in ``text`` (one scan, O(1) memory)."""
    tail = deque(pattern.finditer(text), maxlen=1)
    return tail[0] if tail else None


def _matching_brace_content(text: str, open_index: int) -> str | None:
    """Content between ``text[open_index] == "{"`` and its matching ``}``; None if never closed.

    A backslash escapes the next character, so ``\\{``, ``\\}`` and ``\\\\`` never change the depth.
    """
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``, braces matched.

    Args:
        text: a solution or model response (LaTeX mixed with prose).

    Returns:
        The stripped content of the last box, e.g. ``"\\frac{1}{2}"`` for ``"... \\boxed{\\frac{1}{2}}"``.
        None when there is no box, or when the last box is never closed (a response truncated at the
        token limit): an earlier, complete box is then NOT used, because it is not the final answer.
        An empty box ``\\boxed{}`` returns ``""``.
    """
    last = _last_match(_BOX_OPEN, text)
    if last is None:
        return None
    content = _matching_brace_content(text, last.end() - 1)
    return None if content is None else content.strip()


# Text allowed between two boxes of one run of final answers: whitespace, punctuation, math delimiters, LaTeX
# spacing, the words "and"/"or" (plain or in \text{}), and a variable assignment ("x =", "x_1 =", "y=").
_CONNECTIVE = re.compile(
    r"""(?:\s+|[,;.:!]|\$|\\[()\[\]]|\\(?:quad|qquad|[,;:!\ ]|text\s*\{\s*(?:and|or|,)?\s*\})|~
       |\b(?:and|or)\b|[a-zA-Z](?:_\{?\w+\}?)?\s*=)*""",
    re.VERBOSE,
)


def _all_boxes(text: str) -> list[tuple[int, int, str | None]]:
    """Every box as (start, end, content); content None (and end = len(text)) for a box never closed."""
    boxes = []
    position = 0
    while (match := _BOX_OPEN.search(text, position)) is not None:
        content = _matching_brace_content(text, match.end() - 1)
        if content is None:
            boxes.append((match.start(), len(text), None))
            break
        end = match.end() + len(content) + 1
        boxes.append((match.start(), end, content.strip()))
        position = end
    return boxes


def extract_all_boxed(text: str) -> list[str] | None:
    """Contents of every box of ``text`` in order (nested boxes inside a box stay part of its content).

    Returns:
        The list (possibly empty when there is no box), or None when a box is never closed.
    """
    boxes = _all_boxes(text)
    if any(content is None for _, _, content in boxes):
        return None
    return [content for _, _, content in boxes]  # type: ignore[misc]


def extract_final_boxes(text: str) -> list[str] | None:
    """The last contiguous run of boxes of a response: its final answer(s).

    Two boxes belong to one run when only connective text separates them (module docstring), e.g.
    ``"... \\boxed{1} and \\boxed{-2}."`` gives ``["1", "-2"]`` while ``"so \\boxed{5}. Then 5 + 1 = \\boxed{6}"``
    gives ``["6"]``.

    Returns:
        The run's contents in order; None when there is no box or the last box is never closed (a response cut
        at the token limit: an earlier complete box is then not its final answer).
    """
    boxes = _all_boxes(text)
    if not boxes or boxes[-1][2] is None:
        return None
    run = [boxes[-1]]
    for box in reversed(boxes[:-1]):
        gap = text[box[1] : run[0][0]]
        if _CONNECTIVE.fullmatch(gap) is None:
            break
        run.insert(0, box)
    return [content for _, _, content in run]  # type: ignore[misc]


def join_answers(answers: list[str]) -> str:
    """One string for one or several answers: ``"a"`` for one, ``"\\boxed{a}, \\boxed{b}"`` for several.

    Exact repeats are dropped (MATH-500 solutions box the same answer twice in 7 of 500 rows).

    Raises:
        ValueError: an empty list.
    """
    if not answers:
        raise ValueError("join_answers needs at least one answer")
    answers = list(dict.fromkeys(answers))
    if len(answers) == 1:
        return answers[0]
    return ", ".join(f"\\boxed{{{a}}}" for a in answers)


def split_answers(answer: str) -> list[str]:
    """Inverse of :func:`join_answers`: the contents of the boxes of ``answer`` if it has any, else ``[answer]``."""
    if _BOX_OPEN.search(answer) is not None:
        boxes = extract_all_boxed(answer)
        if boxes:
            return boxes
    return [answer]


def _strip_thousands_commas(value: str) -> str:
    """Remove thousands separators ("1,234,567" -> "1234567"); other commas (tuples, intervals) stay."""
    return _THOUSANDS_COMMA.sub("", value)


def _hash_answer(text: str) -> str | None:
    """Rest of the line after the last ``####``, thousands separators removed; None if there is no ``####``."""
    last = _last_match(_HASH_ANSWER, text)
    if last is None:
        return None
    return _strip_thousands_commas(last.group(1)).strip()


def extract_gsm8k_gold(answer: str, *, source: str | None = None) -> str:
    """Gold answer of a GSM8K ``answer`` field: the text after its (last) ``#### ``, thousands separators removed.

    Args:
        answer: GSM8K's reference solution, reasoning then ``#### N``.
        source: where the answer came from (e.g. ``"gsm8k/train.jsonl row 17"``), quoted in errors.

    Returns:
        The final answer, e.g. ``"1000"`` for ``"... #### 1,000"``.

    Raises:
        ValueError: no ``####`` marker, or nothing after it.
    """
    where = f" ({source})" if source else ""
    gold = _hash_answer(answer)
    if gold is None:
        raise ValueError(f"GSM8K answer{where} has no '#### <answer>' line: {_preview(answer)}")
    if not gold:
        raise ValueError(f"GSM8K answer{where} has an empty answer after '####': {_preview(answer)}")
    return gold


def _gold_from_gsm8k(raw: object, source: str | None) -> str:
    return extract_gsm8k_gold(_require_str(raw, "gsm8k", source), source=source)


def _gold_from_boxed(raw: object, source: str | None) -> str:
    """All boxes of a solution: one gold answer, or a set of answers (``\\boxed{a}, \\boxed{b}``)."""
    where = f" ({source})" if source else ""
    text = _require_str(raw, "boxed", source)
    golds = extract_all_boxed(text)
    if golds is None:
        raise ValueError(f"solution{where} has a \\boxed{{ that is never closed: {_preview(text)}")
    if not golds:
        raise ValueError(f"solution{where} has no \\boxed{{...}} answer: {_preview(text)}")
    if not all(golds):
        raise ValueError(f"solution{where} has an empty \\boxed{{}} answer: {_preview(text)}")
    return join_answers(golds)


def _gold_from_plain(raw: object, source: str | None) -> str:
    """The value itself as a string; integral floats lose their ``.0`` (AMC23 stores 27.0 for 27)."""
    where = f" ({source})" if source else ""
    if isinstance(raw, bool) or raw is None:
        raise ValueError(f"gold answer{where} must be a str, int or float, got {raw!r}")
    if isinstance(raw, float):
        if not math.isfinite(raw):
            raise ValueError(f"gold answer{where} is not a finite number: {raw!r}")
        gold = str(int(raw)) if raw.is_integer() else repr(raw)
    elif isinstance(raw, (int, str)):
        gold = str(raw).strip()
    else:
        raise ValueError(f"gold answer{where} must be a str, int or float, got {type(raw).__name__}")
    if not gold:
        raise ValueError(f"gold answer{where} is empty")
    return gold


def _gold_auto(raw: object, source: str | None) -> str:
    """``#### N`` if present, else the last box, else the value itself."""
    if isinstance(raw, str):
        if _hash_answer(raw) is not None:
            return _gold_from_gsm8k(raw, source)
        if _BOX_OPEN.search(raw) is not None:  # an unclosed box is an error, never plain text
            return _gold_from_boxed(raw, source)
    return _gold_from_plain(raw, source)


def _require_str(raw: object, kind: str, source: str | None) -> str:
    if not isinstance(raw, str):
        where = f" ({source})" if source else ""
        raise ValueError(f"gold kind {kind!r} needs a str answer{where}, got {type(raw).__name__}: {raw!r}")
    return raw


GOLD_KINDS: dict[str, Callable[[object, str | None], str]] = {
    "auto": _gold_auto,
    "gsm8k": _gold_from_gsm8k,
    "boxed": _gold_from_boxed,
    "plain": _gold_from_plain,
}
"""Gold extractors by dataset-config name (see :func:`extract_gold`)."""


def extract_gold(raw: object, kind: GoldKind = "auto", *, source: str | None = None) -> str:
    """Gold answer string of one dataset row's answer field.

    Args:
        raw: the field's value (str, int or float).
        kind: how to read it:
            ``"gsm8k"``: the text after ``#### `` (thousands separators removed);
            ``"boxed"``: every ``\\boxed{}`` of a MATH-style solution (several boxes: a set of answers, encoded
            by :func:`join_answers`); a box never closed is an error;
            ``"plain"``: the value itself; floats with an integral value render without ``.0``
            (``27.0 -> "27"``), others keep their shortest repr (``2.5 -> "2.5"``);
            ``"auto"``: ``####`` if present, else a box, else plain.
        source: where the row came from (file and row), quoted in errors.

    Returns:
        A non-empty gold answer string.

    Raises:
        ValueError: unknown ``kind`` (the message lists the known ones), wrong value type, or nothing
            (or an empty string) could be extracted.
    """
    try:
        extractor = GOLD_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown gold kind {kind!r}; known kinds: {sorted(GOLD_KINDS)}") from None
    return extractor(raw, source)


def extract_answer(response_text: str) -> str | None:
    """Predicted final answer of a model response, strict: the last run of boxes, else ``#### N``.

    Strict on purpose: a response without an explicit final-answer marker gets no answer (and so no
    correctness reward) instead of having its last number guessed. The ``format`` reward, which only
    accepts a box, depends on this being the answer the correctness reward graded.

    Strict format also means a bold ``**73**`` or a "The answer is 73" sentence is no answer: the policy is
    trained to state its answer in the one format that the reward, the evals and the format bonus all read.

    Returns:
        The answer string (may be ``""`` for an empty box; several final boxes are joined by
        :func:`join_answers`), or None when there is no complete box and no ``####`` line.
    """
    boxes = extract_final_boxes(response_text)
    if boxes is not None:
        return join_answers(boxes)
    return _hash_answer(response_text)


def extract_answer_loose(response_text: str) -> str:
    """Vote key of a response for AGPO's vote entropy (arXiv 2605.20722, released code's order).

    Order: the strict answer (:func:`extract_answer`: the last run of boxes, else the text after the last
    ``####``), else the last number (commas removed), else the whole response with whitespace collapsed. The key is
    lower-cased and stripped, so that two responses with the same final answer share a key. Where a response has a
    graded answer the key is that answer, which differs from AGPO's released code on nested braces, ``\\fbox``,
    runs of final boxes, empty and unclosed boxes, and ``####`` lines (each case and its reason:
    docs/algorithms/agpo.md, "The vote key").

    Returns:
        Always a string (possibly ``""`` for an empty response).
    """
    strict = extract_answer(response_text)
    if strict is not None:
        return strict.strip().lower()
    numbers = _NUMBER.findall(response_text.replace(",", ""))
    if numbers:
        return numbers[-1].lower()
    return _WHITESPACE.sub(" ", response_text).strip().lower()
