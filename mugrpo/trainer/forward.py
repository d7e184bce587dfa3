"""The policy as the trainer calls it: token log-probs of the responses, without full-vocabulary logits.

:class:`PolicyTokenLogprobs` wraps an HF causal LM so that one ``forward`` goes through the wrapper that
accelerate prepares (DDP hooks, FSDP unsharding). It runs the decoder to the final hidden states, keeps only the
states that predict response tokens, and projects them through the LM head chunk by chunk
(:func:`mugrpo.policy.logprobs.token_logprobs_from_hidden`), so no [B, L, V] fp32 logits exist.

No attention mask is passed: sequences are right-padded and attention is causal, so a real token never attends
to padding (padding comes after it) and the padded positions' outputs are never read. This keeps attention on
the causal fast path (SDPA ``is_causal``) instead of a materialized [B, 1, L, L] mask. On CPU, attention runs
on SDPA's math backend (:func:`mugrpo.trainer.precision.batch_invariant_attention`): a sequence's log-probs do not
depend on the micro-batch it is padded into, in fp32 and under bf16 autocast.

A micro-batch's shared prompt prefix (``train.shared_prefix``, :mod:`mugrpo.policy.prefix`) runs once: the tokens
every row starts with (a main-job micro-batch: ~90 of ~135 positions) go through the decoder as a batch of one,
and the rows' own tokens attend to that one copy of its keys and values. The log-probs are the full forward's
(bitwise in fp32 on CPU, tested); the gradient that reaches the prefix is the sum of the rows' (the expand's
backward), equal to the full backward's up to fp32 summation order (~1e-6 relative, tested). Forward and backward
of a main-job micro-batch take 1.91x less time (bench/shared_prefix_train.py, docs/benchmarks.md).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from mugrpo.policy.logprobs import token_logprobs_from_hidden
from mugrpo.policy.prefix import MIN_SHARED_PREFIX, cache_kwarg, expand_cache
from mugrpo.trainer.batch import TokenBatch, collate
from mugrpo.trainer.data import RolloutSet
from mugrpo.trainer.precision import batch_invariant_attention


class PolicyTokenLogprobs(nn.Module):
    """``forward(batch) -> (logprobs [B, R], entropy [B, R])`` of a causal LM policy.

    Args:
        policy: HF causal LM with ``get_decoder()`` (hidden states after the final norm) and an output embedding
            without bias (Llama, Qwen2, SmolLM2, ...). Tied embeddings are fine.
        chunk_size: tokens per chunk of the LM-head projection + log-softmax.
        shared_prefix: run a micro-batch's shared prompt prefix once (see the module docstring) when its rows share
            at least ``min_shared_prefix`` tokens; False: every row runs whole.

    Raises:
        ValueError: the LM head has a bias (not supported by the chunked log-softmax).
    """

    def __init__(self, policy: PreTrainedModel, chunk_size: int = 1024, shared_prefix: bool = True):
        super().__init__()
        head = policy.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError(f"{type(policy).__name__}'s LM head has a bias; the chunked log-softmax needs none")
        self.policy = policy
        self.chunk_size = chunk_size
        self.shared_prefix = shared_prefix
        self.min_shared_prefix = MIN_SHARED_PREFIX

    def shared_length(self, batch: TokenBatch) -> int:
        """Positions of ``batch`` run once for all rows: ``batch.shared_prefix``, the tokens every row's prompt starts
        with but the last (whose output predicts the first response token). 0 (every row runs whole)
        when off, for a single row, below ``min_shared_prefix`` tokens, or while activation checkpointing
        recomputes layers (it drops the KV cache the rows attend to)."""
        rows = batch.input_ids.shape[0]
        if not self.shared_prefix or rows < 2:
            return 0
        if self.training and torch.is_grad_enabled() and _checkpoints_layers(self.policy):
            return 0
        return batch.shared_prefix if batch.shared_prefix >= self.min_shared_prefix else 0

    def hidden_states(self, batch: TokenBatch, shared: int) -> torch.Tensor:
        """Final hidden states [B, L - shared, H] of positions ``shared``..L-1 of every row (all positions when
        ``shared`` is 0), the first ``shared`` positions run once as a batch of one."""
        decoder = self.policy.get_decoder()
        if not shared:
            return decoder(
                input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False
            ).last_hidden_state
        cache = DynamicCache(config=self.policy.config)
        kwarg = cache_kwarg(decoder)
        decoder(
            input_ids=batch.input_ids[:1, :shared],
            position_ids=batch.position_ids[:1, :shared],
            use_cache=True,
            **{kwarg: cache},
        )
        expand_cache(cache, batch.input_ids.shape[0])
        return decoder(
            input_ids=batch.input_ids[:, shared:],
            position_ids=batch.position_ids[:, shared:],
            use_cache=True,
            **{kwarg: cache},
        ).last_hidden_state

    def forward(
        self, batch: TokenBatch, return_entropy: bool = True, logit_var_out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of ``batch.response_ids`` under softmax(logits / T_i) of each row i, T_i the
        row's learner temperature (``batch.learner_temperatures``: the sampling temperature unless
        ``train.learner_temperature`` is set).

        Restricted to row i's min-p / top-k / top-p kept set and renormalized when the row was sampled truncated
        (:mod:`mugrpo.policy.truncation`).

        Args:
            logit_var_out: optional [B, R] fp32 tensor filled with each token's raw-logit variance over the
                vocabulary (:func:`mugrpo.policy.logprobs.token_logprobs_from_hidden`).

        Returns:
            logprobs [B, R] fp32 (differentiable), entropy [B, R] fp32 detached in nats, or None. Values at
            padding positions are finite but meaningless: mask them with ``batch.response_mask``.
        """
        shared = self.shared_length(batch)
        with batch_invariant_attention(batch.input_ids.device.type):  # same log-probs whatever the padding
            hidden = self.hidden_states(batch, shared)
        positions = (batch.response_index - shared).clamp_min(0)  # padding entries (0) stay in range
        index = positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        response_hidden = hidden.gather(1, index)  # [B, R, H]
        weight = self.policy.get_output_embeddings().weight
        temperatures = batch.temperatures if batch.learner_temperatures is None else batch.learner_temperatures
        keys = list(zip(temperatures.tolist(), batch.truncations, strict=True))
        if len(set(keys)) == 1:
            temperature, truncation = keys[0]
            logprobs, entropy = token_logprobs_from_hidden(
                response_hidden,
                weight,
                batch.response_ids,
                chunk_size=self.chunk_size,
                temperature=temperature,
                truncation=truncation,
                return_entropy=return_entropy,
                logit_var_out=logit_var_out,
            )
            return logprobs, entropy.detach() if entropy is not None else None
        # Rows sampled with different temperatures (per-prompt temperatures) or truncations: one call each.
        logprobs = response_hidden.new_zeros(batch.response_ids.shape, dtype=torch.float32)
        entropy = torch.zeros_like(logprobs) if return_entropy else None
        for key in sorted(set(keys), key=repr):
            rows = torch.tensor([i for i, k in enumerate(keys) if k == key], device=hidden.device)
            var = None if logit_var_out is None else logit_var_out.new_empty((len(rows), logit_var_out.shape[1]))
            lp, ent = token_logprobs_from_hidden(
                response_hidden.index_select(0, rows),
                weight,
                batch.response_ids.index_select(0, rows),
                chunk_size=self.chunk_size,
                temperature=key[0],
                truncation=key[1],
                return_entropy=return_entropy,
                logit_var_out=var,
            )
            logprobs = logprobs.index_copy(0, rows, lp)
            if var is not None:
                logit_var_out.index_copy_(0, rows, var)
            if entropy is not None:
                entropy = entropy.index_copy(0, rows, ent.detach())
        return logprobs, entropy


def _checkpoints_layers(policy: nn.Module) -> bool:
    """Whether activation checkpointing is on for a layer of ``policy`` (HF's ``GradientCheckpointingLayer`` flag)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in policy.modules())


@torch.no_grad()
def recompute_logprobs(
    model: PolicyTokenLogprobs, data: RolloutSet, batch_size: int, pad_token_id: int, device: torch.device
) -> list[torch.Tensor]:
    """Teacher-forced log-probs of every rollout's response under ``model`` (one [num_tokens] fp32 CPU tensor each):
    the trainer's own behavior log-probs, for ``recompute_behavior_logprobs`` and truncated IS (``loss.tis_cap``).
    Always at each row's sampling temperature and truncation (never ``train.learner_temperature``): they stand in
    for the sampler's q."""
    out: list[torch.Tensor] = []
    for start in range(0, len(data.rollouts), batch_size):
        chunk = data.rollouts[start : start + batch_size]
        batch = collate(chunk, [0] * len(chunk), pad_token_id).to(device)
        logprobs, _ = model(batch, return_entropy=False)
        out.extend(logprobs[i, : r.num_tokens].float().cpu() for i, r in enumerate(chunk))
    return out
