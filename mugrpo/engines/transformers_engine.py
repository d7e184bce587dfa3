"""TransformersEngine: batched, KV-cached sampling on a transformers causal LM (the CPU default engine).

Own sampling loop rather than ``model.generate``, so that (a) each response's behavior log-prob is taken from the
exact distribution its token was drawn from (convention in :mod:`mugrpo.engines.base`), (b) every (prompt, sample)
draws from its own seeded generator (results do not depend on how rows are batched, up to float round-off), and
(c) a prompt is prefilled once and its KV cache repeated G times, instead of prefilling G copies.

Per batch of prompts (several requests' prompts share batches: :meth:`TransformersEngine.generate_many`):
    1. prefill the prompts' shared prefix once (system prompt, worked examples), then their rests left-padded on
       top of it, with position ids ``cumsum(attention_mask) - 1``, keeping only the last position's logits
       (``logits_to_keep=1``: a full [B, L, V] fp32 logits tensor would be ~GBs), into a KV cache preallocated for
       the prompt and the longest response (:mod:`mugrpo.engines.kv_cache`);
    2. repeat each prompt's logits, KV cache and attention mask into its n rows (rows of a group are adjacent);
    3. loop: sample one token per live row, append it and its log-prob, drop rows that emitted a stop token from
       the batch and the KV cache, feed the rest one token forward.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from mugrpo.common.dtypes import torch_dtype
from mugrpo.engines.base import (
    ROLLOUT_ENGINES,
    ClosingEngine,
    GenerationRequest,
    Sample,
    SamplingParams,
    check_prompts,
    finish_reason_of,
)
from mugrpo.engines.kv_cache import growing_cache, kv_bytes_per_token, rows_within_budget
from mugrpo.policy.models import eos_token_ids, load_policy
from mugrpo.policy.prefix import MIN_SHARED_PREFIX, cache_kwarg, shared_prefix_length
from mugrpo.policy.truncation import Truncation, apply_truncation

#: GiB of KV cache one batch may hold with ``batch_size="auto"``: 1 GiB holds ~170 rows of the main job
#: (SmolLM2-135M in fp32, 46 KiB per position, ~135 positions), where tokens/s levels off on a 2-core CPU (2 threads,
#: fp32: 224 tokens/s at 128 rows, 238 at 256; docs/benchmarks.md, "The CPU engine at the machine's width").
DEFAULT_KV_BUDGET_GIB = 1.0


def row_generator(seed: int, prompt_index: int, sample_index: int) -> torch.Generator:
    """CPU generator of sample ``sample_index`` of prompt ``prompt_index`` (positions within one generate call).

    Streams are derived with numpy's ``SeedSequence`` from (seed, prompt_index, sample_index), so they are
    independent of each other and of the batch a row lands in.
    """
    state = np.random.SeedSequence([seed, prompt_index, sample_index]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set logits outside the top-p nucleus to -inf (vLLM's rule; see :mod:`mugrpo.policy.truncation`).

    Args:
        logits: [R, V] float logits (already divided by the temperature).
        top_p: nucleus mass in (0, 1].

    Returns:
        [R, V] logits with the tokens outside the nucleus at -inf.
    """
    return apply_truncation(logits, Truncation(top_p=top_p))


