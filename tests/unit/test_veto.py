"""Mu-GRPO's negative-advantage veto (arXiv 2605.17570): each scope masks exactly the specified tokens."""

import math

import pytest
import torch

from mugrpo.losses import VETO_SCOPES, LossContext, PolicyLossConfig, compute_policy_loss, negative_advantage_veto_mask

DELTA = 1e-4
TINY = 1e-6  # a ratio below DELTA: a trigger when A < 0


def _example():
    """Five responses, T = 8, hand-built so every scope has a different answer.

    row 0: A < 0, length 7, triggers at t = 2 and t = 4 (kappa = 2)
    row 1: A > 0, length 8, tiny ratio at t = 1 -> not a trigger (positive advantage)
    row 2: A < 0, length 5, tiny ratio only at the padded position t = 6 -> not a trigger
    row 3: A < 0, length 4, trigger at t = 0 (kappa = 0)
    row 4: A < 0, length 8, ratio 2 * delta at t = 3 (not a trigger) and 0.5 * delta at t = 6 (kappa = 6)
    """
    ratios = torch.ones(5, 8)
    ratios[0, 2], ratios[0, 4] = TINY, TINY
    ratios[1, 1] = TINY
    ratios[2, 6] = TINY
    ratios[3, 0] = TINY
    ratios[4, 3], ratios[4, 6] = 2 * DELTA, 0.5 * DELTA
    lengths = torch.tensor([7, 8, 5, 4, 8])
    mask = torch.arange(8) < lengths.unsqueeze(-1)
    advantages = torch.tensor([-1.0, 1.0, -0.5, -2.0, -1.0])
    return ratios.log(), advantages, mask


def _positions(mask_row):
    return set(torch.nonzero(mask_row).flatten().tolist())


EXPECTED_VETOED = {
    "trigger": [{2, 4}, set(), set(), {0}, {6}],
    "suffix": [{3, 4, 5, 6}, set(), set(), {1, 2, 3}, {7}],
    "non_trigger_suffix": [{3, 5, 6}, set(), set(), {1, 2, 3}, {7}],
    "sequence": [set(range(7)), set(), set(), set(range(4)), set(range(8))],
}


def test_every_registered_scope_is_covered():
    assert set(VETO_SCOPES) == set(EXPECTED_VETOED)


@pytest.mark.parametrize("scope", sorted(EXPECTED_VETOED))
def test_scope_masks_exactly_the_specified_tokens(scope):
    log_ratio, advantages, mask = _example()
    keep, info = negative_advantage_veto_mask(log_ratio, advantages, mask, DELTA, scope)
    assert [_positions(row) for row in info.vetoed_mask] == EXPECTED_VETOED[scope]
    assert torch.equal(keep, mask & ~info.vetoed_mask)
    assert [_positions(row) for row in info.trigger_mask] == [{2, 4}, set(), set(), {0}, {6}]
    assert info.first_trigger.tolist() == [2, -1, -1, 0, 6]
    assert keep.dtype == torch.bool and not keep.requires_grad


def test_suffix_keeps_the_first_trigger_itself():
    """S_kappa is "after kappa, exclusive": kappa stays in the loss, the tokens after it do not."""
    log_ratio, advantages, mask = _example()
    keep, _ = negative_advantage_veto_mask(log_ratio, advantages, mask, DELTA, "suffix")
    assert keep[0, :3].all() and not keep[0, 3:].any()


def test_token_level_advantages_only_trigger_where_the_token_advantage_is_negative():
    log_ratio = torch.log(torch.tensor([[1.0, TINY, 1.0, TINY, 1.0]]))
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    keep, info = negative_advantage_veto_mask(log_ratio, advantages, mask, DELTA, "suffix")
    assert info.first_trigger.tolist() == [3]
    assert keep.tolist() == [[True, True, True, True, False]]


def test_ratio_far_below_float_range_is_compared_in_log_space():
    log_ratio = torch.tensor([[0.0, -500.0, 0.0]])  # ratio e^-500 underflows fp32 but is a trigger
    keep, info = negative_advantage_veto_mask(log_ratio, torch.tensor([-1.0]), torch.ones(1, 3), DELTA, "suffix")
    assert info.first_trigger.tolist() == [1] and keep.tolist() == [[True, True, False]]


