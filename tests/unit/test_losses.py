"""Policy losses (mugrpo.losses): hand-computed values and gradients, aggregation, global-count invariance,
numerical edge cases, KL estimators, metrics, registry and config errors."""

import math

import pytest
import torch

from mugrpo.common.registry import UnknownNameError
from mugrpo.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    LossContext,
    PolicyLossConfig,
    aggregate_token_values,
    compute_policy_loss,
    kl_estimate,
    reduce_metrics,
)

AGG_MODES = sorted(AGGREGATIONS)
LOSSES = ["grpo", "mu_grpo", "gspo"]


def _policy(ratios, behavior=None):
    """Leaf log-probs whose ratio to ``behavior`` (default -1.5 everywhere) is ``ratios``."""
    ratios = torch.as_tensor(ratios, dtype=torch.float32)
    behavior = torch.full_like(ratios, -1.5) if behavior is None else behavior
    return (behavior + ratios.log()).requires_grad_(), behavior


def _run(name, ratios, advantages, mask=None, **config):
    logprobs, behavior = _policy(ratios)
    mask = torch.ones_like(logprobs, dtype=torch.bool) if mask is None else mask
    out = compute_policy_loss(
        logprobs, behavior, torch.as_tensor(advantages), mask, PolicyLossConfig(name=name, **config)
    )
    out.loss.backward()
    return out, logprobs.grad


def test_grpo_hand_computed_value_gradient_and_clip_fractions():
    # A = +1: rho 1 -> -1; rho 1.5 -> -1.2 (clipped, no grad); rho 0.5 -> -0.5 (grad -0.5)
    # A = -1: rho 1 -> 1; rho 1.5 -> 1.5 (grad 1.5); rho 0.5 -> 0.8 (clipped, no grad)
    out, grad = _run("grpo", [[1.0, 1.5, 0.5], [1.0, 1.5, 0.5]], [1.0, -1.0])
    assert out.loss.item() == pytest.approx(0.6 / 6, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.0, -0.5], [1.0, 1.5, 0.0]]) / 6)
    assert out.metrics["clip_frac_high"].item() == pytest.approx(1 / 6)
    assert out.metrics["clip_frac_low"].item() == pytest.approx(1 / 6)


def test_grpo_clip_higher_is_asymmetric():
    # DAPO clip-higher: range [0.8, 1.28].
    # A > 0: 1.25 unclipped, 1.3 clipped at 1.28; A < 0: 0.81 unclipped, 0.79 -> 0.8.
    out, grad = _run("grpo", [[1.25, 1.3], [0.81, 0.79]], [1.0, -1.0], eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(out.loss, torch.tensor((-1.25 - 1.28 + 0.81 + 0.8) / 4))
    torch.testing.assert_close(grad, torch.tensor([[-1.25, 0.0], [0.81, 0.0]]) / 4)
    # The symmetric range clips 1.25 too.
    _, symmetric_grad = _run("grpo", [[1.25, 1.3], [0.81, 0.79]], [1.0, -1.0], eps_low=0.2, eps_high=0.2)
    assert symmetric_grad[0, 0].item() == 0.0


def test_dual_clip_caps_negative_advantage_tokens():
    # c = 3, A = -1: rho 5 -> min(5, 3) = 3 (no grad); rho 2 -> 2 (grad 2). A = +1, rho 5 -> -1.2 as usual.
    out, grad = _run("grpo", [[5.0, 2.0], [5.0, 1.0]], [-1.0, 1.0], dual_clip_c=3.0)
    torch.testing.assert_close(out.loss, torch.tensor((3.0 + 2.0 - 1.2 - 1.0) / 4))
    torch.testing.assert_close(grad, torch.tensor([[0.0, 2.0], [0.0, -1.0]]) / 4)
    assert out.metrics["dual_clip_frac"].item() == pytest.approx(1 / 4)
    with_mu, _ = _run("mu_grpo", [[8.0, 2.0]], [-1.0], dual_clip_c=6.0)
    torch.testing.assert_close(with_mu.loss, torch.tensor((6.0 + 2.0) / 2))


def test_mu_grpo_relaxed_clip_range():
    # Range [0, 5]. A = +1: rho 6 -> -5 (clipped), rho 0.1 -> -0.1 (not clipped below: ratio_min = 0).
    # A = -1: rho 6 -> 6 (grad 6), rho 0.01 -> 0.01 (grad 0.01, no veto: 0.01 > delta).
    out, grad = _run("mu_grpo", [[6.0, 0.1], [6.0, 0.01]], [1.0, -1.0])
    torch.testing.assert_close(out.loss, torch.tensor((-5.0 - 0.1 + 6.0 + 0.01) / 4))
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.1], [6.0, 0.01]]) / 4)
    assert out.metrics["clip_frac_high"].item() == pytest.approx(1 / 4)
    assert out.metrics["clip_frac_low"].item() == 0.0


