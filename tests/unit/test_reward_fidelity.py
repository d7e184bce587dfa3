"""Fidelity of the correctness reward: the seven fault kinds in both directions (the right answer
scores 1, a near miss scores 0), and a table of our own cases across answer formats.

Every case goes through the product path: the gold through :func:`mugrpo.data.answers.extract_gold` (as the dataset
loader reads it), the response through :func:`mugrpo.data.answers.extract_answer`, then the ``math_correctness``
component. The worker pool (:mod:`mugrpo.rewards.pool`) is exercised by tests/unit/test_rewards.py.
"""

from __future__ import annotations

import json
import logging

import pytest

from mugrpo.data.answers import extract_answer, extract_final_boxes, extract_gold
from mugrpo.data.datasets import DatasetConfig, DatasetError, load_problems
from mugrpo.rewards import REWARD_FUNCTIONS, RewardInput

logging.getLogger("math_verify").setLevel(logging.ERROR)


def score(gold_raw: object, response: str) -> float:
    """The reward path: gold as loaded, answer as extracted, then math_correctness."""
    gold = extract_gold(gold_raw)
    return REWARD_FUNCTIONS["math_correctness"](RewardInput(response, gold), extract_answer(response))


# --- the seven kinds, both directions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        ("1,2,3", r"The solutions are \boxed{1} and \boxed{2} and \boxed{3}.", 1.0),
        ("1,2,3", r"$x=\boxed{3}$, $x = \boxed{1}$ or $x=\boxed{2}$", 1.0),  # order does not matter
        ("1,2,3", r"The solutions are \boxed{1} and \boxed{2}.", 0.0),  # a subset
        ("1,2,3", r"\boxed{1}, \boxed{2}, \boxed{3}, \boxed{4}", 0.0),  # a superset
        ("1,2,3", r"So \boxed{1}. Next we check 2: \boxed{2}. Finally \boxed{3}", 0.0),  # boxed steps: only the last
    ],
)
def test_kind1_several_boxes_in_the_response_are_graded_as_a_set(gold, response, expected):
    assert score(gold, response) == expected


