"""Per-token log-probs (and entropies) of target tokens without materializing full-vocabulary fp32 logits.

A [B*T, V] fp32 logits tensor is the largest activation of an LLM policy-gradient step (2048 tokens x 49152
vocab = 403 MB, and autograd keeps several such tensors). :func:`token_logprobs_from_hidden` projects the final
hidden states through the LM head one chunk of tokens at a time, keeps one log-sum-exp per token, and recomputes
each chunk's logits in backward, so peak extra memory is O(chunk_size x V).

Both functions divide logits by the sampling temperature first and, when the rollout was sampled with min-p / top-k /
top-p, restrict the tempered distribution to the same kept set and renormalize (:mod:`mugrpo.policy.truncation`): the
behavior log-probs stored with a rollout are log-probs of that distribution, and the importance ratio needs the
same quantity (the ratio is then exactly 1 for an unchanged policy). The sampled token is always in the kept set.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from mugrpo.policy.truncation import Truncation, keep_mask, truncation_threshold

_NO_TRUNCATION = Truncation()


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def token_logprobs_from_logits(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    temperature: float = 1.0,
    *,
    truncation: Truncation = _NO_TRUNCATION,
    return_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(truncate(logits / temperature))[target] per token: the simple path, for small vocabularies or tests.

    Args:
        logits: [B, T, V] logits (any float dtype); ``logits[:, t]`` must be the prediction of
            ``target_ids[:, t]`` (shift a causal LM's logits by one position before calling).
        target_ids: [B, T] int token ids in [0, V).
        temperature: sampling temperature (> 0) the logits are divided by.
        truncation: min-p / top-k / top-p of the sampling (:mod:`mugrpo.policy.truncation`); the kept set is rebuilt
            from these logits and always holds the target token.
        return_entropy: also return the entropy of the (truncated) tempered distribution.

    Returns:
        (logprobs [B, T] fp32, entropy [B, T] fp32 in nats or None). Differentiable in ``logits``.

    Raises:
        ValueError: bad shapes or temperature.
    """
    _check_temperature(temperature)
    if logits.dim() != 3 or target_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits [B, T, V] and target_ids [B, T], got {tuple(logits.shape)} and {tuple(target_ids.shape)}"
        )
    scaled = logits.float() / temperature
    if truncation.active:
        flat = scaled.reshape(-1, scaled.shape[-1])
        with torch.no_grad():
            threshold = truncation_threshold(flat, truncation)
            keep = keep_mask(flat, threshold, target_ids.reshape(-1))
        scaled = flat.masked_fill(~keep, float("-inf")).view_as(scaled)
    log_normalizer = torch.logsumexp(scaled, dim=-1)
    logprobs = scaled.gather(-1, target_ids.long().unsqueeze(-1)).squeeze(-1) - log_normalizer
    if not return_entropy:
        return logprobs, None
    probs = torch.softmax(scaled, dim=-1)
    entropy = log_normalizer - (probs * scaled.masked_fill(probs == 0, 0.0)).sum(dim=-1)
    return logprobs, entropy


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """[n, H] x [V, H] -> [n, V] fp32 tempered logits (the matmul runs in the inputs' common dtype)."""
    logits = (hidden @ weight.t()).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


def _forward_chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    truncation: Truncation,
    with_entropy: bool,
    with_logit_var: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """One chunk: (log-sum-exp [n], log p(target) [n], entropy [n] or None, kept-set threshold [n] or None,
    logit variance [n] or None).

    Sums run over the kept set only (the whole vocabulary without truncation), via two [n, V] fp32 buffers. The
    logit variance is that of the raw (untempered) logits over the whole vocabulary: var(z / T) * T^2.
    """
    logits = _chunk_logits(hidden, weight, temperature)
    logit_var = logits.var(dim=-1, unbiased=False) * (temperature * temperature) if with_logit_var else None
    threshold = truncation_threshold(logits, truncation) if truncation.active else None
    max_logit = logits.amax(dim=-1, keepdim=True)
    unnormalized = (logits - max_logit).exp_()
    if threshold is not None:
        unnormalized.masked_fill_(~keep_mask(logits, threshold, targets), 0.0)
    partition = unnormalized.sum(dim=-1)
    lse = max_logit.squeeze(-1) + partition.log()
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = lse - unnormalized.mul_(logits).sum(dim=-1) / partition if with_entropy else None  # lse - E_p[z]
    return lse, logprobs, entropy, threshold, logit_var


