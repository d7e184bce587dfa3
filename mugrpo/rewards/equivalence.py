"""Is a predicted answer equivalent to the gold answer? math-verify plus the fixes it needs on our inputs.

Both sides are answer strings as :mod:`mugrpo.data.answers` produces them (box contents; several answers encoded by
:func:`mugrpo.data.answers.join_answers`). Steps, each fixing a kind of fault rather than an input:

1. **Sets.** Several answers on a side are graded as one set ``a, b, c`` that must EQUAL the other side's set
   (math-verify compares finite sets element-wise): ``\\boxed{1} and \\boxed{-2}`` equals ``\\boxed{1, -2}`` and
   ``\\boxed{-2, 1}``; a partial answer (a subset) or a list of every intermediate value (a superset) scores 0.
2. **Normalization before math-verify** (:func:`normalize_answer`), for inputs it mis-parses upstream:
   ``\\mathrm{e}`` / ``\\mathrm{i}`` (math-verify 0.9 cuts the expression there: ``1 - \\frac{1}{\\mathrm{e}}``
   parses as the text ``1 - \\frac{1}{``); thousands separated by spaces, thin spaces, ``\\,`` or ``{,}``
   (it reads ``1 000`` as ``1*0``, so gold 0 matched it); currency signs and words (``1,000.99€`` failed to
   parse); ``°`` (only ``^\\circ`` is understood); decimal-mantissa scientific notation (``1.5e-20`` parsed as
   ``1.5 E - 20``).
3. **Thousands separator vs decimal comma.** A comma followed by exactly three digits (``1,000.99``) is a
   thousands separator, the convention of the English-language datasets (GSM8K, MATH, AIME); math-verify reads
   plain ones so itself (and keeps ``[100,200]`` an interval), we join the other separators (step 2). Any other
   comma between digits without a space (``2,74``, ``0,111``) is a DECIMAL comma when the response's answer is a
   single number of that form and the gold is a single non-integer number; otherwise it separates set elements
   (``1,5`` against a gold ``\\{1, 5\\}``). ``2{,}74`` (LaTeX's decimal comma) is decimal unless three digits
   follow (``1{,}000``). Gold answers must use a decimal point.
4. **Parse guard.** A side that math-verify cannot turn into a sympy object is compared as text only when the whole
   normalized answers are equal; math-verify's own fallback compares the text it managed to extract, which matched
   two different answers cut at the same place.
5. **Relative magnitude guard.** math-verify compares numbers with ``(a - b).evalf(chop=True) == 0`` and floats
   rounded to 6 decimals, so ``1/2004!`` equalled ``1/2006!`` and ``1e-7`` equalled ``2e-7``. When both sides are
   numbers (or sets of numbers), an accepted pair must also agree to a relative tolerance of 1e-5 (looser than
   math-verify's 6-decimal rounding of values near 1, e.g. ``0.333333`` for ``1/3``, so it only vetoes the tiny and
   huge magnitudes that chopping and rounding hide; a percentage may also match its value times 100, math-verify's
   ``28\\% = 28`` rule).

math-verify is called with its signal-based timeouts disabled (they need the main thread); the scorer's worker pool
enforces the time limit from outside (:mod:`mugrpo.rewards.pool`).
"""

from __future__ import annotations

import re
from functools import lru_cache

import sympy
from math_verify import parse, verify

from mugrpo.data.answers import split_answers

__all__ = ["answers_equivalent", "normalize_answer"]

RELATIVE_TOLERANCE = 1e-5
"""Largest relative difference between two numbers that math-verify found equal (step 5 of the module doc)."""
QUICK_REJECT_TOLERANCE = 1e-3
"""Two real numbers further apart than this (relatively) are unequal without asking math-verify (step 6)."""

