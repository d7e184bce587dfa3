"""Policy losses: pure tensor functions registered by name (docs/design.md, "Algorithms").

Usage::

    from mugrpo.losses import LossContext, PolicyLossConfig, compute_policy_loss

    out = compute_policy_loss(logprobs, behavior_logprobs, advantages, response_mask,
                              PolicyLossConfig(name="mu_grpo"),
                              context=LossContext(global_num_tokens=tokens_in_update))
    out.loss.backward()

Built-in losses: ``grpo``, ``mu_grpo``, ``gspo``, ``conspo``. An algorithm package may register its own loss
(:mod:`mugrpo.algorithms`): add one with ``@POLICY_LOSSES.register("name")``, and its own knobs
(``loss.<name>.*``) with ``@loss_section("name")`` on a pydantic model in the same module. A loss's per-rollout
inputs are declared by name (``@requires(inputs=...)``) and read from ``LossContext.inputs``
(:mod:`mugrpo.losses.inputs`).
"""

from mugrpo.losses import clipped, conspo, gspo, stale  # noqa: F401  (importing registers the built-in losses)
from mugrpo.losses.aggregation import AGGREGATIONS, aggregate_token_values
from mugrpo.losses.clipped import clipped_surrogate, grpo_loss, mu_grpo_loss
from mugrpo.losses.config import (
    LOSS_SECTIONS,
    AggMode,
    KLEstimator,
    LossSection,
    PolicyLossConfig,
    VetoScope,
    loss_section,
)
from mugrpo.losses.conspo import (
    CORRECTNESS_COMPONENT,
    PositiveLabeler,
    conspo_loss,
    count_valid_groups,
    margin_schedule,
    positive_labeler,
    sequence_scores,
    training_progress,
)
from mugrpo.losses.gspo import gspo_loss, sequence_log_ratio
from mugrpo.losses.inputs import ROLLOUT_INPUTS, RolloutInput, RowFn, UpdateStatFn, input_tensor
from mugrpo.losses.interface import LossContext, LossOutput, PolicyLossFn, reduce_metrics
from mugrpo.losses.kl import KL_ESTIMATORS, kl_estimate
from mugrpo.losses.metrics import MetricStat, merge_stats
from mugrpo.losses.pipeline import (
    PreparedBatch,
    TokenSurrogate,
    apply_veto,
    finalize_loss,
    finalize_sequence_loss,
    importance_ratio,
    prepare_batch,
)
from mugrpo.losses.registry import (
    POLICY_LOSSES,
    LossRequirements,
    check_trainer_settings,
    clip_range,
    compute_policy_loss,
    is_token_surrogate,
    loss_clip_range,
    loss_requirements,
    requires,
    row_inputs,
    token_surrogate,
)
from mugrpo.losses.veto import VETO_SCOPES, VetoInfo, negative_advantage_veto_mask

__all__ = [
    "CORRECTNESS_COMPONENT",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "LOSS_SECTIONS",
    "POLICY_LOSSES",
    "ROLLOUT_INPUTS",
    "VETO_SCOPES",
    "AggMode",
    "KLEstimator",
    "LossContext",
    "LossOutput",
    "LossRequirements",
    "LossSection",
    "MetricStat",
    "PolicyLossConfig",
    "PolicyLossFn",
    "PositiveLabeler",
    "PreparedBatch",
    "RolloutInput",
    "RowFn",
    "UpdateStatFn",
    "TokenSurrogate",
    "VetoInfo",
    "VetoScope",
    "aggregate_token_values",
    "apply_veto",
    "check_trainer_settings",
    "clipped_surrogate",
    "clip_range",
    "compute_policy_loss",
    "is_token_surrogate",
    "loss_clip_range",
    "conspo_loss",
    "count_valid_groups",
    "finalize_loss",
    "finalize_sequence_loss",
    "grpo_loss",
    "gspo_loss",
    "importance_ratio",
    "input_tensor",
    "kl_estimate",
    "loss_requirements",
    "loss_section",
    "margin_schedule",
    "merge_stats",
    "mu_grpo_loss",
    "negative_advantage_veto_mask",
    "positive_labeler",
    "prepare_batch",
    "reduce_metrics",
    "requires",
    "row_inputs",
    "token_surrogate",
    "sequence_log_ratio",
    "sequence_scores",
    "training_progress",
]
