"""Turning a problem into the policy's prompt: the model's chat template plus a configurable instruction, optionally
after worked examples (few-shot demonstrations of the answer format)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_INSTRUCTION = "Solve the problem step by step, then give the final answer in \\boxed{}."


class PromptExample(BaseModel):
    """One worked example shown before the question: a user turn (the example's question plus the instruction) and
    the assistant's answer to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    question: str = Field(min_length=1, description="The example's question (rendered like a problem's question).")
    response: str = Field(min_length=1, description="The assistant turn that answers it, in the answer format.")


class PromptConfig(BaseModel):
    """How a question becomes a prompt."""

    model_config = ConfigDict(extra="forbid")

    instruction: str = Field(DEFAULT_INSTRUCTION, description="Appended after the question in the user turn.")
    system: str | None = Field(None, description="Optional system message; None keeps the template's default.")
    use_chat_template: bool = Field(True, description="Render with the tokenizer's chat template (instruct models).")
    examples: list[PromptExample] = Field(
        default_factory=list,
        description="Worked examples rendered as earlier user/assistant turns before the question (few-shot "
        "prompting, Brown et al. 2020, arXiv 2005.14165): they show a small model the answer format without "
        "training on it. Each example's user turn carries the same instruction as the problem's. An example must "
        "not be a problem of the data or of a benchmark: the run refuses an example whose question is one of "
        "its problems (mugrpo.data.prompts.check_examples). Default: none (zero-shot).",
    )

    @field_validator("examples")
    @classmethod
    def _distinct_examples(cls, examples: list[PromptExample]) -> list[PromptExample]:
        questions = [e.question.strip() for e in examples]
        if len(set(questions)) != len(questions):
            raise ValueError("examples: two examples have the same question")
        return examples


def _user_turn(question: str, cfg: PromptConfig) -> str:
    return f"{question}\n\n{cfg.instruction}".strip()


def render_prompt(tokenizer, question: str, cfg: PromptConfig) -> str:
    """The prompt text for ``question``: the chat template with a generation prompt, or plain text.

    With ``cfg.examples``, each example comes first as a user turn (its question plus the instruction) and an
    assistant turn (its response); in plain text, as the same two parts on their own lines.

    Raises:
        ValueError: ``use_chat_template`` is set but the tokenizer has no chat template.
    """
    user = _user_turn(question, cfg)
    if not cfg.use_chat_template:
        shots = "".join(f"{_user_turn(e.question, cfg)}\n{e.response}\n\n" for e in cfg.examples)
        return f"{shots}{user}\n"
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("prompt.use_chat_template is true but the tokenizer has no chat template; set it to false")
    messages = [{"role": "system", "content": cfg.system}] if cfg.system else []
    for e in cfg.examples:
        messages += [
            {"role": "user", "content": _user_turn(e.question, cfg)},
            {"role": "assistant", "content": e.response},
        ]
    messages.append({"role": "user", "content": user})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def check_examples(cfg: PromptConfig, questions, *, where: str) -> None:
    """Refuse worked examples that are problems of a dataset (an example shown with its answer would leak that
    problem's answer into every prompt, and into a held-out evaluation).

    Args:
        questions: the dataset's question strings.
        where: the dataset's name, for the message.

    Raises:
        ValueError: an example's question (whitespace-stripped) equals one of ``questions``; the message names the
            example and the dataset.
    """
    if not cfg.examples:
        return
    own = {e.question.strip(): i for i, e in enumerate(cfg.examples)}
    for q in questions:
        i = own.get(q.strip())
        if i is not None:
            raise ValueError(
                f"data.prompt.examples[{i}] ({cfg.examples[i].question!r}) is a problem of dataset {where!r}: "
                "a worked example must not be one of the problems it is shown with; pick another question"
            )


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of a rendered prompt (the template already holds any special tokens)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
