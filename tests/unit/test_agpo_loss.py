"""AGPO's loss (arXiv 2605.20722): per-group symmetric clip range through the loss input clip_eps, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from mugrpo.algorithms.agpo.loss import kl_step_per_response
from mugrpo.losses import LossContext, PolicyLossConfig, compute_policy_loss

AGPO = PolicyLossConfig(
    name="agpo", agg_mode="seq-mean-token-mean", kl_coef=0.03, kl_estimator="k1", kl_agg_mode="token-mean"
)


def _inputs():
    logprobs = torch.tensor([[math.log(1.5)] * 2, [math.log(1.1)] * 2], requires_grad=True)
    behavior = torch.zeros(2, 2)
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 2, dtype=torch.bool)
    return logprobs, behavior, advantages, mask


def test_agpo_loss_by_hand_with_per_group_eps_and_kl():
    logprobs, behavior, advantages, mask = _inputs()
    context = LossContext(ref_logprobs=torch.zeros(2, 2), inputs={"clip_eps": torch.tensor([0.2, 0.05])})
    out = compute_policy_loss(logprobs, behavior, advantages, mask, AGPO, context=context)
    # row 0: rho 1.5, A=+1, eps 0.2 -> -min(1.5, 1.2) = -1.2 (clipped, no gradient)
    # row 1: rho 1.1, A=-1, eps 0.05 -> -min(-1.1, -1.05) = 1.1 (not clipped)
    policy = (-1.2 + 1.1) / 2
    kl = (2 * math.log(1.5) + 2 * math.log(1.1)) / 4  # k1 = logp - logp_ref, token-mean over all tokens
    assert float(out.metrics["policy_loss"]) == pytest.approx(policy, abs=1e-6)
    assert float(out.loss.detach()) == pytest.approx(policy + 0.03 * kl, abs=1e-6)
    assert float(out.metrics["clip_frac_high"]) == pytest.approx(0.5)
    out.loss.backward()
    # d/dlogp: row 0 only the KL term 0.03/4 (penalty pushes logp down towards the reference: positive gradient);
    # row 1 surrogate -A * rho / (2 seqs * 2 tokens) = 1.1/4, plus 0.03/4
    expected = torch.tensor([[0.03 / 4] * 2, [1.1 / 4 + 0.03 / 4] * 2])
    torch.testing.assert_close(logprobs.grad, expected)


def test_agpo_with_equal_eps_is_grpo_with_that_clip_range():
    torch.manual_seed(0)
    logprobs = (torch.randn(4, 5) * 0.3).requires_grad_()
    behavior = torch.randn(4, 5) * 0.3
    advantages = torch.randn(4)
    mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 4 + [0], [1] * 5], dtype=torch.bool)
    cfg = dict(agg_mode="seq-mean-token-mean")
    agpo = compute_policy_loss(
        logprobs,
        behavior,
        advantages,
        mask,
        PolicyLossConfig(name="agpo", **cfg),
        context=LossContext(inputs={"clip_eps": torch.full((4,), 0.1)}),
    )
    (g_agpo,) = torch.autograd.grad(agpo.loss, logprobs)
    grpo = compute_policy_loss(
        logprobs, behavior, advantages, mask, PolicyLossConfig(name="grpo", eps_low=0.1, eps_high=0.1, **cfg)
    )
    (g_grpo,) = torch.autograd.grad(grpo.loss, logprobs)
    assert float(agpo.loss) == float(grpo.loss)
    torch.testing.assert_close(g_agpo, g_grpo, rtol=0, atol=0)


def test_agpo_needs_a_valid_clip_eps():
    logprobs, behavior, advantages, mask = _inputs()
    cfg = PolicyLossConfig(name="agpo")
    with pytest.raises(ValueError, match="needs the loss input 'clip_eps'"):
        compute_policy_loss(logprobs, behavior, advantages, mask, cfg, context=LossContext())
    with pytest.raises(ValueError, match=r"clip_eps must lie in \(0, 1\)"):
        compute_policy_loss(
            logprobs, behavior, advantages, mask, cfg, context=LossContext(inputs={"clip_eps": torch.zeros(2)})
        )
    with pytest.raises(ValueError, match=r"LossContext.inputs\['clip_eps'\] has shape \(3,\), expected \[2\]"):
        compute_policy_loss(
            logprobs, behavior, advantages, mask, cfg, context=LossContext(inputs={"clip_eps": torch.ones(3)})
        )


def test_kl_step_per_response():
    log_ratio = torch.tensor([[-0.2, -0.4, 0.0], [0.1, 0.1, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(kl_step_per_response(log_ratio, mask), torch.tensor([0.3, 0.0, 0.0]))
    out = compute_policy_loss(
        log_ratio.clone().requires_grad_(),
        torch.zeros(3, 3),
        torch.ones(3),
        mask,
        PolicyLossConfig(name="agpo"),
        context=LossContext(inputs={"clip_eps": torch.full((3,), 0.2)}),
    )
    assert float(out.metrics["agpo_kl_step"]) == pytest.approx(0.15)  # over the 2 non-empty responses
