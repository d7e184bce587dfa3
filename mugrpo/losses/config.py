"""Configuration of a policy loss (one pydantic model shared by every registered loss)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
VetoScope = Literal["trigger", "suffix", "non_trigger_suffix", "sequence"]
KLEstimator = Literal["k1", "k2", "k3"]
PositiveRule = Literal["correctness", "reward_threshold"]


class PolicyLossConfig(BaseModel):
    """Hyper-parameters of a policy loss; ``name`` selects the loss from the registry.

    Unpublished choices (docs/papers.md, "Mu-GRPO" and "ConSPO") and how they are settled here:

    * ``veto_delta``: Mu-GRPO (arXiv 2605.17570) gives rho < 1e-4 only as an example; 1e-4 is the default.
    * ``veto_scope``: the paper compares four scopes and reports that suffix (S_kappa), non-trigger suffix
      (H_kappa) and whole sequence (S_seq) are stable while trigger-only (T) still collapses; it does not say
      which scope its headline runs use. Default ``"suffix"``.
    * The suffix S_kappa is read literally as "all tokens after kappa, exclusive": the first trigger itself
      stays in the loss. Its gradient is rho * A * grad(log pi) with rho < delta, i.e. at most delta * |A| per
      unit of grad(log pi), so masking it or not changes the gradient by a negligible amount.
    * Vetoed tokens contribute zero loss but stay in the normalizer of the aggregation, so the normalizer is
      known before the forward pass and global counts (``LossContext.global_num_tokens``) stay exact.
    * ConSPO (arXiv 2605.12969) is silent on group size, batch size, KL and aggregation across groups: the loss
      is the mean over the update's valid groups (``LossContext.global_num_valid_groups``), the KL term is the
      same optional ``kl_coef`` term as for the other losses, and a positive is chosen by ``positive_rule``
      (docs/algorithms/conspo.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        default="mu_grpo",
        description="Registry key of the policy loss: grpo (PPO/GRPO clipped surrogate), mu_grpo (Mu-GRPO "
        "relaxed clipping + negative-advantage veto, arXiv 2605.17570), gspo (sequence-level ratio, "
        "arXiv 2507.18071), conspo (group InfoNCE over length-normalized sequence log-probs with a cosine "
        "margin, arXiv 2605.12969; needs train.group_minibatches), agpo (clipped surrogate with a per-group clip range "
        "from AGPO's controller, arXiv 2605.20722; needs the agpo section), or any loss registered with "
        "@POLICY_LOSSES.register. Stale-data corrections (docs/algorithms/stale-corrections.md): seq_is "
        "(truncated sequence-level importance sampling), seq_snis (self-normalised sequence IS), geo_mask (SkyRL's "
        "geometric sequence mask), icepop (IcePop / masked IS token mask, arXiv 2510.18855), m2po (second-moment "
        "token mask, arXiv 2510.01161), a3po (decoupled PPO with an interpolated proximal policy, arXiv 2512.06547).",
    )
    eps_low: float = Field(
        default=0.2,
        ge=0.0,
        lt=1.0,
        description="Lower clip range of grpo/gspo: ratio clipped below at 1 - eps_low (PPO, arXiv 1707.06347; "
        "GRPO, arXiv 2402.03300). GSPO's paper uses 3e-4 for its sequence-level ratio.",
    )
    eps_high: float = Field(
        default=0.2,
        ge=0.0,
        description="Upper clip range of grpo/gspo: ratio clipped above at 1 + eps_high. eps_high > eps_low is "
        "DAPO's clip-higher (arXiv 2503.14476, 0.28 vs 0.2). GSPO's paper uses 4e-4.",
    )
    ratio_min: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Lower bound of Mu-GRPO's relaxed clip range (arXiv 2605.17570: [0, 5]); 0 means the ratio "
        "is never clipped from below.",
    )
    ratio_max: float = Field(
        default=5.0,
        ge=1.0,
        description="Upper bound of Mu-GRPO's relaxed clip range (arXiv 2605.17570: [0, 5], vs PPO's 1.2).",
    )
    dual_clip_c: float | None = Field(
        default=None,
        gt=1.0,
        description="Dual-clip constant c > 1 (Ye et al. 2020, arXiv 1912.09729): for A < 0 the per-token loss "
        "is capped at -c * A, bounding the push-down of tokens with a huge ratio. None disables it. The replay "
        "buffer re-implementation (docs/papers.md) uses c = 10. Applies to grpo and mu_grpo.",
    )
    veto_enabled: bool | None = Field(
        default=None,
        description="Negative-advantage veto of Mu-GRPO (arXiv 2605.17570). None means the loss's own default: "
        "on for mu_grpo, off for grpo (True gives the 'GRPO + veto' ablation). gspo is sequence-level and "
        "rejects True.",
    )
    veto_delta: float = Field(
        default=1e-4,
        gt=0.0,
        lt=1.0,
        description="Trigger threshold delta of the veto: a token of an A < 0 response with importance ratio "
        "rho_t < delta is a trigger (arXiv 2605.17570 gives 1e-4 as an example; the exact value is unpublished).",
    )
    veto_scope: VetoScope = Field(
        default="suffix",
        description="Tokens the veto removes (arXiv 2605.17570): trigger (T: trigger tokens only; the paper finds "
        "it still collapses), suffix (S_kappa: tokens after the first trigger kappa, kappa excluded), "
        "non_trigger_suffix (H_kappa = S_kappa minus triggers), sequence (S_seq: the whole response). The paper "
        "reports suffix and non-trigger suffix both stable and does not say which it used.",
    )
    agg_mode: AggMode = Field(
        default="token-mean",
        description="How per-token losses become a scalar: token-mean (DAPO, arXiv 2503.14476; Mu-GRPO's "
        "token-mean over unmasked tokens), seq-mean-token-mean (GRPO, arXiv 2402.03300; GSPO's sequence "
        "objective), seq-mean-token-sum, seq-mean-token-sum-norm (Dr. GRPO, arXiv 2503.20783: token sum over a "
        "constant max_response_len).",
    )
    kl_coef: float = Field(
        default=0.0,
        ge=0.0,
        description="Coefficient of the KL penalty to a reference policy (GRPO, arXiv 2402.03300). 0 skips it "
        "entirely (no reference log-probs needed); DAPO and Dr. GRPO drop it.",
    )
    kl_agg_mode: AggMode | None = Field(
        default=None,
        description="Aggregation of the KL penalty's per-token values; None = agg_mode. AGPO's released code "
        "(arXiv 2605.20722) takes the token-mean over all response tokens of the batch while its surrogate is "
        "seq-mean-token-mean.",
    )
    kl_estimator: KLEstimator = Field(
        default="k3",
        description="Per-token estimator of KL(pi_theta || pi_ref) (Schulman 2020, 'Approximating KL "
        "divergence'): k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r with r = pi_ref / pi_theta. GRPO "
        "uses k3.",
    )
    tis_cap: float | None = Field(
        default=None,
        gt=0.0,
        description="Truncated importance sampling cap C for the sampler-vs-trainer mismatch (Yao et al. 2025, "
        "'Your efficient RL framework secretly brings you off-policy RL training'): the importance ratio uses the "
        "trainer's recomputed behavior log-probs and each token's loss is weighted by "
        "min(pi_behav_trainer / pi_behav_sampler, C). None disables it. Needs "
        "LossContext.trainer_behavior_logprobs.",
    )

    conspo_tau: float = Field(
        default=10.0,
        gt=0.0,
        description="ConSPO temperature tau (arXiv 2605.12969: 10): the group InfoNCE compares scores s/tau and "
        "the loss is scaled by tau.",
    )
    conspo_margin: float = Field(
        default=0.01,
        ge=0.0,
        description="ConSPO maximum margin M (arXiv 2605.12969: 0.01) subtracted from each positive's score: "
        "m_t = (M/2)(1 - cos(pi min(lambda_t/alpha, 1))), lambda_t = updates done / the run's total updates.",
    )
    conspo_margin_alpha: float = Field(
        default=0.3,
        gt=0.0,
        le=1.0,
        description="ConSPO margin ramp alpha (arXiv 2605.12969: 0.3): the margin rises from 0 to M over the "
        "first alpha of training (cosine), then stays at M.",
    )
    positive_rule: PositiveRule = Field(
        default="correctness",
        description="Which responses are positives for ConSPO (arXiv 2605.12969: verified-correct responses). "
        "correctness: the math_correctness reward component equals 1 (the paper's rule); reward_threshold "
        "(our choice, for policies that are almost never correct, e.g. SmolLM2-135M on GSM8K): total reward "
        ">= positive_threshold. The label is computed from each rollout row when the trainer loads it.",
    )
    positive_threshold: float | None = Field(
        default=None,
        description="Total-reward threshold of positive_rule=reward_threshold (a response with reward >= it is a "
        "positive); required by that rule and rejected by the other.",
    )

    seq_is_cap: float | None = Field(
        default=2.0,
        gt=0.0,
        description="Truncation C of seq_is's sequence weight w_i = min(exp(sum_t log rho_it), C) (sequence-level "
        "truncated IS, Yao et al. 2025; default 2.0: the upper IS threshold of verl's and ms-swift's rollout "
        "correction). None: untruncated.",
    )
    geo_mask_low: float = Field(
        default=0.99,
        gt=0.0,
        le=1.0,
        description="Lower bound of geo_mask's band: a response with geometric-mean token ratio "
        "exp(mean_t log rho_t) < it is dropped (SkyRL's off-policy correction, sequence_mask_metric=geometric, "
        "documented default 0.99).",
    )
    geo_mask_high: float = Field(
        default=1.01,
        ge=1.0,
        description="Upper bound of geo_mask's band: a response with geometric-mean token ratio > it is dropped "
        "(SkyRL's documented default 1.01).",
    )
    icepop_low: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="Lower bound alpha of icepop's token band: a token with ratio rho_t < alpha gets no gradient "
        "(IcePop, Ring-1T, arXiv 2510.18855; masked IS lower threshold 1/2.0 = 0.5 of verl and ms-swift).",
    )
    icepop_high: float = Field(
        default=2.0,
        ge=1.0,
        description="Upper bound beta of icepop's token band: a token with ratio rho_t > beta gets no gradient "
        "(IcePop, arXiv 2510.18855; masked IS threshold 2.0 of verl and ms-swift).",
    )
    m2po_tau: float = Field(
        default=0.04,
        gt=0.0,
        description="M2PO's second-moment threshold tau_M2 (arXiv 2510.01161; 0.04 as in AReaL's M2PO example "
        "config, m2_threshold: 0.04): the tokens of largest (log rho_t)^2 are dropped until the mean over the kept "
        "tokens of the batch is below it.",
    )
    m2po_behavior_weight_cap: float | None = Field(
        default=None,
        gt=0.0,
        description="M2PO (arXiv 2510.01161): also drop the tokens whose importance ratio pi_theta / pi_behav "
        "exceeds it, on top of the second-moment mask (AReaL's M2PO example trains with behav_imp_weight_cap: 5.0). "
        "None: no cap.",
    )
    a3po_weight_cap: float | None = Field(
        default=5.0,
        gt=1.0,
        description="A-3PO (arXiv 2512.06547): tokens whose behavior importance weight pi_prox / pi_behav exceeds "
        "it get no gradient (decoupled PPO's behavior-weight cap; 5.0 as AReaL's decoupled-loss example configs, "
        "behav_imp_weight_cap: 5.0). None: no cap.",
    )

    @model_validator(mode="after")
    def _check_clip_ranges(self) -> PolicyLossConfig:
        if self.ratio_min >= self.ratio_max:
            raise ValueError(f"ratio_min ({self.ratio_min}) must be < ratio_max ({self.ratio_max})")
        if self.positive_rule == "reward_threshold" and self.positive_threshold is None:
            raise ValueError("positive_rule=reward_threshold needs positive_threshold (e.g. 0.5)")
        if self.positive_rule != "reward_threshold" and self.positive_threshold is not None:
            raise ValueError(
                f"positive_threshold={self.positive_threshold} is only used with positive_rule=reward_threshold "
                f"(positive_rule is {self.positive_rule!r})"
            )
        return self
