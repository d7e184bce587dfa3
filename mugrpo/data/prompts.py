"""Turning a problem into the policy's prompt: the model's chat template plus a configurable instruction."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_INSTRUCTION = "Solve the problem step by step, then give the final answer in \\boxed{}."


class PromptConfig(BaseModel):
    """How a question becomes a prompt."""

    model_config = ConfigDict(extra="forbid")

    instruction: str = Field(DEFAULT_INSTRUCTION, description="Appended after the question in the user turn.")
    system: str | None = Field(None, description="Optional system message; None keeps the template's default.")
    use_chat_template: bool = Field(True, description="Render with the tokenizer's chat template (instruct models).")


def render_prompt(tokenizer, question: str, cfg: PromptConfig) -> str:
    """The prompt text for ``question``: the chat template with a generation prompt, or plain text.

    Raises:
        ValueError: ``use_chat_template`` is set but the tokenizer has no chat template.
    """
    user = f"{question}\n\n{cfg.instruction}".strip()
    if not cfg.use_chat_template:
        return f"{user}\n"
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("prompt.use_chat_template is true but the tokenizer has no chat template; set it to false")
    messages = ([{"role": "system", "content": cfg.system}] if cfg.system else []) + [{"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of a rendered prompt (the template already holds any special tokens)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