def test_bad_scope_and_delta_raise_clear_errors():
    log_ratio, advantages, mask = _example()
    with pytest.raises(ValueError, match="unknown veto_scope 'prefix'; known: non_trigger_suffix, sequence"):
        negative_advantage_veto_mask(log_ratio, advantages, mask, DELTA, "prefix")
    with pytest.raises(ValueError, match="delta must be in"):
        negative_advantage_veto_mask(log_ratio, advantages, mask, 1.5, "suffix")


@pytest.mark.parametrize("scope", sorted(EXPECTED_VETOED))
def test_mu_grpo_gradient_is_zero_exactly_on_vetoed_tokens(scope):
    """Token-mean Mu-GRPO: d loss / d log pi_t = -rho_t A / N on kept tokens (rho in [0, 5]), 0 on vetoed ones."""
    log_ratio, advantages, mask = _example()
    behavior = torch.full_like(log_ratio, -2.0)
    logprobs = (behavior + log_ratio).requires_grad_()
    config = PolicyLossConfig(name="mu_grpo", veto_scope=scope, veto_delta=DELTA)
    out = compute_policy_loss(logprobs, behavior, advantages, mask, config)
    out.loss.backward()
    vetoed = torch.zeros_like(mask)
    for row, positions in enumerate(EXPECTED_VETOED[scope]):
        vetoed[row, list(positions)] = True
    keep = mask & ~vetoed
    ratio = log_ratio.exp()
    n_tokens = mask.sum()  # vetoed tokens stay in the token-mean normalizer
    expected_grad = torch.where(keep, -ratio * advantages.unsqueeze(-1) / n_tokens, 0.0)
    torch.testing.assert_close(logprobs.grad, expected_grad, atol=1e-7, rtol=1e-5)
    expected_loss = torch.where(keep, -ratio * advantages.unsqueeze(-1), 0.0).sum() / n_tokens
    torch.testing.assert_close(out.loss, expected_loss)
    metrics = out.metrics
    assert metrics["trigger_count"].item() == 4
    assert metrics["veto_token_frac"].item() == pytest.approx(vetoed.sum().item() / n_tokens.item())
    assert metrics["veto_response_frac"].item() == pytest.approx(3 / 5)


def test_veto_can_be_turned_off_and_grpo_reports_zero_veto_metrics():
    log_ratio, advantages, mask = _example()
    behavior = torch.zeros_like(log_ratio)
    for config in (PolicyLossConfig(name="mu_grpo", veto_enabled=False), PolicyLossConfig(name="grpo")):
        metrics = compute_policy_loss(log_ratio.clone(), behavior, advantages, mask, config).metrics
        assert metrics["veto_token_frac"].item() == 0
        assert metrics["veto_response_frac"].item() == 0
        assert metrics["trigger_count"].item() == 0
    grpo_veto = PolicyLossConfig(name="grpo", veto_enabled=True)
    metrics = compute_policy_loss(log_ratio.clone(), behavior, advantages, mask, grpo_veto).metrics
    assert metrics["trigger_count"].item() == 4


def test_veto_is_recomputed_from_the_current_ratios():
    """Same rollouts, two policies: only the one that pushed a token of an A < 0 response below delta vetoes."""
    behavior = torch.zeros(1, 4)
    mask = torch.ones(1, 4, dtype=torch.bool)
    config = PolicyLossConfig(name="mu_grpo")
    near = compute_policy_loss(torch.full((1, 4), -0.1), behavior, torch.tensor([-1.0]), mask, config)
    far = torch.tensor([[0.0, math.log(TINY), 0.0, 0.0]])
    vetoed = compute_policy_loss(far, behavior, torch.tensor([-1.0]), mask, config, context=LossContext())
    assert near.metrics["veto_token_frac"].item() == 0
    assert vetoed.metrics["veto_token_frac"].item() == pytest.approx(2 / 4)