def _grad_logits_chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    threshold: torch.Tensor | None,
    grad_logprobs: torch.Tensor | None,
    grad_entropy: torch.Tensor | None,
) -> torch.Tensor:
    """d(loss)/d(raw logits) [n, V] fp32 of one chunk, recomputed from its inputs with two [n, V] buffers.

    Under truncation p is the renormalized kept-set distribution and tokens outside the set get zero gradient
    (the set itself is a piecewise-constant function of the logits).
    """
    logits = _chunk_logits(hidden, weight, temperature)
    dropped = ~keep_mask(logits, threshold, targets) if threshold is not None else None
    log_p = logits.sub_(lse.unsqueeze(-1))
    if dropped is not None:
        log_p.masked_fill_(dropped, float("-inf"))
    probs = log_p.exp()
    if dropped is not None:
        log_p.masked_fill_(dropped, 0.0)  # so that p * log p is 0, not nan, outside the kept set
    grad = None
    if grad_entropy is not None:
        # H = -sum_j p_j log p_j;  dH/dz_j = -p_j (log p_j + H).
        g = grad_entropy.float().unsqueeze(-1)
        grad = log_p.add_(entropy.unsqueeze(-1)).mul_(probs).mul_(-g)
    if grad_logprobs is not None:
        # d log p_y / dz_j = 1[j = y] - p_j.
        g = grad_logprobs.float().unsqueeze(-1)
        grad_lp = probs.mul_(-g).scatter_add_(-1, targets.unsqueeze(-1), g)
        grad = grad_lp if grad is None else grad.add_(grad_lp)
    return grad.div_(temperature) if temperature != 1.0 else grad  # z = logits / temperature