def test_gspo_hand_computed_value_and_gradient():
    # row 0 (A = +1, 3 tokens): log rho = 0.1, 0.2, 0.3 -> s = e^0.2 = 1.2214 > 1.2: loss -1.2, no gradient.
    # row 1 (A = -1, 2 tokens): log rho = -0.1, 0.1 -> s = 1: loss 1; grad of token t = s / |o| / N_seqs = 0.25.
    log_ratio = torch.tensor([[0.1, 0.2, 0.3], [-0.1, 0.1, 7.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    out, grad = _run("gspo", log_ratio.exp(), [1.0, -1.0], mask=mask, agg_mode="seq-mean-token-mean")
    torch.testing.assert_close(out.loss, torch.tensor((-1.2 + 1.0) / 2))
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, 0.0], [0.25, 0.25, 0.0]]))
    assert out.metrics["clip_frac_high"].item() == pytest.approx(3 / 5)
    assert out.metrics["seq_ratio_mean"].item() == pytest.approx((math.exp(0.2) + 1.0) / 2, rel=1e-6)


def test_gspo_matches_the_sequence_level_objective():
    """GSPO-token with seq-mean-token-mean equals (1/G) sum_i -min(s_i A_i, clip(s_i) A_i) in value and gradient."""
    gen = torch.Generator().manual_seed(0)
    behavior = -torch.rand(6, 9, generator=gen) * 3
    logprobs = (behavior + torch.randn(6, 9, generator=gen) * 0.3).requires_grad_()
    mask = torch.arange(9) < torch.tensor([9, 4, 1, 7, 9, 2]).unsqueeze(-1)
    advantages = torch.randn(6, generator=gen)
    config = PolicyLossConfig(name="gspo", eps_low=0.05, eps_high=0.08, agg_mode="seq-mean-token-mean")
    out = compute_policy_loss(logprobs, behavior, advantages, mask, config)
    (grad,) = torch.autograd.grad(out.loss, logprobs)

    reference_logprobs = logprobs.detach().clone().requires_grad_()
    log_s = torch.where(mask, reference_logprobs - behavior, 0.0).sum(-1) / mask.sum(-1)
    s = log_s.exp()
    objective = torch.minimum(s * advantages, s.clamp(0.95, 1.08) * advantages)
    reference_loss = -objective.mean()
    (reference_grad,) = torch.autograd.grad(reference_loss, reference_logprobs)
    torch.testing.assert_close(out.loss, reference_loss)
    torch.testing.assert_close(grad, reference_grad)
    assert 0 < out.metrics["clip_frac_high"] + out.metrics["clip_frac_low"] < 1  # both branches exercised


def test_gspo_rejects_the_token_veto():
    with pytest.raises(ValueError, match="veto is token-level"):
        _run("gspo", [[1.0]], [-1.0], veto_enabled=True)


