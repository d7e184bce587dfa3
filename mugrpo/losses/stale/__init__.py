"""Stale-data corrections: one module per correction, each registered in the loss registry under its own
name, with its paper, equation and published defaults in its docstring and its knobs in ``PolicyLossConfig``.

- ``seq_is`` / ``seq_snis`` (:mod:`.seq_is`): one importance weight per response, the sequence likelihood ratio
  exp(sum_t log rho_t), truncated (``seq_is``) or self-normalised over the batch (``seq_snis``);
- ``geo_mask`` (:mod:`.geo_mask`): drop a response whose geometric-mean token ratio leaves [0.99, 1.01] (SkyRL);
- ``icepop`` (:mod:`.icepop`): drop the tokens whose ratio leaves [0.5, 2.0] (IcePop / masked IS);
- ``m2po`` (:mod:`.m2po`): drop the tokens of largest squared log-ratio until the batch's second moment is under
  tau_M2 = 0.04 (M2PO, arXiv 2510.01161).

A-3PO (arXiv 2512.06547) needs each rollout's staleness from the trainer, so it is an algorithm package,
:mod:`mugrpo.algorithms.a3po`. Every correction reports the same generic metrics (:mod:`.common`), so the run report
and ``mugrpo sql`` show whichever one ran without naming it.
"""

from mugrpo.losses.stale import geo_mask, icepop, m2po, seq_is  # noqa: F401  (importing registers the losses)
from mugrpo.losses.stale.common import (
    CLIPPED_FRAC,
    MASKED_FRAC,
    WEIGHT_MEAN,
    WEIGHT_SQ_MEAN,
    bounded_weight,
    correction_stats,
    effective_sample_size,
    masked_is_surrogate,
)
from mugrpo.losses.stale.m2po import m2po_keep_mask

__all__ = [
    "CLIPPED_FRAC",
    "MASKED_FRAC",
    "WEIGHT_MEAN",
    "WEIGHT_SQ_MEAN",
    "bounded_weight",
    "correction_stats",
    "effective_sample_size",
    "m2po_keep_mask",
    "masked_is_surrogate",
]
