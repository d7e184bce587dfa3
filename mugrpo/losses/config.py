"""Configuration of a policy loss: the knobs every loss shares, plus one section per loss that has its own
(``loss.<name>.*``, registered in the loss's module with :func:`loss_section`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo

from mugrpo.common.registry import Registry

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
VetoScope = Literal["trigger", "suffix", "non_trigger_suffix", "sequence"]
KLEstimator = Literal["k1", "k2", "k3"]


class LossSection(BaseModel):
    """Base of a loss's own config section ``loss.<name>.*`` (:func:`loss_section`): frozen, no unknown key, each
    field described by the docstring below it (cite the paper there)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


S = TypeVar("S", bound=LossSection)

#: Each loss's own config section ``loss.<name>.*`` by name, registered in the loss's module with
#: ``@loss_section("name")`` on its pydantic model; :class:`PolicyLossConfig` carries one of each.
LOSS_SECTIONS: Registry[type[LossSection]] = Registry("loss section")


class PolicyLossConfig(BaseModel):
    """Hyper-parameters of a policy loss; ``name`` selects the loss from the registry.

    A loss's own knobs are in its section (``config.<name>.<key>``, e.g. ``loss.icepop.low``; :func:`loss_section`).

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
      same optional ``kl_coef`` term as for the other losses, and a positive is chosen by ``loss.conspo.positive_rule``
      (docs/algorithms/conspo.md).
    """

    model_config = ConfigDict(extra="allow", frozen=True)  # the extras are the loss sections (_compose_sections)

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

    @model_validator(mode="after")
    def _check_clip_ranges(self) -> PolicyLossConfig:
        if self.ratio_min >= self.ratio_max:
            raise ValueError(f"ratio_min ({self.ratio_min}) must be < ratio_max ({self.ratio_max})")
        return self

    @model_validator(mode="before")
    @classmethod
    def _compose_sections(cls, data: Any) -> Any:
        return compose_sections(data, set(cls.model_fields)) if isinstance(data, dict) else data

    @classmethod
    def section_fields(cls) -> dict[str, FieldInfo]:
        """One field per registered loss section (``loss.<name>.*``), as the config reference and the resume diff
        read them beside ``model_fields``."""
        return {
            name: FieldInfo(
                annotation=LOSS_SECTIONS[name],
                default_factory=LOSS_SECTIONS[name],
                description=(LOSS_SECTIONS[name].__doc__ or "").strip().splitlines()[0],
            )
            for name in LOSS_SECTIONS
        }

    def section(self, name: str) -> BaseModel:
        """The section ``loss.<name>`` (its defaults where this config was built before it was registered).

        Raises:
            UnknownNameError: no loss section is registered as ``name``.
        """
        extra = self.__pydantic_extra__ or {}
        return extra[name] if name in extra else LOSS_SECTIONS[name]()


def loss_section(name: str) -> Callable[[type[S]], type[S]]:
    """Decorator registering a loss's own config section ``loss.<name>.*`` (a :class:`LossSection`; put it in the
    loss's module). The flat keys that run.json files written before sections hold (``loss.<name>_<key>``, or the
    section's ``legacy_keys``: old flat key -> field) still load into it; a YAML config with one is refused."""
    return LOSS_SECTIONS.register(name)


def compose_sections(data: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """``data`` (a loss config's keys) with one validated section per registered loss section, each built from its
    ``loss.<name>`` dict and the old flat keys of earlier run.json files that map to it.

    Raises:
        ValueError: a key that is neither a shared knob, a section nor an old flat key of one.
    """
    legacy = _legacy_keys()
    out: dict[str, Any] = {}
    given: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key in fields:
            out[key] = value
        elif key in LOSS_SECTIONS:
            values = value.model_dump() if isinstance(value, BaseModel) else value
            if not isinstance(values, dict):
                raise ValueError(f"loss.{key} is a section: give its keys (loss.{key}.<key>=...)")
            given.setdefault(key, {}).update(values)
        elif key in legacy:
            name, field = legacy[key]
            given.setdefault(name, {}).setdefault(field, value)
        else:
            raise ValueError(
                f"loss.{key} is not a loss key: shared knobs are {sorted(fields)}, each loss's own are under "
                f"loss.<name>.* (sections: {sorted(LOSS_SECTIONS)})"
            )
    for name in LOSS_SECTIONS:
        out[name] = LOSS_SECTIONS[name].model_validate(given.get(name, {}))
    return out


def renamed_key(key: str) -> str | None:
    """The section key (``icepop.low``) that an old flat loss key (``icepop_low``) became, else None."""
    moved = _legacy_keys().get(key)
    return None if moved is None else f"{moved[0]}.{moved[1]}"


def _legacy_keys() -> dict[str, tuple[str, str]]:
    """Old flat key -> (section, field): ``<name>_<field>`` for every field, plus each section's ``legacy_keys``."""
    keys: dict[str, tuple[str, str]] = {}
    for name in LOSS_SECTIONS:
        model = LOSS_SECTIONS[name]
        keys.update({f"{name}_{field}": (name, field) for field in model.model_fields})
        keys.update({old: (name, field) for old, field in getattr(model, "legacy_keys", {}).items()})
    return keys