# Per-token losses -1, -2, -3 (row 0, length 3), -4 (row 1, length 1); row 2 is empty; T = 4.
AGG_EXPECTED = {
    "token-mean": -10 / 4,
    "seq-mean-token-mean": (-6 / 3 - 4 / 1) / 2,
    "seq-mean-token-sum": (-6 - 4) / 2,
    "seq-mean-token-sum-norm": -10 / (2 * 4),
}


def _agg_example():
    mask = torch.arange(4) < torch.tensor([3, 1, 0]).unsqueeze(-1)
    values = torch.tensor([[-1.0, -2.0, -3.0, float("nan")], [-4.0, 9.0, 9.0, 9.0], [float("inf"), 1.0, 1.0, 1.0]])
    return values, mask


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregation_hand_computed(mode):
    values, mask = _agg_example()
    result, is_global = aggregate_token_values(values, mask, mode)
    assert result.item() == pytest.approx(AGG_EXPECTED[mode]) and not is_global
    # Through a loss: ratio 1 and token-level advantages A_t give per-token loss -A_t.
    advantages = torch.where(mask, -values, 0.0)
    out, _ = _run("grpo", torch.ones(3, 4), advantages, mask=mask, agg_mode=mode)
    assert out.loss.item() == pytest.approx(AGG_EXPECTED[mode])


def test_dr_grpo_normalizer_and_global_counts():
    values, mask = _agg_example()
    context = LossContext(max_response_len=5)
    assert aggregate_token_values(values, mask, "seq-mean-token-sum-norm", context)[0].item() == pytest.approx(-1.0)
    context = LossContext(global_num_tokens=20.0, global_num_seqs=5.0)
    token_mean, is_global = aggregate_token_values(values, mask, "token-mean", context)
    assert token_mean.item() == pytest.approx(-0.5) and is_global
    assert aggregate_token_values(values, mask, "seq-mean-token-sum", context)[0].item() == pytest.approx(-2.0)
    with pytest.raises(ValueError, match="unknown agg_mode 'sum'; known: seq-mean-token-mean"):
        aggregate_token_values(values, mask, "sum")


def _random_batch(seed, batch=6, tokens=7):
    gen = torch.Generator().manual_seed(seed)
    behavior = -torch.rand(batch, tokens, generator=gen) * 4
    log_ratio = torch.randn(batch, tokens, generator=gen) * 0.8
    log_ratio[1, 2] = -12.0  # a trigger for the veto
    lengths = torch.tensor([7, 5, 0, 3, 7, 1])[:batch]
    mask = torch.arange(tokens) < lengths.unsqueeze(-1)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.7, 0.3, -2.0])[:batch]
    ref = behavior + torch.randn(batch, tokens, generator=gen) * 0.2
    entropy = torch.rand(batch, tokens, generator=gen)
    return behavior + log_ratio, behavior, advantages, mask, ref, entropy


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("mode", AGG_MODES)
def test_global_counts_make_micro_batching_invisible(name, mode):
    """Split a batch into 2 micro-batches, normalize each by the global counts: summed loss and gradients equal
    the whole batch's (with or without the global counts on the whole batch)."""
    logprobs0, behavior, advantages, mask, ref, entropy = _random_batch(1)
    config = PolicyLossConfig(name=name, agg_mode=mode, kl_coef=0.1, eps_low=0.3, eps_high=0.4)
    full_context = dict(max_response_len=10)
    global_context = dict(
        global_num_tokens=float(mask.sum()), global_num_seqs=float(mask.any(-1).sum()), max_response_len=10
    )

    whole = logprobs0.clone().requires_grad_()
    out_whole = compute_policy_loss(
        whole, behavior, advantages, mask, config, context=LossContext(ref_logprobs=ref, **full_context)
    )
    out_whole.loss.backward()

    split = logprobs0.clone().requires_grad_()
    outputs = []
    for rows in (slice(0, 2), slice(2, 6)):
        context = LossContext(ref_logprobs=ref[rows], entropy=entropy[rows], **global_context)
        outputs.append(
            compute_policy_loss(split[rows], behavior[rows], advantages[rows], mask[rows], config, context=context)
        )
    total = outputs[0].loss + outputs[1].loss
    total.backward()

    torch.testing.assert_close(total, out_whole.loss)
    torch.testing.assert_close(split.grad, whole.grad)
    assert whole.grad.abs().sum() > 0
    assert reduce_metrics(outputs)["loss"].item() == pytest.approx(out_whole.loss.item(), rel=1e-5)


