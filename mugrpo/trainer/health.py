"""The health panel of an update: how far the learner's pi_theta has moved from the sampler q that drew the tokens,
plus the update's step size in staleness units and its batch identity (``train_steps`` columns, schema v4).

Per response token t of the update, w_t = pi_theta(y_t) / q(y_t), with q the sampler's tempered, truncated
distribution as the engine reported it (``TokenBatch.sampler_logprobs``), never the stage-start recompute that
``train.recompute_behavior_logprobs`` puts into the loss: a ratio against the learner's own recompute is 1 at the
stage's first update by construction and hides any engine-vs-trainer mismatch.

- ``ess`` = (sum_t w_t)^2 / (N sum_t w_t^2), in (0, 1]: normalized effective sample size of the importance weights
  (Kong 1992; VCPO, arXiv 2602.17616, finds that its fall predicts collapse).
- ``kl_sampler`` = mean_t k3(w_t), k3(w) = (w - 1) - log w (Schulman 2020, "Approximating KL divergence"): an
  estimate of KL(q || pi_theta) from tokens sampled from q. k3 is unbiased there (E_q[w] = 1), never negative
  per token, and of lower variance than k1 = -log w, whose per-token values are negative half the time.
- ``sampler_ratio_p1`` / ``_p99`` / ``_max``: 1st / 99th percentile (linear interpolation) and max of w.
- ``sampler_clip_frac``: fraction of tokens with w outside the loss's clip range
  (:func:`mugrpo.losses.loss_clip_range`); None for a loss without one.
- ``logit_var``: mean over tokens of the variance of the raw logits over the vocabulary (arXiv 2609.11956: it
  rises before collapse under many updates on static data), read off the chunked log-softmax.

Exact over micro-batches and data-parallel ranks: each micro-batch contributes its per-token (log w, logit
variance, outside-clip) rows, the rows of all micro-batches and ranks are gathered (a few thousand floats per update
at this scale) and every statistic is computed once on the whole update's tokens, so the values do not depend on
how the minibatch is cut.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from accelerate import Accelerator

from mugrpo.losses import PolicyLossConfig, loss_clip_range
from mugrpo.trainer.batch import TokenBatch
from mugrpo.trainer.data import Rollout
from schemas.tables import TRAIN_STEP_V4_COLUMNS, rollout_key
from schemas.tables import batch_identity as keys_identity

#: The panel's train_steps columns computed from the update's tokens (``s_eta``, ``t_eta``, ``batch_id`` apart).
TOKEN_PANEL_COLUMNS = tuple(c for c in TRAIN_STEP_V4_COLUMNS if c not in ("s_eta", "t_eta", "batch_id"))


def token_health_rows(
    batch: TokenBatch, logprobs: torch.Tensor, logit_var: torch.Tensor, loss_config: PolicyLossConfig
) -> torch.Tensor:
    """One micro-batch's per-token health rows.

    Args:
        batch: the micro-batch (``sampler_logprobs``, ``response_mask``, ``inputs``).
        logprobs: [B, R] log pi_theta of the response tokens at the learner temperature (detached here).
        logit_var: [B, R] raw-logit variance over the vocabulary of each token.
        loss_config: the policy loss (its clip range, :func:`mugrpo.losses.loss_clip_range`).

    Returns:
        [N, 3] float64 on the batch's device, N = response tokens: (log w, logit variance, 1.0 when w lies outside
        the clip range else 0.0, NaN when the loss has no clip range).
    """
    mask = batch.response_mask
    log_w = logprobs.detach().double() - batch.sampler_logprobs.double()
    bounds = loss_clip_range(loss_config, batch.inputs)
    if bounds is None:
        outside = torch.full_like(log_w, math.nan)
    else:
        low, high = (b.double().unsqueeze(-1) if isinstance(b, torch.Tensor) else b for b in bounds)
        w = log_w.exp()
        outside = ((w < low) | (w > high)).double()
    return torch.stack([log_w[mask], logit_var.detach().double()[mask], outside[mask]], dim=-1)


def gather_rows(accelerator: Accelerator, rows: torch.Tensor) -> torch.Tensor:
    """All ranks' [N_r, C] rows concatenated in rank order (a collective with several processes)."""
    if accelerator.num_processes == 1:
        return rows
    count = torch.tensor([rows.shape[0]], device=rows.device)
    counts = accelerator.gather(count).tolist()
    padded = accelerator.pad_across_processes(rows, dim=0)
    gathered = accelerator.gather(padded).view(accelerator.num_processes, -1, rows.shape[1])
    return torch.cat([gathered[r, :n] for r, n in enumerate(counts)])


def health_panel(rows: torch.Tensor) -> dict[str, float | None]:
    """The token panel of an update from its [N, 3] rows (:func:`token_health_rows`, all micro-batches and ranks).

    Returns:
        ``TOKEN_PANEL_COLUMNS`` -> value; every value None when N = 0, ``sampler_clip_frac`` None when the loss
        has no clip range.
    """
    if rows.shape[0] == 0:
        return dict.fromkeys(TOKEN_PANEL_COLUMNS)
    log_w, logit_var, outside = rows[:, 0].double(), rows[:, 1].double(), rows[:, 2].double()
    w = log_w.exp()
    scaled = (log_w - log_w.max()).exp()  # ESS is scale-invariant: no overflow for a huge ratio
    ess = scaled.sum() ** 2 / (scaled.numel() * (scaled * scaled).sum())
    quantiles = torch.quantile(w, torch.tensor([0.01, 0.99], dtype=torch.float64, device=w.device))
    return {
        "ess": float(ess),
        "kl_sampler": float(((w - 1.0) - log_w).mean()),
        "sampler_ratio_p1": float(quantiles[0]),
        "sampler_ratio_p99": float(quantiles[1]),
        "sampler_ratio_max": float(w.max()),
        "sampler_clip_frac": None if bool(outside.isnan().any()) else float(outside.mean()),
        "logit_var": float(logit_var.mean()),
    }


def batch_identity(rollouts: Iterable[Rollout]) -> str:
    """``batch_id`` of an update (:func:`schemas.tables.batch_identity` of its rollouts' row keys)."""
    return keys_identity(rollout_key(r.stage, r.prompt_id, r.sample_idx) for r in rollouts)
