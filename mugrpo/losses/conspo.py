"""ConSPO: contrastive sequence-level policy optimization (arXiv 2605.12969).

Each response o gets a score s(o) = (1/|o|) sum_t log pi_theta(o_t | q, o_<t) (no importance ratio). Within a group
with N+ > 0 positives (verified-correct responses) and N- > 0 negatives, every positive is classified against all
the negatives of its group by an InfoNCE with temperature tau and a margin m_t on the positive:

    loss_q = -tau * (1/N+) sum_i log_softmax([(s_i+ - m_t)/tau, s_1-/tau, ..., s_N--/tau])[0]

m_t = (M/2)(1 - cos(pi * min(lambda_t/alpha, 1))) with lambda_t the training progress. Groups that are all positive
or all negative carry no contrast and are discarded (counted in the metrics). The update's loss is the mean of
loss_q over its valid groups, normalized by the global count of valid groups (the update statistic
``num_valid_groups`` in ``LossContext.inputs``, known from the labels before the forward pass), so micro-batching
and data-parallel sharding change nothing as long as a group is never split (``train.group_minibatches``).

Labels come through the rollout rows: :class:`PositiveLabeler` turns a row's reward and reward components into a
bool when the trainer loads the rollouts (:func:`mugrpo.trainer.data.load_rollouts`), not inside the loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from mugrpo.common.lazy import torch
from mugrpo.losses.config import LossSection, PolicyLossConfig, loss_section
from mugrpo.losses.inputs import ROLLOUT_INPUTS, RolloutInput
from mugrpo.losses.interface import LossContext, LossOutput
from mugrpo.losses.metrics import MetricStat
from mugrpo.losses.pipeline import finalize_sequence_loss, prepare_batch
from mugrpo.losses.registry import POLICY_LOSSES, loss_requirements, requires

#: The reward component of the paper's positive rule: a verified-correct answer (math-verify).
CORRECTNESS_COMPONENT = "math_correctness"


PositiveRule = Literal["correctness", "reward_threshold"]


@loss_section("conspo")
class ConSPOConfig(LossSection):
    """ConSPO's own knobs (``loss.conspo.*``, arXiv 2605.12969)."""

    #: Flat keys of run.json files written before loss sections (loss.positive_rule) -> field.
    legacy_keys: ClassVar[dict[str, str]] = {
        "positive_rule": "positive_rule",
        "positive_threshold": "positive_threshold",
    }

    tau: float = Field(default=10.0, gt=0.0)
    """ConSPO temperature tau (arXiv 2605.12969: 10): the group InfoNCE compares scores s/tau and the loss is scaled
    by tau."""
    margin: float = Field(default=0.01, ge=0.0)
    """ConSPO maximum margin M (arXiv 2605.12969: 0.01) subtracted from each positive's score: m_t = (M/2)(1 -
    cos(pi min(lambda_t/alpha, 1))), lambda_t = updates done / the run's total updates."""
    margin_alpha: float = Field(default=0.3, gt=0.0, le=1.0)
    """ConSPO margin ramp alpha (arXiv 2605.12969: 0.3): the margin rises from 0 to M over the first alpha of
    training (cosine), then stays at M."""
    positive_rule: PositiveRule = Field(default="correctness")
    """Which responses are positives for ConSPO (arXiv 2605.12969: verified-correct responses). correctness: the
    math_correctness reward component equals 1 (the paper's rule); reward_threshold (our choice, for policies that
    are almost never correct, e.g. SmolLM2-135M on GSM8K): total reward >= positive_threshold. The label is computed
    from each rollout row when the trainer loads it."""
    positive_threshold: float | None = Field(default=None)
    """Total-reward threshold of positive_rule=reward_threshold (a response with reward >= it is a positive);
    required by that rule and rejected by the other."""

    @model_validator(mode="after")
    def _check_threshold(self) -> ConSPOConfig:
        if self.positive_rule == "reward_threshold" and self.positive_threshold is None:
            raise ValueError("positive_rule=reward_threshold needs positive_threshold (e.g. 0.5)")
        if self.positive_rule != "reward_threshold" and self.positive_threshold is not None:
            raise ValueError(
                f"positive_threshold={self.positive_threshold} is only used with positive_rule=reward_threshold "
                f"(positive_rule is {self.positive_rule!r})"
            )
        return self


# --- schedule -----------------------------------------------------------------------------------------------------