def test_kind1_boxed_intermediate_values_do_not_count_as_final_answers():
    response = r"First $a = \boxed{4}$. Then the area is $4 \cdot 3 = \boxed{12}$, so the answer is \boxed{12}."
    assert extract_final_boxes(response) == ["12"]
    assert score("12", response) == 1.0
    assert score("4", response) == 0.0


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (r"\boxed{1, -2}", 1.0),
        (r"\boxed{-2} and \boxed{1}", 1.0),
        (r"\boxed{\{1, -2\}}", 1.0),
        (r"\boxed{-2}", 0.0),  # the partial answer was full credit before
        (r"\boxed{1}", 0.0),
        (r"\boxed{1, 2}", 0.0),
    ],
)
def test_kind2_multi_box_gold_is_a_set(response, expected):
    assert extract_gold(r"The roots are \boxed{1} and \boxed{-2}.") == r"\boxed{1}, \boxed{-2}"
    assert score(r"The roots are \boxed{1} and \boxed{-2}.", response) == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (r"\boxed{1,000.99€}", 1.0),
        (r"\boxed{1000.99 \text{ euros}}", 1.0),
        (r"\boxed{\$1,000.99}", 1.0),
        (r"\boxed{1,000.99 \text{ dollars}}", 1.0),
        (r"\boxed{1,000.98€}", 0.0),
        (r"\boxed{1,009.99 \text{ euros}}", 0.0),
    ],
)
def test_kind3_units_and_currency_inside_the_box(response, expected):
    assert score("1000.99", response) == expected


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        ("1000", r"\boxed{1 000}", 1.0),
        ("1000", r"\boxed{1\,000}", 1.0),
        ("1000", r"\boxed{1{,}000}", 1.0),
        ("1234567", r"\boxed{1 234 567}", 1.0),
        ("0", r"\boxed{1 000}", 0.0),  # was a false positive (1 000 read as 1*0)
        ("1000", r"\boxed{1 001}", 0.0),
        ("2.74", r"\boxed{2,74}", 1.0),  # decimal comma
        ("2.74", r"\boxed{2{,}74}", 1.0),
        ("0.111", r"\boxed{0,111}", 1.0),  # a leading 0 is never a thousands group
        ("2.74", r"\boxed{2,75}", 0.0),
        ("274", r"\boxed{2,74}", 0.0),  # an integer gold never reads a decimal comma
        ("2740", r"\boxed{2,740}", 1.0),  # a comma before three digits is a thousands separator
        ("2.74", r"\boxed{2,740}", 0.0),
        (r"\{1, 5\}", r"\boxed{1,5}", 1.0),  # against a set gold, the comma separates elements
        ("1.5", r"\boxed{1,5}", 1.0),
    ],
)
def test_kind4_number_formats(gold, response, expected):
    assert score(gold, response) == expected


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        (r"1 - \frac{1}{\mathrm{e}}", r"\boxed{1 - \frac{1}{e}}", 1.0),
        (r"1 - \frac{1}{\mathrm{e}}", r"\boxed{1 - \frac{1}{\mathrm{e}}}", 1.0),
        (r"1 - \frac{1}{\mathrm{e}}", r"\boxed{1 - \frac{1}{\mathrm{e}^{2}}}", 0.0),  # was 1.0
        (r"1 - \frac{1}{\mathrm{e}}", r"\boxed{1 - \frac{1}{e^2}}", 0.0),
        (r"2\mathrm{i}", r"\boxed{2i}", 1.0),
        ("2", r"\boxed{2\mathrm{i}}", 0.0),
    ],
)
def test_kind5_upright_e_and_i(gold, response, expected):
    assert score(gold, response) == expected


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        (r"\frac{1}{2004!}", r"\boxed{\frac{1}{2004!}}", 1.0),
        (r"\frac{1}{2004!}", r"\boxed{\frac{1}{2006!}}", 0.0),  # was 1.0
        (r"10^{-20}", r"\boxed{10^{-21}}", 0.0),
        (r"10^{-20}", r"\boxed{0.1 \cdot 10^{-19}}", 1.0),
        ("0.0000001", r"\boxed{0.0000002}", 0.0),
        ("0.0000001", r"\boxed{10^{-7}}", 1.0),
        (r"\frac{1}{3}", r"\boxed{0.333333}", 1.0),  # math-verify's 6-decimal rounding is kept
    ],
)
def test_kind6_tiny_magnitudes(gold, response, expected):
    assert score(gold, response) == expected