def test_reduce_metrics_over_micro_batches_equals_whole_batch_metrics():
    logprobs, behavior, advantages, mask, ref, entropy = _random_batch(2)
    config = PolicyLossConfig(name="mu_grpo", kl_coef=0.05)
    whole = compute_policy_loss(
        logprobs, behavior, advantages, mask, config, context=LossContext(ref_logprobs=ref, entropy=entropy)
    )
    parts = [
        compute_policy_loss(
            logprobs[rows],
            behavior[rows],
            advantages[rows],
            mask[rows],
            config,
            context=LossContext(ref_logprobs=ref[rows], entropy=entropy[rows]),
        )
        for rows in (slice(0, 1), slice(1, 4), slice(4, 6))
    ]
    reduced = reduce_metrics(parts)
    for name, value in whole.metrics.items():
        if name in ("loss", "policy_loss"):  # local normalization: the reduced value is a mean of micro-batch losses
            continue
        assert reduced[name].item() == pytest.approx(value.item(), rel=1e-6, abs=1e-9), name
    assert whole.metrics["trigger_count"].item() == 1
    assert whole.metrics["veto_response_frac"].item() == pytest.approx(1 / 5)  # 5 non-empty responses


def test_standard_metrics_hand_computed():
    ratios = torch.tensor([[2.0, 0.5], [1.0, 4.0]])
    entropy = torch.tensor([[0.1, 0.3], [0.5, 9.0]])
    mask = torch.tensor([[True, True], [True, False]])
    logprobs, behavior = _policy(ratios)
    out = compute_policy_loss(
        logprobs,
        behavior,
        torch.tensor([-1.0, 1.0]),
        mask,
        PolicyLossConfig(name="grpo"),
        context=LossContext(entropy=entropy),
    )
    m = out.metrics
    assert m["ratio_mean"].item() == pytest.approx((2.0 + 0.5 + 1.0) / 3)
    assert m["ratio_max"].item() == pytest.approx(2.0)
    assert m["ratio_mean_neg_adv"].item() == pytest.approx((2.0 + 0.5) / 2)
    assert m["ratio_max_pos_adv"].item() == pytest.approx(1.0)  # the one A > 0 token (ratio 1; 2.0 has A < 0)
    k3 = [r - 1 - math.log(r) for r in (2.0, 0.5, 1.0)]
    assert m["approx_kl_behavior"].item() == pytest.approx(sum(k3) / 3, rel=1e-6)
    assert m["entropy"].item() == pytest.approx(0.3)
    assert m["clip_frac_low"].item() == pytest.approx(1 / 3)
    expected = {
        "clip_frac_low",
        "clip_frac_high",
        "dual_clip_frac",
        "veto_token_frac",
        "veto_response_frac",
        "trigger_count",
        "ratio_mean",
        "ratio_max",
        "ratio_mean_neg_adv",
        "ratio_max_pos_adv",
        "approx_kl_behavior",
        "entropy",
        "policy_loss",
        "loss",
    }
    assert set(m) == expected
    assert all(not value.requires_grad and value.dim() == 0 for value in m.values())


def test_kl_estimators_hand_computed():
    logprobs = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])  # r = pi_ref / pi_theta = 0.5
    expected = {"k1": math.log(2), "k2": 0.5 * math.log(2) ** 2, "k3": 0.5 - 1 - math.log(0.5)}
    for estimator, value in expected.items():
        assert kl_estimate(logprobs, ref, estimator).item() == pytest.approx(value, rel=1e-6)
    with pytest.raises(ValueError, match="unknown kl_estimator 'k4'"):
        kl_estimate(logprobs, ref, "k4")