def training_progress(updates_done: int, total_updates: int) -> float:
    """lambda_t = updates done / the run's total updates, clamped to [0, 1].

    The trainer passes ``policy_version + u - 1`` for stage update u (the global updates completed before it), so
    the first update of a run has lambda = 0 and the last (T-1)/T. Both numbers are exact on resume (the
    checkpoint's step and the config's stage schedule), so every update gets the same lambda in a resumed run.
    A spec whose horizon ends before the update (``TrainSpec.total_updates`` set too small) gets 1, as the LR
    schedule does.

    Raises:
        ValueError: ``total_updates < 1`` or ``updates_done < 0``.
    """
    if total_updates < 1:
        raise ValueError(f"total_updates must be >= 1, got {total_updates}")
    if updates_done < 0:
        raise ValueError(f"updates_done must be >= 0, got {updates_done}")
    return min(updates_done / total_updates, 1.0)


def margin_schedule(progress: float, max_margin: float, alpha: float) -> float:
    """ConSPO's cosine margin (arXiv 2605.12969): m_t = (M/2)(1 - cos(pi rho_t)), rho_t = min(lambda_t/alpha, 1).

    Args:
        progress: lambda_t in [0, 1].
        max_margin: M >= 0 (paper: 0.01).
        alpha: ramp length in progress units, in (0, 1] (paper: 0.3).

    Returns:
        m_t in [0, M]: 0 at lambda = 0, M/2 at lambda = alpha/2, M from lambda = alpha on.

    Raises:
        ValueError: progress outside [0, 1] or alpha outside (0, 1].
    """
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"progress must lie in [0, 1], got {progress}")
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must lie in (0, 1], got {alpha}")
    rho = min(progress / alpha, 1.0)
    return 0.5 * max_margin * (1.0 - math.cos(math.pi * rho))


# --- labels -------------------------------------------------------------------------------------------------------

#: positive_rule -> fn(reward, reward_components, threshold) -> is positive.
POSITIVE_RULES: dict[str, Callable[[float, Mapping[str, float], float | None], bool]] = {
    "correctness": lambda reward, components, threshold: components[CORRECTNESS_COMPONENT] == 1.0,
    "reward_threshold": lambda reward, components, threshold: reward >= threshold,
}


@dataclass(frozen=True)
class PositiveLabeler:
    """Turns one rollout row into ConSPO's positive/negative label.

    Attributes:
        rule: ``correctness`` (the ``math_correctness`` component equals 1: the paper's verified-correct response)
            or ``reward_threshold`` (total reward >= ``threshold``; our choice for a policy that is almost never
            correct).
        threshold: the reward threshold of ``reward_threshold``.
    """

    rule: str
    threshold: float | None = None

    def __call__(self, row: Mapping[str, Any]) -> bool:
        """Label of a rollout row with a total ``reward`` and ``reward_components``.

        Raises:
            ValueError: the ``correctness`` rule and a row without a ``math_correctness`` component.
        """
        reward, components = float(row["reward"]), dict(row["reward_components"])
        if self.rule == "correctness" and CORRECTNESS_COMPONENT not in components:
            raise ValueError(
                f"positive_rule=correctness needs the reward component {CORRECTNESS_COMPONENT!r}, this row has "
                f"{sorted(components)}; add it to reward.components or use positive_rule=reward_threshold"
            )
        return bool(POSITIVE_RULES[self.rule](reward, components, self.threshold))

    def describe(self) -> str:
        """A stable text of the rule (part of the data fingerprint a checkpoint is checked against)."""
        return f"positive_rule={self.rule},positive_threshold={self.threshold}"


def positive_labeler(config: PolicyLossConfig) -> PositiveLabeler | None:
    """The labeler the data path applies to each rollout row, or None when ``config.name``'s loss reads no
    ``positive`` input."""
    if POSITIVE not in loss_requirements(config.name).inputs:
        return None
    return PositiveLabeler(config.conspo.positive_rule, config.conspo.positive_threshold)


def positive_labeler_of(config: PolicyLossConfig) -> PositiveLabeler:
    """The labeler of ``loss.conspo.positive_rule`` (the ``positive`` input's row function)."""
    return PositiveLabeler(config.conspo.positive_rule, config.conspo.positive_threshold)


def check_positive_rule(config: PolicyLossConfig, reward_components: Collection[str]) -> None:
    """Check that the run's rewards can label its rollouts by ``loss.conspo.positive_rule``.

    Raises:
        ValueError: ``positive_rule=correctness`` without the correctness reward component (naming both keys).
    """
    if config.conspo.positive_rule == "correctness" and CORRECTNESS_COMPONENT not in reward_components:
        raise ValueError(
            f"loss.conspo.positive_rule=correctness labels a response positive when its {CORRECTNESS_COMPONENT!r} "
            f"reward component is 1, but reward.components is {sorted(reward_components)}: add it, or use "
            "loss.conspo.positive_rule=reward_threshold with loss.conspo.positive_threshold"
        )