def test_kind7_unclosed_gold_box_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [{"problem": "p1", "solution": r"so \boxed{3}"}, {"problem": "p2", "solution": r"so \boxed{\frac{1}{2}"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {"name": "m", "path": str(path), "question_field": "problem", "answer_field": "solution"}
    with pytest.raises(DatasetError, match=r"train\.jsonl:2: .*never closed"):
        load_problems(DatasetConfig(**config))
    problems, report = load_problems(DatasetConfig(**config, on_bad_row="skip"))
    assert [p.ground_truth for p in problems] == ["3"] and sum(report.skipped.values()) == 1
    for kind in ("auto", "boxed"):
        with pytest.raises(ValueError, match="never closed"):
            extract_gold(r"\boxed{1} and \boxed{2", kind)


@pytest.mark.parametrize(
    "response",
    [
        r"\boxed{5 \text{ or } 6}",
        r"\boxed{5, 6}",
        r"\boxed{5} or \boxed{6}",
        r"\boxed{\{5, 6\}}",
        r"\boxed{x}",
        r"\boxed{4 < x < 6}",
        r"\boxed{[4, 6]}",
        r"\boxed{5 \pm 1}",
        r"\boxed{x = 5 \text{ or } x = 6}",
        " ".join(rf"\boxed{{{i}}}," for i in range(1, 20)),
    ],
)
def test_hedged_or_listed_answers_cannot_game_the_reward(response):
    assert score("5", response) == 0.0


def test_strict_format_policy_bold_or_prose_answers_score_zero():
    for response in ("The answer is **73**.", "The answer is 73.", r"$73$"):
        assert extract_answer(response) is None
        assert score("73", response) == 0.0
    assert score("73", "#### 73") == 1.0
    assert score("73", r"\boxed{73}") == 1.0


def test_a_response_cut_inside_its_last_box_has_no_answer():
    assert score("5", r"We get \boxed{5}. Checking: \boxed{5") == 0.0


# --- a table of our own cases across formats ---------------------------------------------------------------------

B = r"\boxed{%s}"
TABLE = [
    # plain integers, as AIME / AMC / GSM8K gold gives them (AMC23 stores floats: 27.0)
    ("27", B % "27", 1),
    (27.0, B % "27", 1),
    (27, B % "27.0", 1),
    ("027", B % "27", 1),
    ("204", B % "240", 0),
    ("-3", B % "-3", 1),
    ("-3", B % "3", 0),
    ("#### 1,250", B % "1250", 1),
    ("#### 1250", "The total is\n#### 1,250", 1),
    ("#### 18", B % "18.00", 1),
    ("999", B % "999.5", 0),
    # fractions
    (r"\frac{1}{2}", B % "0.5", 1),
    (r"\frac{1}{2}", B % r"\dfrac{1}{2}", 1),
    (r"\frac{1}{2}", B % r"\tfrac12", 1),
    (r"\frac{1}{2}", B % "1/2", 1),
    (r"\frac{1}{2}", B % r"\frac{2}{4}", 1),
    (r"\frac{1}{2}", B % r"\frac{1}{3}", 0),
    (r"-\frac{3}{4}", B % r"\frac{-3}{4}", 1),
    (r"-\frac{3}{4}", B % r"\frac{3}{4}", 0),
    (r"\dfrac{14}{3}", B % r"4\frac{2}{3}", 1),  # a mixed number
    (r"\frac{7}{3}", B % "2.333333", 1),
    (r"\frac{7}{3}", B % "2.33", 0),
    # decimals
    ("0.25", B % ".25", 1),
    ("0.25", B % "0.250", 1),
    ("0.25", B % "0.26", 0),
    ("3.14", B % r"\pi", 0),
    ("1.5", B % r"\frac{3}{2}", 1),
    # thousands separators
    ("7425000", B % "7,425,000", 1),
    ("7425000", B % "7 425 000", 1),
    ("7425000", B % "7,425,001", 0),
    ("1000000", B % r"10^6", 1),
    ("1000000", B % r"10^{7}", 0),
    # percent
    (r"28\%", B % r"28\%", 1),
    (r"28\%", B % "28", 1),
    (r"28\%", B % "0.28", 1),
    (r"28\%", B % r"29\%", 0),
    ("0.28", B % "28", 0),
    # units and text
    ("5", B % r"5\text{ cm}", 1),
    ("5", B % r"5 \mathrm{cm}", 1),
    ("5", B % r"6\text{ cm}", 0),
    ("12", B % r"12 \text{ apples}", 1),
    ("16386.17", B % r"\$16386.17", 1),
    ("16386.17", B % r"\$16386.71", 0),
    (r"\text{Evelyn}", B % r"\text{Evelyn}", 1),
    (r"\text{Evelyn}", B % r"\text{Carla}", 0),
    (r"\text{(C)}", B % r"\text{(C)}", 1),
    (r"\text{(C)}", B % r"\text{(D)}", 0),
    # degrees
    (r"90^\circ", B % "90", 1),
    (r"90^\circ", B % "90°", 1),
    (r"90^\circ", B % r"90^{\circ}", 1),
    (r"90^\circ", B % r"80^\circ", 0),
    # intervals
    ("[0,1)", B % "[0,1)", 1),
    ("[100, 200]", B % "[100,200]", 1),  # a comma before three digits inside brackets is no thousands separator
    ("[100,200]", B % "[100, 201]", 0),
    ("(1, 234)", B % "(1,234)", 1),
    ("[0,1)", B % "[0,1]", 0),
    ("(0,9)", B % "[0,9)", 0),
    (r"(-\infty, 2]", B % r"(-\infty,2]", 1),
    (r"(-\infty, 2]", B % r"(-\infty,2)", 0),
    (r"[-2, 7]", B % r"x \in [-2,7]", 1),
    (r"(1, 3) \cup (4, \infty)", B % r"(1,3)\cup(4,\infty)", 1),
    (r"(1, 3) \cup (4, \infty)", B % r"(1,3)\cup[4,\infty)", 0),
    # sets
    (r"\{1, 2, 3\}", B % r"\{3, 2, 1\}", 1),
    (r"\{100, 200\}", B % r"\{200,100\}", 1),
    (r"\{1, 2, 3\}", B % r"\{1, 2\}", 0),
    (r"\{1, 2\}", B % r"\{1, 2, 3\}", 0),
    ("1, 2, 3", r"\boxed{3}, \boxed{1}, \boxed{2}", 1),
    (r"\boxed{2} \text{ and } \boxed{5}", r"\boxed{2, 5}", 1),
    (r"\boxed{2} \text{ and } \boxed{5}", r"\boxed{5}", 0),
    # tuples and points
    (r"(3, \frac{\pi}{2})", B % r"\left( 3, \frac{\pi}{2} \right)", 1),
    (r"(3, \frac{\pi}{2})", B % r"\left( 3, \frac{\pi}{3} \right)", 0),
    (r"\left(\frac{4}{5}, \frac{1}{5}\right)", B % r"\left( \frac{4}{5}, \frac{1}{5} \right)", 1),
    (r"\left(\frac{4}{5}, \frac{1}{5}\right)", B % r"\left( \frac{1}{5}, \frac{4}{5} \right)", 0),
    ("(1, 2, 3)", B % "(1,2,3)", 1),
    ("(1, 2, 3)", B % "(1,3,2)", 0),
    # equations and assignments
    ("x = 2", B % "2", 1),
    ("2", B % "x = 2", 1),
    ("2", B % "x = 3", 0),
    ("y = 2x + 1", B % "y=2x+1", 1),
    ("y = 2x + 1", B % "y = 1 + 2x", 1),
    ("y = 2x + 1", B % "y=2x+3", 0),
    (r"k = \frac{1}{3}", B % r"\frac{1}{3}", 1),
    # expressions
    (r"x^2 + 2x + 1", B % "(x+1)^2", 1),
    (r"x^2 + 2x + 1", B % "(x+1)^3", 0),
    (r"2\sqrt{3}", B % r"\sqrt{12}", 1),
    (r"2\sqrt{3}", B % r"\sqrt{13}", 0),
    (r"\sqrt{2}", B % r"\sqrt2", 1),
    (r"\frac{5\sqrt{2}}{2}", B % r"\frac{5}{\sqrt{2}}", 1),
    (r"3\pi", B % r"3 \pi", 1),
    (r"3\pi", B % r"\pi^3", 0),
    ("e^2", B % r"\mathrm{e}^{2}", 1),
    ("e^2", B % r"e^{3}", 0),
    # plus-minus
    (r"\pm 2", B % "2, -2", 1),
    (r"\pm 2", B % "2", 0),
    (r"1 \pm \sqrt{2}", r"\boxed{1+\sqrt{2}} and \boxed{1-\sqrt{2}}", 1),
    (r"1 \pm \sqrt{2}", r"\boxed{1+\sqrt{2}}", 0),
    # very large numbers
    ("2^{100}", B % "1267650600228229401496703205376", 1),
    ("2^{100}", B % "1267650600228229401496703205377", 0),
    (r"10^{100}", B % r"10^{100} + 1", 0),
    (r"3 \cdot 10^{8}", B % "300000000", 1),
    (r"3 \cdot 10^{8}", B % "300000001", 0),
    ("1.5e-20", B % r"1.5 \times 10^{-20}", 1),
    ("1.5e-20", B % r"1.6 \times 10^{-20}", 0),
    # very small numbers
    (r"\frac{1}{1000000}", B % "0.000001", 1),
    (r"\frac{1}{1000000}", B % "0.000002", 0),
    (r"\frac{1}{100!}", B % r"\frac{1}{100!}", 1),
    (r"\frac{1}{100!}", B % r"\frac{1}{101!}", 0),
    ("0", B % "0.0", 1),
    ("0", B % r"10^{-9}", 0),
    # complex numbers
    ("3 + 4i", B % "3+4i", 1),
    ("3 + 4i", B % "4i + 3", 1),
    ("3 + 4i", B % "3-4i", 0),
    # matrices
    (
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        B % r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        1,
    ),
    (
        r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}",
        B % r"\begin{pmatrix} 1 & 2 \\ 4 & 3 \end{pmatrix}",
        0,
    ),
    # extraction
    ("5", r"\boxed{5}", 1),
    ("5", r"so $\boxed{5}$.", 1),
    ("5", r"\fbox{5}", 1),
    ("5", r"\boxed{}", 0),
    ("5", "no answer here", 0),
    ("5", r"\boxed{5} is wrong, the answer is \boxed{6}", 0),
]


def test_the_table_has_at_least_100_cases():
    assert len(TABLE) >= 100


@pytest.mark.parametrize(("gold", "response", "expected"), TABLE, ids=[f"{i:03d}" for i in range(len(TABLE))])
def test_table(gold, response, expected):
    assert score(gold, response) == float(expected)


# --- three false-negative kinds, both directions ----------------------------------------------------------


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        ("1,22", r"\boxed{1.22}", 1.0),  # a decimal comma in the GOLD (was 0: the comma rule read responses only)
        ("1,22", r"\boxed{1,22}", 1.0),
        ("1,22", r"\boxed{1.23}", 0.0),
        ("1,22", r"\boxed{122}", 0.0),
        ("0,5", r"\boxed{\frac{1}{2}}", 1.0),
        ("1,000", r"\boxed{1000}", 1.0),  # a comma before three digits stays a thousands separator in the gold too
        ("1,000", r"\boxed{1}", 0.0),
        ("1,5", r"\boxed{1, 5}", 1.0),  # against a listed answer an ambiguous gold keeps its set reading
    ],
)
def test_decimal_comma_in_the_gold(gold, response, expected):
    assert score(gold, response) == expected


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        ("1000.99", r"\boxed{1,000.99m²}", 1.0),  # was 0: "m²" was not stripped as \text{m}^2 is
        ("1000.99", r"\boxed{1,000.99 m²}", 1.0),
        ("1000.99", r"\boxed{1,000.99\text{m}^2}", 1.0),
        ("5", r"\boxed{5 cm³}", 1.0),
        ("1000.99", r"\boxed{1,001.99m²}", 0.0),
        ("5", r"\boxed{6 cm³}", 0.0),
        ("25", r"\boxed{5²}", 1.0),  # a superscript after a number is a power
        ("5", r"\boxed{5²}", 0.0),
    ],
)
def test_unit_with_a_superscript_inside_the_box(gold, response, expected):
    assert score(gold, response) == expected


HEAVY = r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{2\sqrt{33}+15}"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (r"\boxed{\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{15+2\sqrt{33}}}", 1.0),  # was a timeout (0): terms swapped
        (r"\boxed{\frac{\sqrt{\sqrt{194}+\sqrt{11}}}{15+2\sqrt{33}}}", 1.0),
        (r"\boxed{\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{16+2\sqrt{33}}}", 0.0),  # a near miss is refused, not timed out
        (r"\boxed{\frac{\sqrt{\sqrt{11}+\sqrt{195}}}{15+2\sqrt{33}}}", 0.0),
    ],
)
def test_heavy_valid_expression_is_decided_within_the_time_limit(response, expected):
    """The verifier pool gives one response ``reward.verify_timeout_s`` (5 s); each verdict here must come well
    inside it, through the same worker pool the generation job uses."""
    from mugrpo.rewards import RewardConfig, RewardScorer

    with RewardScorer(RewardConfig(components={"math_correctness": 1.0}, num_workers=1)) as scorer:
        (result,) = scorer.score([RewardInput(response, HEAVY)])
    assert result.status == "ok"
    assert result.components["math_correctness"] == expected