@pytest.mark.parametrize(
    ("estimator", "value", "grad"),
    [
        ("k1", math.log(2), 1.0),  # d/dlogp (logp - ref) = 1
        ("k2", 0.5 * math.log(2) ** 2, math.log(2)),  # d/dlogp (ref - logp)^2 / 2 = logp - ref
        ("k3", 0.5 - 1 - math.log(0.5), 1 - 0.5),  # d/dlogp (r - 1 - log r) = 1 - r
    ],
)
def test_kl_penalty_in_the_loss(estimator, value, grad):
    logprobs = torch.full((2, 1), math.log(0.5), requires_grad=True)
    behavior = logprobs.detach().clone()  # rho = 1, A = 0: the surrogate is 0
    ref = torch.full((2, 1), math.log(0.25))
    config = PolicyLossConfig(name="grpo", kl_coef=0.1, kl_estimator=estimator)
    out = compute_policy_loss(
        logprobs, behavior, torch.zeros(2), torch.ones(2, 1), config, context=LossContext(ref_logprobs=ref)
    )
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.1 * value, rel=1e-5)
    torch.testing.assert_close(logprobs.grad, torch.full((2, 1), 0.1 * grad / 2))
    assert out.metrics["kl_ref"].item() == pytest.approx(value, rel=1e-5)


def test_kl_needs_reference_logprobs_and_is_skipped_at_zero_coef():
    with pytest.raises(ValueError, match="LossContext.ref_logprobs"):
        _run("grpo", [[1.0]], [1.0], kl_coef=0.1)
    out, _ = _run("grpo", [[1.0]], [1.0])
    assert "kl_ref" not in out.metrics


def test_truncated_importance_sampling():
    # sampler log-probs vs trainer recomputation: weights 0.5 and 3 -> capped at 2. Ratio vs the trainer's: 1 and 1.1.
    sampler = torch.log(torch.tensor([[0.5, 0.1]]))
    trainer = torch.log(torch.tensor([[0.25, 0.3]]))
    logprobs = (trainer + torch.log(torch.tensor([[1.0, 1.1]]))).requires_grad_()
    config = PolicyLossConfig(name="grpo", tis_cap=2.0)
    context = LossContext(trainer_behavior_logprobs=trainer)
    out = compute_policy_loss(logprobs, sampler, torch.tensor([1.0]), torch.ones(1, 2), config, context=context)
    out.loss.backward()
    torch.testing.assert_close(out.loss, torch.tensor(-(0.5 * 1.0 + 2.0 * 1.1) / 2))
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.5 * 1.0, -2.0 * 1.1]]) / 2)
    assert out.metrics["tis_capped_frac"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="trainer_behavior_logprobs"):
        compute_policy_loss(logprobs, sampler, torch.tensor([1.0]), torch.ones(1, 2), config)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("mode", AGG_MODES)
def test_extreme_ratios_masked_rows_and_zero_advantage_stay_finite(name, mode):
    ratios = torch.tensor([[1e-9, 1e9, 1.0], [1e9, 1e-9, 1e-9], [1.0, 1.0, 1.0], [1e9, 1.0, 1e-9]])
    behavior = torch.full((4, 3), -1.0)
    behavior[2, :] = float("nan")  # garbage at padding must not leak
    logprobs = (torch.full((4, 3), -1.0) + ratios.log()).detach()
    logprobs[2, :] = float("-inf")
    logprobs.requires_grad_()
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 1, 0]])
    advantages = torch.tensor([1.0, -1.0, 1.0, 0.0])
    config = PolicyLossConfig(name=name, agg_mode=mode, dual_clip_c=None)
    out = compute_policy_loss(logprobs, behavior, advantages, mask, config)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert torch.isfinite(logprobs.grad).all()
    assert (logprobs.grad[2] == 0).all()  # all-masked row: no gradient
    assert (logprobs.grad[3] == 0).all()  # A = 0: no gradient
    assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("name", LOSSES)