def count_valid_groups(group_index: Sequence[int], positive: Sequence[bool], nonempty: Sequence[bool]) -> int:
    """Groups with at least one positive and one negative non-empty response: ConSPO's normalizer.

    The trainer calls it on the whole update's rows (all micro-batches and ranks) before the forward pass.

    Raises:
        ValueError: the three sequences differ in length.
    """
    if not len(group_index) == len(positive) == len(nonempty):
        raise ValueError(f"lengths differ: {len(group_index)} groups, {len(positive)} labels, {len(nonempty)} flags")
    seen: dict[int, set[bool]] = {}
    for g, label, member in zip(group_index, positive, nonempty, strict=True):
        if member:
            seen.setdefault(int(g), set()).add(bool(label))
    return sum(1 for labels in seen.values() if len(labels) == 2)


#: ConSPO's per-rollout input: each response's positive/negative label, from its row by ``loss.conspo.positive_rule``,
#: with the update's count of valid groups (its loss normalizer) as the update statistic ``num_valid_groups``.
POSITIVE = "positive"
NUM_VALID_GROUPS = "num_valid_groups"
ROLLOUT_INPUTS.register(POSITIVE)(
    RolloutInput(
        dtype="bool",
        columns=("reward", "reward_components"),
        make=positive_labeler_of,
        update_stats={NUM_VALID_GROUPS: lambda labels, groups, nonempty: count_valid_groups(groups, labels, nonempty)},
        check=lambda config, components: check_positive_rule(config, components),
    )
)


# --- the loss -----------------------------------------------------------------------------------------------------


