"""Worked examples in the prompt (``data.prompt.examples``): rendered as earlier chat turns (or plain-text lines)
before the question, with the problem's instruction, and refused at preflight when an example is one of the run's
problems (its answer would be shown to the policy in every prompt, held-out evaluations included)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

pytest.importorskip("reasoning_gym")

from mugrpo.config import load_config
from mugrpo.data.datasets import load_problems
from mugrpo.data.prompts import PromptConfig, PromptExample, check_examples, render_prompt
from mugrpo.lab.tokenizer import build_char_tokenizer
from mugrpo.orchestration.preflight import Refusal, check_prompt_examples

MAIN = "configs/smollm2-arithmetic.yaml"
SHOTS = [
    PromptExample(question="Calculate 7 + 5.", response="7 + 5 = 12. The answer is \\boxed{12}."),
    PromptExample(question="Calculate 4 - 9.", response="4 - 9 = -5. The answer is \\boxed{-5}."),
]


def test_examples_are_earlier_chat_turns_with_the_problems_instruction():
    tok = build_char_tokenizer()
    cfg = PromptConfig(instruction="Answer in \\boxed{}.", examples=SHOTS)
    text = render_prompt(tok, "Calculate 31 + 40.", cfg)
    expected = tok.apply_chat_template(
        [
            {"role": "user", "content": "Calculate 7 + 5.\n\nAnswer in \\boxed{}."},
            {"role": "assistant", "content": "7 + 5 = 12. The answer is \\boxed{12}."},
            {"role": "user", "content": "Calculate 4 - 9.\n\nAnswer in \\boxed{}."},
            {"role": "assistant", "content": "4 - 9 = -5. The answer is \\boxed{-5}."},
            {"role": "user", "content": "Calculate 31 + 40.\n\nAnswer in \\boxed{}."},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == expected
    assert text.index("7 + 5 = 12") < text.index("4 - 9 = -5") < text.index("Calculate 31 + 40.")
    zero_shot = render_prompt(tok, "Calculate 31 + 40.", PromptConfig(instruction="Answer in \\boxed{}."))
    assert "7 + 5" not in zero_shot and zero_shot.endswith(text[len(text) - len(zero_shot) :])


def test_plain_text_examples_come_before_the_question():
    cfg = PromptConfig(instruction="Answer in \\boxed{}.", use_chat_template=False, examples=SHOTS[:1])
    text = render_prompt(None, "Calculate 31 + 40.", cfg)
    assert text == (
        "Calculate 7 + 5.\n\nAnswer in \\boxed{}.\n7 + 5 = 12. The answer is \\boxed{12}.\n\n"
        "Calculate 31 + 40.\n\nAnswer in \\boxed{}.\n"
    )


def test_two_examples_with_one_question_are_refused():
    with pytest.raises(ValidationError, match="two examples have the same question"):
        PromptConfig(examples=[SHOTS[0], PromptExample(question=" Calculate 7 + 5.", response="12")])


def test_an_example_that_is_a_problem_is_refused_with_its_index_and_dataset():
    with pytest.raises(ValueError, match=r"examples\[1\] \('Calculate 4 - 9\.'\) is a problem of dataset 'heldout'"):
        check_examples(PromptConfig(examples=SHOTS), ["Calculate 3 + 3.", "Calculate 4 - 9. "], where="heldout")
    check_examples(PromptConfig(examples=SHOTS), ["Calculate 3 + 3."], where="heldout")  # no overlap: passes


def test_preflight_refuses_an_example_taken_from_the_held_out_benchmark():
    cfg = load_config(MAIN)
    check_prompt_examples(cfg)  # the shipped examples are one-digit problems, outside the two-digit task
    heldout = cfg.eval.benchmarks[0].dataset
    question = load_problems(heldout)[0][5].question
    leaked = load_config(MAIN, [f'data.prompt.examples=[{{question: "{question}", response: "x"}}]'])
    with pytest.raises(Refusal, match=f"is a problem of dataset '{heldout.name}'"):
        check_prompt_examples(leaked)