def test_fully_masked_batch_and_zero_advantages_give_zero_loss(name):
    out, grad = _run(name, torch.ones(2, 3), [1.0, -1.0], mask=torch.zeros(2, 3, dtype=torch.bool))
    assert out.loss.item() == 0.0 and (grad == 0).all()
    assert all(torch.isfinite(v) for v in out.metrics.values())
    out, grad = _run(name, torch.full((2, 3), 1.3), [0.0, 0.0])
    assert out.loss.item() == 0.0 and (grad == 0).all()


def test_low_precision_inputs_are_computed_in_fp32():
    logprobs = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16, requires_grad=True)
    behavior = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16)
    out = compute_policy_loss(logprobs, behavior, torch.tensor([1.0]), torch.ones(1, 2), PolicyLossConfig())
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and out.loss.item() == pytest.approx(-1.0)
    assert logprobs.grad.dtype == torch.bfloat16


def test_shape_errors_name_the_argument():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="behavior_logprobs has shape"):
        compute_policy_loss(lp, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3), PolicyLossConfig())
    with pytest.raises(ValueError, match="advantages has shape"):
        compute_policy_loss(lp, lp, torch.zeros(3), torch.ones(2, 3), PolicyLossConfig())
    with pytest.raises(ValueError, match="LossContext.group_index"):
        compute_policy_loss(
            lp,
            lp,
            torch.zeros(2),
            torch.ones(2, 3),
            PolicyLossConfig(),
            context=LossContext(group_index=torch.zeros(3, dtype=torch.long)),
        )
    with pytest.raises(ValueError, match="global_num_tokens must be > 0"):
        LossContext(global_num_tokens=0.0)


def test_registry_lookup_errors_and_custom_losses():
    assert {"grpo", "mu_grpo", "gspo"} <= set(POLICY_LOSSES)
    with pytest.raises(
        UnknownNameError, match="unknown policy loss 'ppo'; registered: " + ", ".join(POLICY_LOSSES) + "$"
    ):
        POLICY_LOSSES["ppo"]
    with pytest.raises(UnknownNameError, match="did you mean 'mu_grpo'"):
        compute_policy_loss(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), PolicyLossConfig(name="mugrpo")
        )
    with pytest.raises(ValueError, match="already registered"):
        POLICY_LOSSES.register("grpo")(POLICY_LOSSES["mu_grpo"])

    @POLICY_LOSSES.register("test_token_mean_logprob")
    def _custom(logprobs, behavior_logprobs, advantages, response_mask, config, *, context=None):
        return POLICY_LOSSES["grpo"](logprobs, behavior_logprobs, advantages, response_mask, config, context=context)

    try:
        out = compute_policy_loss(
            torch.zeros(1, 2),
            torch.zeros(1, 2),
            torch.ones(1),
            torch.ones(1, 2),
            PolicyLossConfig(name="test_token_mean_logprob"),
        )
        assert out.loss.item() == pytest.approx(-1.0)
    finally:
        POLICY_LOSSES.unregister("test_token_mean_logprob")
    assert "test_token_mean_logprob" not in POLICY_LOSSES


def test_config_validation():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="ratio_min"):
        PolicyLossConfig(ratio_min=1.0, ratio_max=1.0)
    with pytest.raises(ValidationError, match="dual_clip_c"):
        PolicyLossConfig(dual_clip_c=1.0)
    with pytest.raises(ValidationError, match="veto_scope"):
        PolicyLossConfig(veto_scope="prefix")
    with pytest.raises(ValidationError, match="eps_hgh"):
        PolicyLossConfig(eps_hgh=0.28)
    assert PolicyLossConfig().veto_delta == 1e-4 and PolicyLossConfig().ratio_max == 5.0