def sequence_scores(logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """s(o) = (1/|o|) sum_t log pi_theta(o_t | q, o_<t): the length-normalized sequence log-prob (arXiv 2605.12969).

    Args:
        logprobs: [B, T] token log-probs (differentiable), any value at padding.
        response_mask: [B, T] bool.

    Returns:
        [B] scores (0 for an empty response, which ConSPO leaves out of every group).
    """
    lengths = response_mask.sum(dim=-1).clamp_min(1)
    return torch.where(response_mask, logprobs, 0.0).sum(dim=-1) / lengths


@dataclass(frozen=True)
class GroupInfoNCE:
    """ConSPO's group InfoNCE on one micro-batch (all [B] unless noted).

    Attributes:
        loss_sum: scalar sum over valid groups of loss_q (differentiable).
        anchor: bool, positives of valid groups (the rows the InfoNCE classifies).
        num_valid_groups: scalar float, valid groups in the micro-batch.
        num_discarded_groups: scalar float, groups with responses that are all positive or all negative.
        score_gap_sum: scalar float, sum over valid groups of mean s+ - mean s- (detached).
        correct: bool, anchors whose score is above every negative of their group.
    """

    loss_sum: torch.Tensor
    anchor: torch.Tensor
    num_valid_groups: torch.Tensor
    num_discarded_groups: torch.Tensor
    score_gap_sum: torch.Tensor
    correct: torch.Tensor


def group_infonce(
    scores: torch.Tensor,
    positive: torch.Tensor,
    group_index: torch.Tensor,
    member: torch.Tensor,
    tau: float,
    margin: float,
) -> GroupInfoNCE:
    """Sum over the valid groups of the micro-batch of loss_q (see the module docstring), vectorized over a [B, B]
    same-group matrix (B is a micro-batch, so B^2 is small).

    Args:
        scores: [B] sequence scores s(o) (differentiable).
        positive: [B] bool labels.
        group_index: [B] int group ids; every group must be whole in this call.
        member: [B] bool, rows that take part (non-empty responses).
        tau: temperature > 0.
        margin: m_t >= 0, subtracted from each positive's score.
    """
    pos, neg = positive & member, ~positive & member
    same = (group_index.unsqueeze(1) == group_index.unsqueeze(0)) & member.unsqueeze(1) & member.unsqueeze(0)
    neg_of = same & neg.unsqueeze(0)  # [B, B]: j is a negative of i's group
    pos_of = same & pos.unsqueeze(0)
    n_pos, n_neg = pos_of.sum(-1), neg_of.sum(-1)
    valid = member & (n_pos > 0) & (n_neg > 0)
    anchor = pos & valid

    neg_logits = (scores / tau).unsqueeze(0).expand(len(scores), -1).masked_fill(~neg_of, float("-inf"))
    pos_logit = (scores - margin) / tau
    log_p = pos_logit - torch.logsumexp(torch.cat([pos_logit.unsqueeze(1), neg_logits], dim=1), dim=1)
    weight = anchor.to(scores.dtype) / n_pos.clamp_min(1).to(scores.dtype)  # 1/N+ on each anchor
    loss_sum = (torch.where(anchor, -tau * log_p, 0.0) * weight).sum()

    detached = scores.detach()
    mean_pos = (pos_of.to(detached.dtype) @ detached) / n_pos.clamp_min(1)
    mean_neg = (neg_of.to(detached.dtype) @ detached) / n_neg.clamp_min(1)
    best_neg = detached.unsqueeze(0).expand(len(scores), -1).masked_fill(~neg_of, float("-inf")).amax(-1)
    group_size = same.sum(-1).clamp_min(1).to(detached.dtype)
    return GroupInfoNCE(
        loss_sum=loss_sum,
        anchor=anchor,
        num_valid_groups=weight.detach().sum().round(),  # sum of N+ * (1/N+) per group
        num_discarded_groups=torch.where(member & ~valid, 1.0 / group_size, 0.0).sum().round(),
        score_gap_sum=(torch.where(anchor, mean_pos - mean_neg, 0.0) * weight.detach()).sum(),
        correct=anchor & (detached > best_neg),
    )


@POLICY_LOSSES.register("conspo")
@requires(whole_groups=True, inputs=(POSITIVE,))
def conspo_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """ConSPO's loss (arXiv 2605.12969): the mean over valid groups of the group InfoNCE with a cosine margin.

    loss = (1/N_valid) sum_q loss_q + kl_coef * KL, with N_valid = ``context.inputs["num_valid_groups"]`` (the
    whole update's valid groups; this call's valid groups when absent). There is no importance ratio:
    ``behavior_logprobs`` and ``advantages`` only feed the standard metrics (ratio, drift); clip and veto fractions
    are 0.

    Args:
        logprobs: [B, T] log pi_theta of the response tokens (requires grad).
        behavior_logprobs: [B, T] log pi_behav (metrics only).
        advantages: [B] or [B, T] (metrics only).
        response_mask: [B, T] bool, True on response tokens.
        config: ``conspo.tau``, ``conspo.margin``, ``conspo.margin_alpha``, ``kl_coef`` / ``kl_estimator`` /
            ``agg_mode`` (the KL term's aggregation).
        context: needs ``group_index`` [B], ``inputs["positive"]`` [B] bool and ``progress`` (lambda_t); optional
            ``inputs["num_valid_groups"]``, ``global_num_tokens`` (KL term), ``ref_logprobs``, ``entropy``.

    Returns:
        :class:`LossOutput` with the standard metrics plus ``conspo_valid_groups`` and
        ``conspo_discarded_groups`` (sums), ``conspo_score_gap`` (mean over valid groups of mean s+ - mean s-),
        ``conspo_infonce_acc`` (share of contrasted positives scoring above every negative of their group),
        ``conspo_margin`` (m_t) and ``conspo_progress`` (lambda_t).

    Raises:
        ValueError: a missing context field, mismatched shapes, ``veto_enabled=True`` or ``tis_cap`` set (both
            act on token importance ratios, which ConSPO does not have).
    """
    if config.veto_enabled:
        raise ValueError("veto_enabled=True: the negative-advantage veto acts on token ratios; conspo has none")
    if config.tis_cap is not None:
        raise ValueError("tis_cap is set: truncated importance sampling weights token ratios; conspo has none")
    missing = [n for n in ("group_index", "progress") if context is None or getattr(context, n) is None]
    if missing:
        raise ValueError(f"conspo needs LossContext.{', LossContext.'.join(missing)}")
    positive = context.input(POSITIVE, "loss.name=conspo")
    batch = prepare_batch(logprobs, behavior_logprobs, advantages, response_mask, config, context)
    ctx = batch.context
    margin = margin_schedule(ctx.progress, config.conspo.margin, config.conspo.margin_alpha)
    scores = sequence_scores(batch.logprobs, batch.response_mask)
    member = batch.response_mask.any(dim=-1)
    out = group_infonce(
        scores, positive.bool().to(scores.device), ctx.group_index.to(scores.device), member, config.conspo.tau, margin
    )
    if NUM_VALID_GROUPS in ctx.inputs:
        policy_loss, is_global = out.loss_sum / max(float(ctx.inputs[NUM_VALID_GROUPS]), 1.0), True
    else:
        policy_loss, is_global = out.loss_sum / out.num_valid_groups.clamp_min(1), False
    stats = {
        "conspo_valid_groups": MetricStat.scalar(out.num_valid_groups, "sum"),
        "conspo_discarded_groups": MetricStat.scalar(out.num_discarded_groups, "sum"),
        "conspo_score_gap": MetricStat(
            out.score_gap_sum.to(torch.float64), out.num_valid_groups.to(torch.float64), "mean"
        ),
        "conspo_infonce_acc": MetricStat.fraction(out.correct, out.anchor),
        "conspo_margin": MetricStat.scalar(margin, like=scores),
        "conspo_progress": MetricStat.scalar(ctx.progress, like=scores),
    }
    return finalize_sequence_loss(batch, policy_loss, is_global, config, stats)
