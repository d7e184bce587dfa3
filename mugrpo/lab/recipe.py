"""The lab policy's recipe: task, model shape and SFT schedule, and where a built policy is cached.

A recipe is a pydantic model; its hash (sha256 of its canonical JSON plus :data:`RECIPE_FORMAT`) names the cache
folder, so a changed knob builds a new policy and an unchanged one is reused (``mugrpo lab init`` is then instant).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DEFAULT_PARAMS", "LabRecipe", "lab_cache_root"]

#: Bumped when the build code changes what a recipe produces (tokenizer, model init, SFT loop, answer format).
RECIPE_FORMAT = 1

#: The default task: 3 terms of 0-10, + and -, no parentheses or negated groups ("Calculate 7 - 2 + 9."; answers -20
#: to 30). A 0.27 M-parameter model learns it to ~30% sampled accuracy in a few hundred SFT steps with the worked
#: line ("7 - 2 = 5, 5 + 9 = \\boxed{14}"); 2 terms of 1-2 digits plateaued near 5% for as long (docs/benchmarks.md).
DEFAULT_PARAMS: dict[str, Any] = {
    "min_terms": 3,
    "max_terms": 3,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+", "-"],
    "allow_parentheses": False,
    "allow_negation": False,
}


class LabRecipe(BaseModel):
    """Everything that determines a lab policy. Defaults: the policy `configs/lab/` trains."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = Field("basic_arithmetic", description="reasoning-gym task the policy is warm-started on.")
    params: dict[str, Any] = Field(default_factory=lambda: dict(DEFAULT_PARAMS), description="The task's params.")
    seed: int = Field(0, ge=0, description="Seeds the task's problems, the model's init and the SFT order.")
    train_size: int = Field(4000, ge=1, description="Distinct training problems the SFT draws from.")
    heldout_fraction: float = Field(0.1, gt=0, lt=1, description="Question-hash share held out (mugrpo.data.gym).")
    heldout_size: int = Field(200, ge=1, description="Held-out problems of the stop check and the reported figures.")
    system: str | None = Field(
        "Answer in \\boxed{}.",
        description="The prompt's system message (prompt.system of the lab configs): the instruction comes first, so "
        "the question ends right before the answer and a small model attends over a short distance.",
    )
    instruction: str = Field(
        "", description="The prompt's instruction after the question (prompt.instruction of the lab configs)."
    )
    answer_format: Literal["boxed", "expression", "steps"] = Field(
        "steps",
        description="SFT target: 'boxed' = '\\boxed{ANSWER}'; 'expression' = 'EXPRESSION = \\boxed{ANSWER}'; "
        "'steps' = a short worked line that folds a +/- chain left to right, one operation per step: "
        "'3 + 5 = 8, 8 - 2 = \\boxed{6}' (from the entry's metadata['expression']; else 'boxed').",
    )
    hidden_size: int = Field(64, ge=32)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(2, ge=1, description="hidden_size / num_heads is the head dim: 32/64/80/... for vLLM.")
    intermediate_size: int = Field(256, ge=32)
    max_position_embeddings: int = Field(256, ge=64)
    batch_size: int = Field(32, ge=1, description="SFT sequences per step.")
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate (linear warmup, then constant).")
    warmup_steps: int = Field(20, ge=0)
    max_steps: int = Field(2000, ge=1, description="SFT steps at most (the stop check usually ends it earlier).")
    eval_every: int = Field(50, ge=1, description="SFT steps between stop checks.")
    eval_size: int = Field(128, ge=1, description="Held-out problems sampled at each stop check.")
    target_accuracy: float = Field(
        0.25, gt=0, le=1, description="Stop once sampled (T = 1) held-out accuracy reaches this: room left for RL."
    )
    max_new_tokens: int = Field(40, ge=1, description="Response budget of the stop check and the reported figures.")
    num_threads: int = Field(1, ge=1, description="torch threads (fixed: CPU results depend on the thread count).")

    @model_validator(mode="after")
    def _known_task(self) -> LabRecipe:
        from mugrpo.data.gym import check_task

        check_task(self.task, self.params)  # unknown task or params: ValueError naming them (before any build)
        return self

    def hash(self) -> str:
        """16 hex digits naming this recipe's build."""
        blob = json.dumps({"format": RECIPE_FORMAT, **self.model_dump(mode="json")}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def prompt(self):
        """The :class:`mugrpo.data.prompts.PromptConfig` the SFT renders with (and the lab configs' ``data.prompt``)."""
        from mugrpo.data.prompts import PromptConfig

        return PromptConfig(system=self.system, instruction=self.instruction)

    def dataset(self, split: Literal["train", "heldout"], size: int | None = None) -> dict[str, Any]:
        """The ``source: reasoning_gym`` dataset config (as a dict) of this recipe's problems of ``split``."""
        return {
            "name": f"{self.task}" if split == "train" else f"{self.task}-heldout",
            "source": "reasoning_gym",
            "task": self.task,
            "params": dict(self.params),
            "seed": self.seed,
            "size": size or (self.train_size if split == "train" else self.heldout_size),
            "split": split,
            "heldout_fraction": self.heldout_fraction,
        }


def lab_cache_root() -> Path:
    """Where built lab policies live: ``$MUGRPO_LAB_CACHE``, else ``$XDG_CACHE_HOME/mugrpo/lab``, else
    ``~/.cache/mugrpo/lab`` (outside any clone: a policy is built once per machine and recipe)."""
    if os.environ.get("MUGRPO_LAB_CACHE"):
        return Path(os.environ["MUGRPO_LAB_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "mugrpo" / "lab"