# Upstream (math-verify 0.9 / latex2sympy2_extended): the parser stops at \mathrm{e}, leaving "1 - \frac{1}{".
_UPRIGHT_CONSTANT = re.compile(r"\\(?:mathrm|operatorname|mathit|textrm|rm)\s*\{\s*([ei])\s*\}")
# Upstream: "1 000" parses as the product 1*0. Plain commas are left to math-verify, which reads "1,000" as 1000
# but "[100,200]" and "(1,234)" as an interval: joining those digits here would break them.
_THOUSANDS_GROUPS = re.compile(
    r"(?<![\d.])([1-9]\d{0,2})((?:(?:\{,\}|\\[,;: ]|~|[ \u2009\u202f\u00a0])\d{3})+)(?![\d])"
)
_THOUSANDS_SEPARATOR = re.compile(r"\{,\}|\\[,;: ]|~|[ \u2009\u202f\u00a0]")
_LATEX_DECIMAL_COMMA = re.compile(r"(?<=\d)\{,\}(?=\d)")
# Upstream: "1,000.99€" does not parse; "\text{ euros}" does (its unit handling drops \text{} words).
_CURRENCY = re.compile(
    r"\\(?:euro|texteuro|pounds|yen|textdollar|\$)|[€£¥₹$]|\\text\s*\{\s*(?:USD|EUR|GBP)\s*\}"
    r"|\b(?:dollars?|euros?|cents?|USD|EUR|GBP)\b"
)
# Upstream: "m²" is not a unit it strips ("\text{m}^2" is) and "5²" is no power: a superscript digit after a unit
# becomes "\text{ m}^{2}", after anything else "^{2}".
_SUPERSCRIPT_UNIT = re.compile(r"(?<![A-Za-z\\])([A-Za-z]{1,3})\s*([²³¹])")
_SUPERSCRIPT = re.compile(r"([²³¹])")
_SUPERSCRIPT_DIGIT = {"¹": "1", "²": "2", "³": "3"}
# Upstream: only ^\circ is a degree sign; "30°" does not parse.
_DEGREE = re.compile(r"\s*(?:°|\\degree\b)")
# Upstream: "1.5e-20" parses as 1.5*E - 20 (e as Euler's number).
_SCIENTIFIC = re.compile(r"(?<![\w.])(\d+\.\d+)[eE]([+-]?\d+)\b")
_DECIMAL_COMMA_NUMBER = re.compile(r"[+-]?(\d+),(\d+)")


def _join_thousands(match: re.Match[str]) -> str:
    return match.group(1) + _THOUSANDS_SEPARATOR.sub("", match.group(2))


def normalize_answer(answer: str) -> str:
    """Rewrite one answer into a form math-verify 0.9 parses as intended (module docstring, step 2).

    Example: ``"1,000.99€"`` -> ``"1000.99"``, ``"1 - \\frac{1}{\\mathrm{e}^{2}}"`` -> ``"1 - \\frac{1}{e^{2}}"``.
    """
    text = _UPRIGHT_CONSTANT.sub(r"\1", answer)
    text = _SUPERSCRIPT_UNIT.sub(lambda m: f"\\text{{ {m.group(1)}}}^{{{_SUPERSCRIPT_DIGIT[m.group(2)]}}}", text)
    text = _SUPERSCRIPT.sub(lambda m: f"^{{{_SUPERSCRIPT_DIGIT[m.group(1)]}}}", text)
    text = _CURRENCY.sub(" ", text)
    text = _DEGREE.sub(r"^\\circ", text)
    text = _SCIENTIFIC.sub(r"\1 \\times 10^{\2}", text)
    text = _THOUSANDS_GROUPS.sub(_join_thousands, text)
    text = _LATEX_DECIMAL_COMMA.sub(".", text)
    return text.strip()


@lru_cache(maxsize=4096)
def _parse(answer: str) -> tuple:
    """math-verify's parse of one answer as the content of a box (both sides go through its LaTeX path)."""
    return tuple(parse(f"\\boxed{{{answer}}}", parsing_timeout=None))


def _expression(parsed: tuple) -> sympy.Basic | None:
    return next((p for p in parsed if isinstance(p, (sympy.Basic, sympy.MatrixBase))), None)


def _is_non_integer_number(answer: str) -> bool:
    expr = _expression(_parse(answer))
    return isinstance(expr, sympy.Number) and not expr.is_integer


def _decimal_comma(answer: str) -> str | None:
    """``"2,74"`` -> ``"2.74"`` when the comma cannot be a thousands separator (step 3); else None."""
    match = _DECIMAL_COMMA_NUMBER.fullmatch(answer.strip())
    if match is None or (len(match.group(2)) == 3 and match.group(1) != "0"):
        return None
    return answer.strip().replace(",", ".")


def _numbers(expr: sympy.Basic, percent: bool) -> list[list[sympy.Expr]] | None:
    """Candidate values of a number or a finite set / tuple of numbers; None for anything else."""
    items = list(expr.args) if isinstance(expr, (sympy.FiniteSet, sympy.Tuple)) else [expr]
    if not all(isinstance(i, sympy.Expr) and i.is_number and i.is_real for i in items):
        return None
    return [[i, i * 100] if percent else [i] for i in items]