def _common_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both operands in their promoted dtype (no copy when they already agree)."""
    dtype = torch.promote_types(hidden.dtype, weight.dtype)
    return hidden.to(dtype), weight.to(dtype)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """Chunked log p(target) and entropy; saves the inputs plus two floats per token for backward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size, temperature, truncation, with_entropy, with_logit_var):
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            return _ChunkedTokenLogprobs._forward(
                ctx, hidden, weight, targets, chunk_size, temperature, truncation, with_entropy, with_logit_var
            )

    @staticmethod
    def _forward(ctx, hidden, weight, targets, chunk_size, temperature, truncation, with_entropy, with_logit_var):
        compute_hidden, compute_weight = _common_dtype(hidden, weight)
        num_tokens = hidden.shape[0]
        logprobs = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)
        log_normalizer = torch.empty_like(logprobs)
        entropy = torch.empty_like(logprobs) if with_entropy else logprobs.new_empty(0)
        threshold = torch.empty_like(logprobs) if truncation.active else logprobs.new_empty(0)
        logit_var = torch.empty_like(logprobs) if with_logit_var else logprobs.new_empty(0)
        for start in range(0, num_tokens, chunk_size):
            rows = slice(start, start + chunk_size)
            lse, chunk_logprobs, chunk_entropy, chunk_threshold, chunk_var = _forward_chunk(
                compute_hidden[rows],
                compute_weight,
                targets[rows],
                temperature,
                truncation,
                with_entropy,
                with_logit_var,
            )
            if with_logit_var:
                logit_var[rows] = chunk_var
            log_normalizer[rows], logprobs[rows] = lse, chunk_logprobs
            if with_entropy:
                entropy[rows] = chunk_entropy
            if truncation.active:
                threshold[rows] = chunk_threshold
        ctx.save_for_backward(hidden, weight, targets, log_normalizer, entropy, threshold)
        ctx.chunk_size, ctx.temperature, ctx.with_entropy = chunk_size, temperature, with_entropy
        ctx.truncated = truncation.active
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        ctx.mark_non_differentiable(logit_var)
        return logprobs, entropy, logit_var

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logprobs, grad_entropy, _grad_logit_var):
        device_type = ctx.saved_tensors[0].device.type
        with torch.autocast(device_type=device_type, enabled=False):
            return _ChunkedTokenLogprobs._backward(ctx, grad_logprobs, grad_entropy)

    @staticmethod
    def _backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, targets, log_normalizer, entropy, threshold = ctx.saved_tensors
        if not ctx.with_entropy:
            grad_entropy = None
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None, None, None, None, None
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        compute_hidden, compute_weight = _common_dtype(hidden, weight)
        grad_hidden = torch.empty_like(compute_hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            grad_logits = _grad_logits_chunk(
                compute_hidden[rows],
                compute_weight,
                targets[rows],
                ctx.temperature,
                log_normalizer[rows],
                entropy[rows] if ctx.with_entropy else entropy,
                threshold[rows] if ctx.truncated else None,
                grad_logprobs[rows] if grad_logprobs is not None else None,
                grad_entropy[rows] if grad_entropy is not None else None,
            )
            if need_hidden:
                grad_hidden[rows] = grad_logits.to(compute_weight.dtype) @ compute_weight
            if need_weight:
                grad_weight.addmm_(grad_logits.t(), hidden[rows].float())
            del grad_logits  # free this chunk's buffer before the next one is allocated
        grad_hidden = grad_hidden.to(hidden.dtype) if need_hidden else None
        grad_weight = grad_weight.to(weight.dtype) if need_weight else None
        return grad_hidden, grad_weight, None, None, None, None, None, None


def token_logprobs_from_hidden(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    target_ids: torch.Tensor,
    *,
    chunk_size: int = 1024,
    temperature: float = 1.0,
    truncation: Truncation = _NO_TRUNCATION,
    return_entropy: bool = False,
    logit_var_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(truncate(hidden @ W^T / temperature))[target] per token, computed chunk by chunk.

    Equal (to fp32 rounding) to ``token_logprobs_from_logits(hidden @ W.T, ...)`` in value and gradient, but
    the [B*T, V] logits never exist at once: peak extra memory is two chunk_size x V fp32 buffers in forward
    and backward. Differentiable in ``hidden`` and ``lm_head_weight`` (a custom autograd function that
    recomputes each chunk's logits in backward; double backward is not supported). The LM-head matmul runs
    outside autocast, in the common dtype of ``hidden`` and ``lm_head_weight`` (fp32 master weights give an
    fp32 matmul even under bf16 autocast: precise log-probs, identical in forward and backward).

    Args:
        hidden: [B, T, H] final hidden states (after the final norm); ``hidden[:, t]`` must be the state that
            predicts ``target_ids[:, t]`` (for a causal LM, the position before the target).
        lm_head_weight: [V, H] LM head (output embedding) weight, no bias; with tied embeddings pass the input
            embedding weight and its gradient accumulates as usual.
        target_ids: [B, T] int token ids in [0, V).
        chunk_size: tokens per chunk (>= 1); peak extra memory ~ 2 x chunk_size x V x 4 bytes (+ an fp32 [V, H]
            weight gradient).
        temperature: sampling temperature (> 0) the logits are divided by.
        truncation: min-p / top-k / top-p of the sampling (:mod:`mugrpo.policy.truncation`): sums run over the kept set,
            rebuilt per token from these logits (plus the target); one fp32 threshold per token is kept for backward.
            top-p takes each token's top-256 / top-4096 logits, or sorts the whole row when those hold less than
            top_p of the mass (then ~3 more chunk_size x V buffers at peak); top-k and min-p need no sort.
        return_entropy: also return per-token entropy of the (truncated) tempered distribution (differentiable too).
        logit_var_out: a [B, T] fp32 tensor to fill with each token's variance of the raw (untempered) logits over
            the whole vocabulary (population variance, detached), read off the chunks the log-softmax already
            builds: no extra forward pass. The health panel's ``logit_var`` (arXiv 2609.11956: rising logit
            variance precedes collapse under many updates on static data). None: not computed.

    Returns:
        (logprobs [B, T] fp32, entropy [B, T] fp32 in nats or None).

    Raises:
        ValueError: bad shapes, chunk size, temperature, or a target id outside [0, V) (checking it syncs the
            device once per call).
    """
    _check_temperature(temperature)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if hidden.dim() != 3 or lm_head_weight.dim() != 2 or hidden.shape[-1] != lm_head_weight.shape[-1]:
        raise ValueError(
            f"expected hidden [B, T, H] and lm_head_weight [V, H], got {tuple(hidden.shape)} and "
            f"{tuple(lm_head_weight.shape)}"
        )
    if target_ids.shape != hidden.shape[:2]:
        raise ValueError(f"target_ids has shape {tuple(target_ids.shape)}, expected {tuple(hidden.shape[:2])}")
    batch, tokens, width = hidden.shape
    targets = target_ids.reshape(-1).long()
    vocab = lm_head_weight.shape[0]
    if targets.numel():
        low, high = int(targets.min()), int(targets.max())
        if low < 0 or high >= vocab:
            raise ValueError(f"target_ids must lie in [0, {vocab}), got min {low}, max {high}")
    flat_hidden = hidden.reshape(batch * tokens, width)
    with_var = logit_var_out is not None
    if with_var and logit_var_out.shape != target_ids.shape:
        raise ValueError(f"logit_var_out has shape {tuple(logit_var_out.shape)}, expected {tuple(target_ids.shape)}")
    logprobs, entropy, logit_var = _ChunkedTokenLogprobs.apply(
        flat_hidden, lm_head_weight, targets, chunk_size, temperature, truncation, return_entropy, with_var
    )
    if with_var:
        logit_var_out.copy_(logit_var.view(batch, tokens))
    return logprobs.view(batch, tokens), entropy.view(batch, tokens) if return_entropy else None
