"""Aggregation of per-token losses into one scalar (the ``agg_mode`` of a policy loss).

Every mode is ``numerator / normalizer``. The numerator is a sum over this micro-batch; the normalizer comes
from
``LossContext`` when it carries global counts for the whole optimizer update, else from this micro-batch. With
global counts, the micro-batch losses of an update sum to the loss of the whole update, so gradients do not
depend on micro-batching or data-parallel sharding.
"""

from __future__ import annotations

from collections.abc import Callable

from mugrpo.common.lazy import torch
from mugrpo.losses.interface import LossContext

# (values [B, T] zero outside the mask, response_mask [B, T] bool, context) -> (scalar, used global counts?)
AggregationFn = Callable[["torch.Tensor", "torch.Tensor", LossContext], "tuple[torch.Tensor, bool]"]
AGGREGATIONS: dict[str, AggregationFn] = {}


def _register(name: str) -> Callable[[AggregationFn], AggregationFn]:
    def add(fn: AggregationFn) -> AggregationFn:
        AGGREGATIONS[name] = fn
        return fn

    return add


def _num_seqs(mask: torch.Tensor, context: LossContext) -> tuple[torch.Tensor | float, bool]:
    if context.global_num_seqs is not None:
        return context.global_num_seqs, True
    return mask.any(dim=-1).sum().clamp_min(1), False


@_register("token-mean")
def _token_mean(values: torch.Tensor, mask: torch.Tensor, context: LossContext) -> tuple[torch.Tensor, bool]:
    """sum_{i,t} l_it / N_tokens (DAPO, arXiv 2503.14476, token-level loss)."""
    if context.global_num_tokens is not None:
        return values.sum() / context.global_num_tokens, True
    return values.sum() / mask.sum().clamp_min(1), False


@_register("seq-mean-token-mean")
def _seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor, context: LossContext) -> tuple[torch.Tensor, bool]:
    """(1/N_seqs) sum_i (1/|o_i|) sum_t l_it (GRPO, arXiv 2402.03300, Eq. 3)."""
    per_seq = values.sum(dim=-1) / mask.sum(dim=-1).clamp_min(1)
    num_seqs, is_global = _num_seqs(mask, context)
    return per_seq.sum() / num_seqs, is_global


@_register("seq-mean-token-sum")
def _seq_mean_token_sum(values: torch.Tensor, mask: torch.Tensor, context: LossContext) -> tuple[torch.Tensor, bool]:
    """(1/N_seqs) sum_i sum_t l_it."""
    num_seqs, is_global = _num_seqs(mask, context)
    return values.sum() / num_seqs, is_global


@_register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(
    values: torch.Tensor, mask: torch.Tensor, context: LossContext
) -> tuple[torch.Tensor, bool]:
    """(1/N_seqs) sum_i sum_t l_it / L_max (Dr. GRPO, arXiv 2503.20783: constant normalizer)."""
    num_seqs, is_global = _num_seqs(mask, context)
    max_len = context.max_response_len if context.max_response_len is not None else mask.shape[-1]
    return values.sum() / (num_seqs * max_len), is_global


def aggregate_token_values(
    values: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    context: LossContext | None = None,
) -> tuple[torch.Tensor, bool]:
    """Reduce per-token values to a scalar.

    Args:
        values: [B, T] float per-token values (e.g. losses); entries outside ``response_mask`` are ignored,
            even if they are NaN/inf.
        response_mask: [B, T] bool, True on response tokens. It sets the normalizers (token and sequence
            counts); a token whose loss was vetoed should be passed with value 0 and mask True.
        mode: one of :data:`AGGREGATIONS` (token-mean, seq-mean-token-mean, seq-mean-token-sum,
            seq-mean-token-sum-norm).
        context: optional global counts (``global_num_tokens``, ``global_num_seqs``, ``max_response_len``).

    Returns:
        (scalar tensor, whether the normalizer came from global counts). An all-masked batch gives 0.

    Raises:
        ValueError: unknown ``mode``.
    """
    try:
        fn = AGGREGATIONS[mode]
    except KeyError:
        raise ValueError(f"unknown agg_mode {mode!r}; known: {', '.join(sorted(AGGREGATIONS))}") from None
    values = torch.where(response_mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return fn(values, response_mask, context or LossContext())
