"""AGPO's vote key (``extract_answer_loose``): each place where it differs from the released AGPO code is a choice
documented in docs/algorithms/agpo.md ("The vote key"); each test pins one of them.

The rule behind all of them: when the reward finds an answer (``extract_answer``), the vote key is that answer, so
responses vote by what the reward grades; only a response without one falls back to the released code's chain (the
last number with commas removed, else the whitespace-collapsed text), lower-cased.
"""

from __future__ import annotations

import math

import pytest

from mugrpo.algorithms.agpo.stats import vote_entropy
from mugrpo.data.answers import extract_answer, extract_answer_loose


@pytest.mark.parametrize(
    ("response", "key"),
    [
        # 1. Thousands separators are stripped on the #### line (as for GSM8K's gold) and in the last-number
        #    fallback; the released code strips them only in the fallback ("1,234 dollars" there).
        ("#### 1,234 dollars", "1234 dollars"),
        ("She has 1,234 in total.", "1234"),
        # ... while a box keeps its content as written, as in the released code.
        (r"so \boxed{1,234}", "1,234"),
        # 2. The #### answer is the rest of its line; the released code keys on all the text after the last ####.
        ("#### 12\nQuestion: how many apples are left? 7", "12"),
        # 3. An empty box is an empty answer; the released code skips it (the last number, "7", here).
        (r"earlier 5 \boxed{} then 7", ""),
        (r"The answer is \boxed{}", ""),
        # 4. An unclosed last box (a response cut at the token limit) has no answer, so the key falls back to the
        #    last number; the released code keys on the earlier complete box ("3").
        (r"maybe \boxed{3} but then \boxed{\frac{1}{", "1"),
        # 5. \fbox is a box; the released code reads \boxed only (the last number, "4", here).
        (r"\fbox{12} is 3 times 4", "12"),
        # 6. A run of final boxes is one key (the reward grades it as one set); the released code keeps the last.
        (r"x = \boxed{1} and x = \boxed{-2}.", r"\boxed{1}, \boxed{-2}"),
        # 7. Nested braces are kept; the released code's regex skips such a box (the last number, "2", here).
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    ],
)
def test_each_documented_choice(response: str, key: str) -> None:
    assert extract_answer_loose(response) == key


@pytest.mark.parametrize(
    "response",
    [
        "#### 1,234 dollars",
        "#### 12\nQuestion: how many apples are left? 7",
        r"The answer is \boxed{}",
        r"\fbox{12} is 3 times 4",
        r"x = \boxed{1} and x = \boxed{-2}.",
        r"\boxed{\frac{1}{2}}",
        r"so \boxed{5}. Then 5 + 1 = \boxed{6}",
    ],
)
def test_the_key_is_the_graded_answer_when_there_is_one(response: str) -> None:
    graded = extract_answer(response)
    assert graded is not None
    assert extract_answer_loose(response) == graded.strip().lower()


@pytest.mark.parametrize(
    ("response", "key"),
    [
        (r"the value is \boxed{ 72 }", "72"),  # one flat box: the same key as the released code
        ("so the total is\n#### 72", "72"),
        ("no marker, numbers 3 and -4.5", "-4.5"),
        ("  I do NOT\n  know ", "i do not know"),
    ],
)
def test_where_the_released_code_agrees(response: str, key: str) -> None:
    assert extract_answer_loose(response) == key


def test_vote_entropy_counts_a_run_of_boxes_and_its_last_box_as_different_answers() -> None:
    texts = [r"\boxed{1} and \boxed{-2}", r"\boxed{-2}", r"#### -2", "the answer: -2"]
    # keys: "\boxed{1}, \boxed{-2}" once and "-2" three times
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert vote_entropy(texts) == pytest.approx(expected)