def _close(a: sympy.Expr, b: sympy.Expr) -> bool:
    scale = sympy.N(sympy.Max(abs(a), abs(b)), 30)
    return bool(sympy.N(abs(a - b), 30) <= RELATIVE_TOLERANCE * scale)


def _magnitudes_agree(gold_expr, pred_expr, gold_text: str, pred_text: str) -> bool:
    """Step 5: numbers that math-verify accepted also agree relatively (True when not both numeric)."""
    try:
        gold_values = _numbers(gold_expr, "%" in gold_text)
        pred_values = _numbers(pred_expr, "%" in pred_text)
        if gold_values is None or pred_values is None:
            return True
        return all(any(_close(g, p) for g in gs for ps in pred_values for p in ps) for gs in gold_values) and all(
            any(_close(g, p) for gs in gold_values for g in gs for p in ps) for ps in pred_values
        )
    except (TypeError, ValueError, ArithmeticError):  # not evaluable numerically: keep math-verify's verdict
        return True


def _quick_verdict(gold_expr, pred_expr, gold_text: str, pred_text: str) -> bool | None:
    """Step 6: a verdict without math-verify's symbolic simplification, or None to ask it.

    - The same expression up to the order of commutative terms (canonical ``srepr``): equal.
    - Two real numbers that differ by more than :data:`QUICK_REJECT_TOLERANCE` relatively (evaluated to 30 digits):
      not equal, unless either side has a percent or degree sign (math-verify's ``28\\% = 0.28`` and degree rules).
    """
    try:
        if sympy.srepr(gold_expr) == sympy.srepr(pred_expr):
            return True
        if any(mark in text for text in (gold_text, pred_text) for mark in ("%", "circ")):
            return None
        if not all(isinstance(e, sympy.Expr) and e.is_number for e in (gold_expr, pred_expr)):
            return None
        a, b = sympy.N(gold_expr, 30), sympy.N(pred_expr, 30)
        if not (isinstance(a, sympy.Float) and isinstance(b, sympy.Float)):
            return None
        scale = max(abs(a), abs(b))
        return None if abs(a - b) <= QUICK_REJECT_TOLERANCE * scale else False
    except (TypeError, ValueError, ArithmeticError, RecursionError):
        return None


def _equivalent(gold: str, pred: str) -> bool:
    gold_parsed, pred_parsed = _parse(gold), _parse(pred)
    gold_expr, pred_expr = _expression(gold_parsed), _expression(pred_parsed)
    if gold_expr is None or pred_expr is None:  # step 4: text only, and only whole answers
        return " ".join(gold.split()) == " ".join(pred.split()) and bool(gold.strip())
    quick = _quick_verdict(gold_expr, pred_expr, gold, pred)
    if quick is not None:
        return quick
    if not verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None):
        return False
    return _magnitudes_agree(gold_expr, pred_expr, gold, pred)


def answers_equivalent(gold: str, answer: str) -> bool:
    """Whether ``answer`` (a response's extracted answer) is mathematically equivalent to ``gold``.

    Args:
        gold: gold answer string (:func:`mugrpo.data.answers.extract_gold`); several boxes form a set.
        answer: predicted answer string (:func:`mugrpo.data.answers.extract_answer`); several boxes form a set.

    Returns:
        True when equivalent under math-verify's ``verify(gold, pred)`` (gold first: the relation is asymmetric,
        e.g. for ``x = 2`` against ``2``) after the normalizations and guards of the module docstring.
    """
    gold_items = [normalize_answer(g) for g in split_answers(gold)]
    pred_items = [normalize_answer(p) for p in split_answers(answer)]
    if not all(gold_items) or not all(pred_items):
        return False
    gold_joined, pred_joined = ", ".join(gold_items), ", ".join(pred_items)
    if len(pred_items) == 1 and len(gold_items) == 1:
        if "," not in pred_joined.replace("{,}", ""):  # a single number answers: so a "1,22" gold is 1.22
            gold_joined = _decimal_comma(gold_joined) or gold_joined
        if _is_non_integer_number(gold_joined):
            pred_joined = _decimal_comma(pred_joined) or pred_joined
    return _equivalent(gold_joined, pred_joined)
