"""The prompts of a stage: which problems it samples and how they become token ids."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from mugrpo.data.datasets import Problem
from mugrpo.data.prompts import encode_prompt, render_prompt
from mugrpo.generation.spec import GenerateSpec, GenerationError


@dataclass
class PreparedPrompt:
    """A problem rendered with the chat template and tokenized."""

    problem: Problem
    text: str
    token_ids: list[int]


def prepare_prompts(
    spec: GenerateSpec, tokenizer, problems: list[Problem], max_context: int
) -> tuple[list[PreparedPrompt | None], Counter]:
    """Render and tokenize prompts; a bad one becomes None (skipped) and its reason is counted, or raises.

    A prompt is bad when it renders to no tokens ("empty") or leaves no room for ``max_new_tokens`` in the
    context window ("too_long").

    Raises:
        GenerationError: a bad prompt when ``spec.on_bad_prompt == 'error'`` (names the prompt and its source).
    """
    out: list[PreparedPrompt | None] = []
    skipped: Counter = Counter()
    budget = max_context - spec.sampling.max_new_tokens
    for p in problems:
        text = render_prompt(tokenizer, p.question, spec.prompt)
        ids = encode_prompt(tokenizer, text)
        reason = "empty" if not ids or not p.question.strip() else "too_long" if len(ids) > budget else None
        if reason is None:
            out.append(PreparedPrompt(p, text, ids))
            continue
        if spec.on_bad_prompt == "error":
            raise GenerationError(
                f"prompt {p.prompt_id} ({p.source}) is {reason}: {len(ids)} tokens, context {max_context}, "
                f"max_new_tokens {spec.sampling.max_new_tokens}"
            )
        skipped[reason] += 1
        out.append(None)
    return out, skipped
