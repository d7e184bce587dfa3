"""Truncated sampling (min-p, top-k, top-p) as one per-token logit threshold, shared by engine and trainer.

Why one module: the behavior log-probs stored with a rollout are log-probs of the distribution the engine ACTUALLY
sampled from, softmax(z / T) restricted to the kept tokens and renormalized (vLLM's ``processed_logprobs``). The
importance ratio pi_theta / pi_behav is unbiased only if the trainer computes pi_theta under the same truncation;
over the full softmax every ratio is scaled by the kept probability mass (0.951 measured at T = 0.7, top_p = 0.9
on the quick config). The same bias and fix are discussed in TRL (huggingface/trl#6789, #7269: "the full-vocabulary
mean equals the kept mass"), prime-rl (PrimeIntellect-ai/prime-rl#2601: replay top-k/top-p on the trainer side
against vLLM's processed log-probs) and vLLM's sampling-mask replay (vllm-project/vllm#49577; DeepSeek-V3.2's
"Keep Sampling Mask", arXiv 2512.02556 section 3.1).

Our choice (trainer-side recompute): the trainer rebuilds the kept set from ITS OWN tempered logits with the rule
below and renormalizes over it. With the policy unchanged (update 1 of a stage) the logits, hence the kept set and
the log-probs, equal the engine's, so the ratio is exactly 1. As the policy moves, the kept set moves with it (it
is the truncation pi_theta itself would apply), which is the prime-rl#2601 choice. The sampled token is always
kept (as in prime-rl#2601), so a token that drifted out of the current set still has a finite log-prob and its
ratio stays defined. Exact replay of the behavior kept set (vLLM#49577) would need the kept ids of every token in
the rollout table; not stored here.

The rule, in vLLM's order (v1 sampler: min-p is an argmax-invariant logits processor applied before top-k/top-p;
top-p is computed on the top-k-renormalized distribution):

1. min-p: keep z_v >= max(z) + log(min_p), i.e. p_v >= min_p * p_max;
2. top-k: keep z_v >= the k-th largest z (ties with the k-th value kept, as vLLM does);
3. top-p: over the tokens kept so far (renormalized), keep a token iff the probability of the tokens ranked above
   it is < top_p (vLLM: sorted ascending, drop while the cumulative probability up to and including the token is
   <= 1 - top_p: the same set, up to float rounding); the most likely token is always kept.

Each step keeps every token whose tempered logit is >= a per-row threshold, so the kept set is
``{v : z_v >= threshold}``; a tie at the top-p boundary keeps all tied tokens (vLLM's sort keeps some of them:
the only place where this rule and vLLM's can differ, by tokens of exactly equal logit).

Checked against vLLM 0.32's CPU sampler (``vllm/v1/sample/sampler.py``, ``ops/topk_topp_sampler.py``,
``logits_processor/builtin.py``; Triton is off on CPU, so the PyTorch path runs): temperature, then min-p
(``MinPLogitsProcessor``: masks p_v < min_p * p_max, computed in probability space where this rule compares
logits: the two differ only for a token within float rounding of the boundary, seen in vLLM runs as one token
in a few hundred off by log(1 + p_b / kept mass), docs/precision.md), then top-k (``apply_top_k_only``,
or the ascending sort when top-p is on: masks z_v < the k-th largest, ties kept), then top-p on the softmax of the
top-k survivors (ascending cumulative sum <= 1 - top_p masked, the largest always kept; the sort is not stable);
``processed_logprobs`` is the log-softmax of the masked logits. Measured (tests/integration/test_vllm_engine.py,
tiny policy, fp32, T = 1): the trainer's replay gives max |log ratio| 1.1e-5 (top-p 0.9), 6.7e-6 (top-k 20),
5.7e-6 (min-p 0.05) at update 1, over 192 tokens each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used, so configs can import Truncation cheaply
    import torch

__all__ = ["Truncation", "apply_truncation", "keep_mask", "truncation_threshold"]


@dataclass(frozen=True, slots=True)
class Truncation:
    """Sampling truncation of one row: ``top_p`` in (0, 1], ``top_k`` >= 0 (0 = off), ``min_p`` in [0, 1) (0 = off).

    Raises:
        ValueError: a value outside its range.
    """

    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")

    @property
    def active(self) -> bool:
        """Whether this truncation removes anything (False for top_p = 1, top_k = 0, min_p = 0)."""
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0


def truncation_threshold(scaled_logits: torch.Tensor, truncation: Truncation) -> torch.Tensor:
    """Per-row logit threshold of the kept set: token v is kept iff ``scaled_logits[r, v] >= threshold[r]``.

    Args:
        scaled_logits: [R, V] fp32 logits already divided by the temperature (no -inf rows).
        truncation: the min-p / top-k / top-p setting (module docstring, vLLM's order).

    Returns:
        [R] fp32 thresholds; ``-inf`` where nothing is truncated.
    """
    import torch

    rows, vocab = scaled_logits.shape
    threshold = scaled_logits.new_full((rows,), float("-inf"))
    if truncation.min_p > 0.0:
        threshold = scaled_logits.amax(dim=-1) + math.log(truncation.min_p)
    if 0 < truncation.top_k < vocab:
        kth = scaled_logits.topk(truncation.top_k, dim=-1, sorted=False).values.amin(dim=-1)
        threshold = torch.maximum(threshold, kth)
    if truncation.top_p < 1.0:
        masked = scaled_logits.masked_fill(scaled_logits < threshold.unsqueeze(-1), float("-inf"))
        threshold = torch.maximum(threshold, _top_p_threshold(masked, truncation.top_p))
    return threshold


_TOP_P_CANDIDATES = (256, 4096)
"""Candidate set sizes tried before a full sort of the vocabulary (a sort of 49k logits per token costs ~5 LM-head
matmuls on CPU; an LM's nucleus usually holds far fewer tokens)."""


def _top_p_threshold(masked: torch.Tensor, top_p: float) -> torch.Tensor:
    """Smallest kept logit of the top-p nucleus of softmax(masked), per row ([R, V] -> [R]).

    Rule (vLLM's, written in descending order): a token is kept iff the probability mass of the tokens ranked above
    it is < top_p; the most likely token is always kept. Rows are resolved from their top-k candidates (k = 256,
    then 4096) when those hold at least ``top_p`` of the mass, so the kept set lies among them; the others sort the
    whole row. Which path a row takes depends only on that row's logits.
    """
    import torch

    rows, vocab = masked.shape
    log_normalizer = torch.logsumexp(masked, dim=-1, keepdim=True)
    threshold = masked.new_empty(rows)
    pending = torch.arange(rows, device=masked.device)
    for k in (*[c for c in _TOP_P_CANDIDATES if c < vocab], vocab):
        values = masked[pending].topk(k, dim=-1, sorted=True).values  # descending
        mass_above = (values - log_normalizer[pending]).exp().cumsum(dim=-1)
        resolved = mass_above[:, -1] >= top_p if k < vocab else torch.ones_like(mass_above[:, -1], dtype=torch.bool)
        # kept: the mass strictly above the token is < top_p, i.e. the previous running sum
        kept = torch.cat([torch.zeros_like(mass_above[:, :1]), mass_above[:, :-1]], dim=-1) < top_p
        last_kept = kept.sum(dim=-1) - 1  # kept tokens are a prefix of the descending order
        row_threshold = values.gather(-1, last_kept.unsqueeze(-1)).squeeze(-1)
        threshold[pending[resolved]] = row_threshold[resolved]
        pending = pending[~resolved]
        if pending.numel() == 0:
            break
    return threshold


def keep_mask(
    scaled_logits: torch.Tensor, threshold: torch.Tensor, always_keep: torch.Tensor | None = None
) -> torch.Tensor:
    """[R, V] bool kept set ``scaled_logits >= threshold``, plus ``always_keep`` [R] token ids (the sampled token)."""
    keep = scaled_logits >= threshold.unsqueeze(-1)
    if always_keep is not None:
        keep.scatter_(-1, always_keep.long().unsqueeze(-1), True)
    return keep


def apply_truncation(
    scaled_logits: torch.Tensor, truncation: Truncation, always_keep: torch.Tensor | None = None
) -> torch.Tensor:
    """``scaled_logits`` with the tokens outside the kept set at -inf (a new tensor; the input if nothing is cut).

    Args:
        scaled_logits: [R, V] fp32 logits divided by the temperature.
        truncation: the min-p / top-k / top-p setting.
        always_keep: optional [R] token ids kept whatever their logit (the trainer passes the sampled tokens).

    Returns:
        [R, V] logits; ``log_softmax`` of it is the log-prob of the truncated, renormalized distribution.
    """
    if not truncation.active:
        return scaled_logits
    threshold = truncation_threshold(scaled_logits, truncation)
    return scaled_logits.masked_fill(~keep_mask(scaled_logits, threshold, always_keep), float("-inf"))