def sample_next_tokens(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    truncation: Truncation,
    generators: list[torch.Generator | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return it with its behavior log-prob.

    Exponential race (equivalent to sampling from p): token = argmax_v p_v / E_v with E_v = -log(U_v) ~ Exp(1),
    U drawn from the row's generator; p = softmax(truncate(logits / T)) (min-p, top-k, top-p:
    :mod:`mugrpo.policy.truncation`, the rule the trainer replays). Unlike inverse-CDF sampling, whose
    cumulative sum over ~50k tokens moves every boundary when any logit changes by round-off, the race only flips
    when two keys tie to float precision, so samples survive re-batching. The log-prob is
    ``z_token - max(z) - log(sum(exp(z - max(z))))`` with z the masked scaled logits, i.e. log p(token).
    Rows with T = 0 are greedy (argmax of the logits) and report ``log_softmax(logits)`` at their token, as vLLM
    does.

    Args:
        logits: [R, V] next-token logits (any float dtype; computed in fp32).
        temperatures: [R] temperatures >= 0.
        truncation: min-p / top-k / top-p of the sampling; greedy rows are not truncated.
        generators: R CPU generators, one per row; None for a greedy row (it draws no noise).

    Returns:
        (tokens [R] int64, behavior log-probs [R] fp32 in nats).
    """
    logits = logits.float()
    greedy = (temperatures <= 0).to(logits.device)
    scaled = logits / torch.where(greedy, 1.0, temperatures.to(logits))[:, None]
    if truncation.active:
        scaled = torch.where(greedy[:, None], scaled, apply_truncation(scaled, truncation))
    row_max = scaled.max(dim=-1, keepdim=True).values
    weights = (scaled - row_max).exp_()
    noise = torch.empty(logits.shape, dtype=torch.float32)
    for row, generator in enumerate(generators):
        if generator is None:  # a greedy row draws nothing; its sampled token is not used
            noise[row].fill_(1.0)
        else:
            noise[row].uniform_(generator=generator)
    sampled = (weights / noise.to(weights.device).log_().neg_()).argmax(dim=-1)
    tokens = torch.where(greedy, scaled.argmax(dim=-1), sampled)
    log_normalizer = row_max.squeeze(-1) + weights.sum(dim=-1).log()
    return tokens, scaled.gather(-1, tokens[:, None]).squeeze(-1) - log_normalizer


class TransformersEngine(ClosingEngine):
    """Rollout engine on a transformers causal LM; see the module docstring for the algorithm.

    Build it from an HF dir with :meth:`from_dir` (registry name "transformers"), or on a live in-memory policy
    with the constructor (the on-policy GRPO baseline samples from the model it trains, with no reload).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int | Literal["auto"] = "auto",
        kv_budget_gib: float = DEFAULT_KV_BUDGET_GIB,
        fp32_logits: bool = False,
    ) -> None:
        """Args:
        model: causal LM; it is switched to eval mode while generating and restored afterwards.
        tokenizer: its tokenizer (decodes the responses; gives the EOS id).
        batch_size: rows (prompts x samples) per forward pass, or "auto": as many as the KV cache budget allows
            (:mod:`mugrpo.engines.kv_cache`). A batch always holds whole groups (a group larger than the limit is
            a batch of its own). Memory is O(rows x (prompt + response length)) of KV cache.
        kv_budget_gib: the KV cache budget of ``batch_size="auto"``, GiB per batch (default
            :data:`DEFAULT_KV_BUDGET_GIB`).
        fp32_logits: project the final hidden states through an fp32 copy of the LM head (V x H x 4 bytes more
            memory), so a bf16 model's logits are not rounded to bf16 (8 significant bits: a logit of 16 is
            rounded to a multiple of 0.125). Log-probs are fp32 from the logits either way. No effect on an fp32
            model. The option "fp32 logits in the sampler" of the mismatch study (docs/precision.md).

        Raises:
            ValueError: batch_size neither 'auto' nor an int >= 1, kv_budget_gib <= 0, or fp32_logits with an LM
                head that has a bias.
        """
        if batch_size != "auto" and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be an int >= 1 or 'auto', got {batch_size!r}")
        if not kv_budget_gib > 0:
            raise ValueError(f"kv_budget_gib must be > 0, got {kv_budget_gib!r}")
        self.kv_budget_gib = float(kv_budget_gib)
        self._head_fp32: torch.Tensor | None = None
        head = model.get_output_embeddings()
        if fp32_logits and head.weight.dtype != torch.float32:
            if getattr(head, "bias", None) is not None:
                raise ValueError(f"fp32_logits needs an LM head without bias; {type(model).__name__}'s has one")
            self._head_fp32 = head.weight.detach().float()
        self._model: PreTrainedModel | None = model
        self._tokenizer = tokenizer
        self.batch_size = batch_size
        #: Shared prompt prefixes shorter than this are prefilled with each prompt (:meth:`_prefill`).
        self.min_shared_prefix = MIN_SHARED_PREFIX
        self.eos_token_ids = eos_token_ids(model.generation_config, tokenizer)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self._cache_kwarg = cache_kwarg(model)
        #: Called with the number of tokens each decoding step sampled (live progress); None: nobody listens.
        self.on_tokens: Callable[[int], None] | None = None

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path,
        *,
        dtype: str | torch.dtype = torch.float32,
        batch_size: int | Literal["auto"] = "auto",
        kv_budget_gib: float = DEFAULT_KV_BUDGET_GIB,
        seed: int | None = None,
        num_threads: int | None = None,
        fp32_logits: bool = False,
        device: str | None = None,
    ) -> TransformersEngine:
        """Load the policy in ``model_dir`` (HF dir or .gguf) with ``dtype`` and wrap it.

        ``seed`` is accepted for a uniform engine factory signature and unused: this engine seeds each
        ``generate`` call from ``SamplingParams.seed``, which is what makes resumed shards reproducible.
        ``num_threads``, if set, calls ``torch.set_num_threads`` (process-wide). A job gets it from its spec, where
        the schedule resolved ``auto`` to the cores the jobs beside it leave free
        (:func:`mugrpo.orchestration.threads.job_threads`): on a CPU shared with other busy processes, 1 thread was
        3.5x faster than 2 on a 2-core machine (OpenMP threads spin-wait on each other).
        ``fp32_logits``: see the constructor. ``device``: where the model runs (e.g. ``"cuda"``; None keeps it on
        the CPU, the default); inputs follow the model's device.
        """
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        model, tokenizer = load_policy(model_dir, dtype=torch_dtype(dtype))
        if device is not None:
            model = model.to(device)
        return cls(model, tokenizer, batch_size=batch_size, kv_budget_gib=kv_budget_gib, fp32_logits=fp32_logits)

    @property
    def model(self) -> PreTrainedModel:
        if self._model is None:
            raise RuntimeError("this TransformersEngine is closed")
        return self._model

    def close(self) -> None:
        """Drop the engine's references to the model (the caller's own references keep it alive)."""
        self._model = None
        self._head_fp32 = None
        gc.collect()

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """Sample ``params.n`` responses per prompt; see :meth:`mugrpo.engines.base.RolloutEngine.generate`.

        Raises:
            ValueError: a malformed prompt, or ``params.temperatures`` of the wrong length.
            RuntimeError: the engine is closed.
        """
        return self.generate_many([GenerationRequest(prompt_token_ids, params)])[0]

    def generate_many(self, requests: list[GenerationRequest]) -> list[list[list[Sample]]]:
        """Sample several requests in one batch schedule (:func:`mugrpo.engines.base.generate_requests`): the rows
        of requests that truncate and stop alike share forward passes, each row with its own generator
        (:func:`row_generator` of its request's seed, its prompt's index in its request and its sample index) and
        its own ``max_new_tokens``, so each request gets the samples its own :meth:`generate` would (up to float
        round-off of the batch composition). A prompt's rows are never split across batches.

        Returns:
            one result per request: ``result[r][i][j]`` is sample j of prompt i of request r.

        Raises:
            ValueError: a malformed prompt, or ``params.temperatures`` of the wrong length.
            RuntimeError: the engine is closed.
        """
        items: dict[tuple, list[_Item]] = {}
        for r, request in enumerate(requests):
            check_prompts(request.prompt_token_ids)
            params = request.params
            temperatures = params.temperatures_for(len(request.prompt_token_ids))
            key = (params.truncation, tuple(sorted(set(params.stop_token_ids))))
            items.setdefault(key, []).extend(
                _Item(r, i, prompt, t, params.n, params.seed, params.max_new_tokens)
                for i, (prompt, t) in enumerate(zip(request.prompt_token_ids, temperatures, strict=True))
            )
        results: list[list[list[Sample]]] = [[[] for _ in r.prompt_token_ids] for r in requests]
        model = self.model
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                for (truncation, stop_ids), todo in items.items():
                    for batch in self._batches(todo):
                        for item, samples in zip(batch, self._generate_batch(batch, truncation, stop_ids), strict=True):
                            results[item.request][item.prompt_index] = samples
        finally:
            model.train(was_training)
        return results

    def rows_per_batch(self, items: list[_Item]) -> int:
        """Rows (prompts x samples) per forward pass for ``items``: ``batch_size``, or with ``batch_size="auto"``
        the most rows whose KV cache fits ``kv_budget_gib`` (:func:`mugrpo.engines.kv_cache.rows_within_budget`,
        positions = the longest prompt + the largest ``max_new_tokens`` of ``items``)."""
        if self.batch_size != "auto":
            return int(self.batch_size)
        positions = max(len(it.prompt) for it in items) + max(it.max_new_tokens for it in items)
        per_token = kv_bytes_per_token(self.model.config, self.model.dtype)
        return rows_within_budget(per_token, positions, self.kv_budget_gib * 2**30)

    def _batches(self, items: list[_Item]) -> list[list[_Item]]:
        """``items`` in order, packed into batches of at most :meth:`rows_per_batch` rows (an item's n rows stay
        together; an item with more rows than that is a batch of its own)."""
        limit = self.rows_per_batch(items) if items else 1
        batches: list[list[_Item]] = []
        rows = 0
        for item in items:
            if batches and rows + item.n <= limit:
                batches[-1].append(item)
                rows += item.n
            else:
                batches.append([item])
                rows = item.n
        return batches

    def _prefill(self, prompts: list[list[int]], capacity: int) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
        """Prefill into a cache of ``capacity`` positions. Returns (last-position logits [P, V], KV cache, attention
        mask [P, L]).

        The prompts' shared prefix (:func:`shared_prefix_length`; a main-job prompt is ~90 tokens of system prompt and
        worked examples before a ~13-token question) is prefilled once, as a batch of one, and its cache repeated
        into the P rows; then each prompt's rest, left-padded to the longest rest, is prefilled on top. The padding
        sits between the prefix and the rest: the attention mask hides it and position ids count only real tokens
        (``cumsum(mask) - 1``), so each row sees its prompt at positions 0..len-1, as without the shared prefix.
        """
        device = self.model.device
        shared = shared_prefix_length(prompts) if len(prompts) > 1 else 0
        if shared < self.min_shared_prefix:
            shared = 0
        cache = growing_cache(self.model.config, capacity)
        if shared:
            prefix = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=device)
            self.model.get_decoder()(  # the cache is what the prefix is for: no LM head
                input_ids=prefix,
                attention_mask=torch.ones_like(prefix),
                position_ids=torch.arange(shared, device=device)[None],
                use_cache=True,
                **{self._cache_kwarg: cache},
            )
            cache.batch_select_indices(torch.zeros(len(prompts), dtype=torch.long))
        rests = [p[shared:] for p in prompts]
        width = max(len(r) for r in rests)
        input_ids = torch.full((len(rests), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rests), shared + width), dtype=torch.long)
        attention_mask[:, :shared] = 1
        for row, rest in enumerate(rests):
            input_ids[row, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            attention_mask[row, shared + width - len(rest) :] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        logits = self._next_logits(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            position_ids=position_ids.to(device),
            use_cache=True,
            **{self._cache_kwarg: cache},
        )
        return logits, cache, attention_mask.to(device)

    def _next_logits(self, **inputs) -> torch.Tensor:
        """Logits [R, V] of the last position (the model's dtype, or fp32 with ``fp32_logits``)."""
        if self._head_fp32 is None:
            return self.model(**inputs, logits_to_keep=1).logits[:, -1, :]
        hidden = self.model.get_decoder()(**inputs).last_hidden_state[:, -1, :]
        return hidden.float() @ self._head_fp32.t()

    def _generate_batch(
        self, items: list[_Item], truncation: Truncation, stop_token_ids: tuple[int, ...]
    ) -> list[list[Sample]]:
        """Sample every item of one batch: its prompts prefilled once, each prompt's cache repeated into its n rows."""
        device = self.model.device
        stop_ids = sorted(set(self.eos_token_ids) | set(stop_token_ids))
        stop_tensor = torch.tensor(stop_ids, dtype=torch.long, device=device)
        horizon = max(it.max_new_tokens for it in items)

        prompts = [it.prompt for it in items]
        logits, cache, attention_mask = self._prefill(prompts, max(len(p) for p in prompts) + horizon)
        repeats = torch.tensor([it.n for it in items])
        if bool((repeats > 1).any()):
            rows_of_prompts = torch.arange(len(items)).repeat_interleave(repeats)
            logits = logits[rows_of_prompts.to(logits.device)]
            cache.batch_select_indices(rows_of_prompts)
            attention_mask = attention_mask[rows_of_prompts.to(device)]
        owners = [(k, j) for k, it in enumerate(items) for j in range(it.n)]  # (item, sample index) of each row
        num_rows = len(owners)
        next_position = attention_mask.sum(-1)  # [R] position id of the token about to be fed
        row_temperatures = torch.tensor([items[k].temperature for k, _ in owners], dtype=torch.float32)
        row_limits = torch.tensor([items[k].max_new_tokens for k, _ in owners])
        generators = [
            row_generator(items[k].seed, items[k].prompt_index, j) if items[k].temperature > 0 else None
            for k, j in owners
        ]
        tokens: list[list[int]] = [[] for _ in range(num_rows)]
        logprobs: list[list[float]] = [[] for _ in range(num_rows)]
        alive = torch.arange(num_rows)  # original row index of each row still in the batch

        for step in range(horizon):
            alive_list = alive.tolist()
            next_tokens, next_logprobs = sample_next_tokens(
                logits, row_temperatures[alive], truncation, [generators[r] for r in alive_list]
            )
            for row, token, logprob in zip(alive_list, next_tokens.tolist(), next_logprobs.tolist(), strict=True):
                tokens[row].append(token)
                logprobs[row].append(logprob)
            if self.on_tokens is not None:
                self.on_tokens(len(alive_list))
            if step == horizon - 1:
                break
            keep = ~torch.isin(next_tokens, stop_tensor) & (row_limits[alive] > step + 1).to(device)
            if not keep.any():
                break
            if not keep.all():
                index = keep.nonzero().squeeze(-1)
                cache.batch_select_indices(index)
                attention_mask, next_position = attention_mask[index], next_position[index]
                alive, next_tokens = alive[index.cpu()], next_tokens[index]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(alive), 1)], dim=-1)
            logits = self._next_logits(
                input_ids=next_tokens[:, None],
                attention_mask=attention_mask,
                position_ids=next_position[:, None],
                use_cache=True,
                **{self._cache_kwarg: cache},
            )
            next_position = next_position + 1

        stop_set = set(stop_ids)
        samples = [
            Sample(
                response_token_ids=tokens[row],
                behavior_logprobs=logprobs[row],
                text=self._tokenizer.decode(tokens[row], skip_special_tokens=True),
                finish_reason=finish_reason_of(tokens[row], stop_set),
                temperature=float(items[k].temperature),
            )
            for row, (k, _) in enumerate(owners)
        ]
        groups, row = [], 0
        for it in items:
            groups.append(samples[row : row + it.n])
            row += it.n
        return groups


@dataclass(frozen=True)
class _Item:
    """One prompt of a request in a batch schedule: its request, its index there, its tokens and how to sample it."""

    request: int
    prompt_index: int
    prompt: list[int]
    temperature: float
    n: int
    seed: int
    max_new_tokens: int


ROLLOUT_ENGINES.register("transformers")(TransformersEngine.from_dir)
