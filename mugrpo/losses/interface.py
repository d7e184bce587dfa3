"""The explicit I/O of a policy loss: optional context in, loss + reducible metrics out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from mugrpo.common.lazy import torch
from mugrpo.losses.config import PolicyLossConfig
from mugrpo.losses.metrics import MetricStat, merge_stats


@dataclass(frozen=True)
class LossContext:
    """Optional inputs of a policy loss beyond the four core tensors (all fields may be None).

    Attributes:
        global_num_tokens: response tokens (summed ``response_mask``) of the whole optimizer update, over all
            micro-batches and data-parallel ranks. Used by ``token-mean``; with it, summing the micro-batch
            losses gives the loss of the whole update regardless of how it was split.
        global_num_seqs: non-empty responses of the whole update (rows with at least one response token).
            Used by the ``seq-mean-*`` modes, for the same reason.
        max_response_len: the constant token normalizer of ``seq-mean-token-sum-norm`` (Dr. GRPO,
            arXiv 2503.20783: the generation budget). Defaults to the padded length T of the batch, which
            varies with padding: set it to the sampler's max_tokens.
        ref_logprobs: [B, T] log-probs of the reference policy; required when ``kl_coef > 0``.
        entropy: [B, T] per-token entropy of pi_theta (nats); only reported as a metric.
        trainer_behavior_logprobs: [B, T] the trainer's recomputation of the behavior policy's log-probs;
            required when ``tis_cap`` is set (truncated importance sampling).
        group_index: [B] int group id of each response (one prompt = one group). Used by group-wise losses
            (ConSPO, arXiv 2605.12969); the trainer never splits a group across micro-batches for them.
        progress: training progress lambda_t in [0, 1]: global updates done before this update / the run's total
            updates (ConSPO's margin schedule).
        inputs: the per-rollout inputs the loss declared (:func:`mugrpo.losses.requires`), by name: [B] tensors
            (e.g. ConSPO's ``positive`` labels, AGPO's ``clip_eps``) and the update statistics of rollout inputs
            as floats (e.g. ConSPO's ``num_valid_groups``); see :mod:`mugrpo.losses.inputs`. Read them with
            :meth:`input`.
    """

    global_num_tokens: float | None = None
    global_num_seqs: float | None = None
    max_response_len: int | None = None
    ref_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    trainer_behavior_logprobs: torch.Tensor | None = None
    group_index: torch.Tensor | None = None
    progress: float | None = None
    inputs: Mapping[str, torch.Tensor | float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("global_num_tokens", "global_num_seqs", "max_response_len"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"LossContext.{name} must be > 0 when given, got {value}")
        if self.progress is not None and not 0.0 <= self.progress <= 1.0:
            raise ValueError(f"LossContext.progress must lie in [0, 1], got {self.progress}")

    def input(self, name: str, loss: str = "this loss") -> torch.Tensor | float:
        """The per-rollout input (or update statistic) ``name``.

        Raises:
            ValueError: the context has no input ``name`` (``loss``'s declaration and its provider are named).
        """
        if name not in self.inputs:
            raise ValueError(
                f"{loss} needs the loss input {name!r} (LossContext.inputs has {sorted(self.inputs) or 'none'}): "
                "declare it with @requires(inputs=...) and register its provider (mugrpo.losses.inputs)"
            )
        return self.inputs[name]


@dataclass(frozen=True)
class LossOutput:
    """Result of a policy loss.

    Attributes:
        loss: scalar tensor to call ``backward()`` on (policy surrogate + ``kl_coef`` * KL penalty).
        stats: metric name -> :class:`MetricStat` (a detached total, a count and how to reduce them). Keeping
            totals and counts, not ratios, lets a trainer combine micro-batches and ranks exactly: see
            :func:`reduce_metrics`.
    """

    loss: torch.Tensor
    stats: dict[str, MetricStat] = field(default_factory=dict)

    @property
    def metrics(self) -> dict[str, torch.Tensor]:
        """Detached scalar value of each metric for this call alone."""
        return {name: stat.value() for name, stat in self.stats.items()}


def reduce_metrics(outputs: Iterable[LossOutput]) -> dict[str, torch.Tensor]:
    """Metric values of a whole optimizer update from the outputs of its micro-batches.

    Args:
        outputs: the :class:`LossOutput` of each micro-batch (on one rank; for several ranks, all-reduce the
            merged totals and counts first, see :class:`MetricStat`).

    Returns:
        name -> 0-d float64 tensor, e.g. ``clip_frac_high`` over all tokens of all micro-batches.
    """
    return {name: stat.value() for name, stat in merge_stats(out.stats for out in outputs).items()}


class PolicyLossFn(Protocol):
    """Signature every registered policy loss implements (docs/design.md, "Algorithms")."""

    def __call__(
        self,
        logprobs: torch.Tensor,
        behavior_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        config: PolicyLossConfig,
        *,
        context: LossContext | None = None,
    ) -> LossOutput: ...
