"""Edge cases of the stale-data corrections that an independent float64 check found (M2PO's drop-all rule, tie
order and behavior-weight cap; A-3PO's weight overflow; a behavior log-prob of -inf in sequence IS, SNIS, A-3PO and
GSPO), and normal inputs against the same references. The mends left every result on normal inputs bitwise as before
(checked against the pre-change implementations, loss, gradient and every metric, when they were made). References:
float64, written from the docstrings' equations (plain loops, not the library's helpers)."""

from __future__ import annotations

import math

import pytest
import torch

import mugrpo.algorithms  # noqa: F401  (registers a3po)
from mugrpo.algorithms.a3po import ALPHA
from mugrpo.losses import LossContext, MetricStat, PolicyLossConfig, compute_policy_loss
from mugrpo.losses.clipped import clipped_surrogate
from mugrpo.losses.kl import LOG_RATIO_CLAMP
from mugrpo.losses.pipeline import PreparedBatch, TokenSurrogate, finalize_loss, importance_ratio, prepare_batch
from mugrpo.losses.stale import (
    CLIPPED_FRAC,
    MASKED_FRAC,
    WEIGHT_MEAN,
    bounded_weight,
    correction_stats,
    m2po_keep_mask,
    masked_is_surrogate,
)
from mugrpo.losses.stale.m2po import m2po_loss
from mugrpo.losses.stale.seq_is import sequence_log_weight
from tests.unit.test_stale_corrections import LENGTHS
from tests.unit.test_stale_corrections import _batch as _batch64

TOL = 1e-6


def _batch(seed: int, scale: float, offsets: list[float] | None = None):
    """The fp32 batch of tests/unit/test_stale_corrections.py's ``_batch``: 6 responses of lengths LENGTHS."""
    logprobs, behavior, advantages, mask = _batch64(seed, scale, offsets)
    return logprobs.float(), behavior.float(), advantages.float(), mask


def _call(fn, logprobs, behavior, advantages, mask, config, context=None, **kwargs):
    """A loss function's loss, its gradient w.r.t. the log-probs and its metrics (all tensors, fp32 / float64)."""
    lp = logprobs.clone().requires_grad_(True)
    out = fn(lp, behavior, advantages, mask, config, context=context, **kwargs)
    out.loss.backward()
    return out.loss.detach(), lp.grad, out.metrics


def _run(name, logprobs, behavior, advantages, mask, context=None, **cfg):
    return _call(compute_policy_loss, logprobs, behavior, advantages, mask, PolicyLossConfig(name=name, **cfg), context)


def _assert_bitwise_equal(got, want):
    (loss, grad, metrics), (want_loss, want_grad, want_metrics) = got, want
    assert torch.equal(loss, want_loss)
    assert torch.equal(grad, want_grad)
    assert metrics.keys() == want_metrics.keys()
    for key, value in want_metrics.items():
        assert torch.equal(metrics[key], value), key


def _tokens(mask):
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]


# --- normal inputs ---------------------------------------------------------------------------------------------------


def test_normal_inputs_still_match_the_float64_reference():
    """The unchanged values are the right ones: seq_is, seq_snis and m2po against float64 loops (token-mean)."""
    lp, b, a, mask = _batch(0, 0.1, offsets=[0.2, -0.1, 0.0, 0.25, -0.2, 0.05])
    n_tok = int(mask.sum())
    log_w = [sum(float(lp[i, t]) - float(b[i, t]) for t in range(n)) for i, n in enumerate(LENGTHS)]
    for name, weights in (
        ("seq_is", [min(math.exp(x), 2.0) for x in log_w]),
        ("seq_snis", [len(log_w) * math.exp(x) / sum(math.exp(y) for y in log_w) for x in log_w]),
    ):
        loss, grad, _ = _run(name, lp, b, a, mask)
        want = -sum(weights[i] * float(a[i]) * n for i, n in enumerate(LENGTHS)) / n_tok
        assert float(loss) == pytest.approx(want, abs=TOL), name
        for i, t in _tokens(mask):
            assert float(grad[i, t]) == pytest.approx(-weights[i] * float(a[i]) / n_tok, abs=TOL), name


# --- M2PO: drop-all edge, tie order, behavior-weight cap ----------------------------------------------------------


def test_m2po_drops_every_token_when_every_m2_is_over_tau_where_areal_keeps_one():
    log_ratio = torch.tensor([[0.5, -0.3, 0.0], [0.25, 0.4, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    keep = m2po_keep_mask(log_ratio, mask, 0.04)  # smallest (log rho)^2 = 0.0625 >= 0.04
    assert not keep.any()  # AReaL's get_m2po_loss_mask would keep the 0.25 token (the smallest M2)
    assert not m2po_keep_mask(log_ratio, torch.zeros_like(mask), 0.04).any()  # no token: nothing kept


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_m2po_breaks_ties_by_dropping_the_earlier_token_first(sign):
    """Two tokens of equal M2 (log rho = +0.3 and -0.3), one of which must go: the one earlier in row-major order
    (response 0 before response 1) is dropped, whichever sign it has."""
    log_ratio = torch.tensor([[0.0, sign * 0.3], [-sign * 0.3, 0.0]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    # M2 = (0, .09, .09, 0): mean .045 >= .04; dropping one .09 leaves mean .03 < .04
    keep = m2po_keep_mask(log_ratio, mask, 0.04)
    assert keep.tolist() == [[True, False], [True, True]]
    # within one response: the earlier position goes first
    keep = m2po_keep_mask(torch.tensor([[0.0, -sign * 0.3, sign * 0.3, 0.0]]), torch.ones(1, 4, dtype=torch.bool), 0.04)
    assert keep.tolist() == [[True, False, True, True]]


def test_m2po_behavior_weight_cap_matches_its_float64_reference():
    """tau large enough that the M2 mask drops only the largest outliers; the cap C = 5 (AReaL's example value)
    also drops every token with rho > 5, and only those (a token with rho << 1 has a large M2 but is under C)."""
    lp, b, a, mask = _batch(12, 0.4, offsets=[0.0, 1.9, -1.8, 0.3, 1.7, 0.0])
    tau, cap = 1.5, 5.0
    tokens = _tokens(mask)
    log_rho = {k: float(lp[k]) - float(b[k]) for k in tokens}
    m2 = {k: v * v for k, v in log_rho.items()}
    kept = set(tokens)
    while kept and sum(m2[k] for k in kept) / len(kept) >= tau:  # the greedy M2 mask, ties by row-major order
        kept.remove(max(sorted(kept), key=lambda k: m2[k]))
    by_m2 = set(kept)
    kept = {k for k in kept if math.exp(log_rho[k]) <= cap}
    assert by_m2 - kept  # the cap drops a token the M2 mask keeps ...
    assert any(math.exp(log_rho[k]) <= cap for k in set(tokens) - by_m2)  # ... and the M2 mask one under the cap
    assert any(math.exp(log_rho[k]) < 1 / cap for k in kept)  # the cap is one-sided
    n_tok = len(tokens)
    want_loss = -sum(math.exp(log_rho[k]) * float(a[k[0]]) for k in kept) / n_tok
    want_grad = torch.zeros_like(lp)
    for k in kept:
        want_grad[k] = -math.exp(log_rho[k]) * float(a[k[0]]) / n_tok
    loss, grad, metrics = _call(m2po_loss, lp, b, a, mask, PolicyLossConfig(name="m2po", m2po={"tau": tau}),
                                behavior_weight_cap=cap)  # fmt: skip
    assert float(loss) == pytest.approx(want_loss, abs=TOL)
    assert torch.allclose(grad, want_grad, atol=TOL, rtol=0)
    assert float(metrics[MASKED_FRAC]) == pytest.approx(1 - len(kept) / n_tok, abs=TOL)
    assert float(metrics["m2po_m2_kept"]) == pytest.approx(sum(m2[k] for k in kept) / len(kept), abs=TOL)
    # the config's loss.m2po.behavior_weight_cap is the same cap as the keyword
    by_config = PolicyLossConfig(name="m2po", m2po={"tau": tau, "behavior_weight_cap": cap})
    _assert_bitwise_equal(_call(m2po_loss, lp, b, a, mask, by_config), (loss, grad, metrics))
    # no cap (the default) keeps the tokens the M2 mask keeps
    _, _, no_cap = _call(m2po_loss, lp, b, a, mask, PolicyLossConfig(name="m2po", m2po={"tau": tau}))
    assert float(no_cap[MASKED_FRAC]) == pytest.approx(1 - len(by_m2) / n_tok, abs=TOL)


@pytest.mark.parametrize("cap", [0.0, -1.0])
def test_m2po_behavior_weight_cap_must_be_positive(cap):
    lp, b, a, mask = _batch(13, 0.1)
    with pytest.raises(ValueError, match="behavior_weight_cap"):
        _call(m2po_loss, lp, b, a, mask, PolicyLossConfig(name="m2po"), behavior_weight_cap=cap)


# --- A-3PO: a behavior weight that cannot overflow ----------------------------------------------------------------


def test_bounded_weight_is_exp_up_to_the_bound_and_finite_beyond_it():
    g = torch.Generator().manual_seed(14)
    normal = torch.cat([torch.randn(1000, generator=g) * 3, torch.tensor([-1e4, -100.0, 0.0, 19.99, 20.0])])
    assert torch.equal(bounded_weight(normal), torch.exp(normal))  # bitwise: the clamp is the identity here
    assert bounded_weight(torch.tensor(float("-inf"))) == 0.0
    big = torch.tensor([20.5, 88.0, 88.8, 100.0, 1e4, float("inf")])
    assert torch.isinf(torch.exp(big[2:])).all()  # what A-3PO computed (88.0 is finite, 1.65e38)
    assert torch.equal(bounded_weight(big), torch.full_like(big, math.exp(LOG_RATIO_CLAMP)))
    assert bounded_weight(torch.tensor(30.0, dtype=torch.float64)) == math.exp(20.0)  # any dtype


def _a3po_reference(lp, b, a, mask, alpha, lo=0.8, hi=1.2):
    """Token-mean A-3PO without a weight cap, in float64, with the behavior weight bounded at e^20 (as
    :func:`bounded_weight`) and the PPO ratio at e^20 (as :func:`importance_ratio`; no gradient beyond it)."""
    n_tok = int(mask.sum())
    grad = torch.zeros(lp.shape, dtype=torch.float64)
    loss = 0.0
    for i, t in _tokens(mask):
        log_rho = float(lp[i, t]) - float(b[i, t])
        w = math.exp(min(float(alpha[i]) * log_rho, LOG_RATIO_CLAMP))
        log_r = (1 - float(alpha[i])) * log_rho
        r = math.exp(max(min(log_r, LOG_RATIO_CLAMP), -LOG_RATIO_CLAMP))
        adv = float(a[i])
        unclipped, bounded = r * adv, min(max(r, lo), hi) * adv
        loss -= w * min(unclipped, bounded) / n_tok
        if unclipped <= bounded and abs(log_r) < LOG_RATIO_CLAMP:
            grad[i, t] = -w * adv * r / n_tok
    return loss, grad


def test_a3po_without_a_weight_cap_stays_finite_past_the_float32_exp_overflow():
    lp, b, a, mask = _batch(15, 0.2)
    b = b.clone()
    b[0, 1] = lp[0, 1] - 200.0  # log rho = 200: alpha * log rho = 100 > 88.7 for alpha = 0.5 (A > 0)
    b[3, 2] = lp[3, 2] - 180.0  # and 90 for A < 0
    alpha = torch.full((len(LENGTHS),), 0.5)
    loss, grad, metrics = _run(
        "a3po", lp, b, a, mask, context=LossContext(inputs={ALPHA: alpha}), a3po={"weight_cap": None}
    )
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert all(torch.isfinite(v) for v in metrics.values())
    want_loss, want_grad = _a3po_reference(lp, b, a, mask, alpha)
    assert float(loss) == pytest.approx(want_loss, rel=1e-5)
    assert torch.allclose(grad.double(), want_grad, atol=TOL, rtol=1e-5)


# --- a behavior log-prob of -inf (a token the behavior policy could not have sampled) -----------------------------


def _with_impossible_tokens(rows: list[int]):
    lp, b, a, mask = _batch(16, 0.1)
    b = b.clone()
    for i in rows:
        b[i, 1] = float("-inf")
    return lp, b, a, mask


def _sequence_reference(lp, b, a, mask, weights):
    """Token-mean REINFORCE with one weight per response, float64: loss and d loss / d lp."""
    n_tok = int(mask.sum())
    grad = torch.zeros(lp.shape, dtype=torch.float64)
    for i, t in _tokens(mask):
        grad[i, t] = -weights[i] * float(a[i]) / n_tok
    return -sum(weights[i] * float(a[i]) * n for i, n in enumerate(LENGTHS)) / n_tok, grad


def _finite_log_w(lp, b):
    return [sum(float(lp[i, t]) - float(b[i, t]) for t in range(n)) for i, n in enumerate(LENGTHS)]


@pytest.mark.parametrize("cap", [2.0, None])
def test_seq_is_truncates_the_infinite_weight_of_an_impossible_token(cap):
    lp, b, a, mask = _with_impossible_tokens([2])
    log_w = _finite_log_w(lp, b)  # +inf for response 2
    bound = math.log(cap) if cap is not None else LOG_RATIO_CLAMP
    weights = [math.exp(min(max(x, -LOG_RATIO_CLAMP), bound)) for x in log_w]
    assert weights[2] == (cap if cap is not None else math.exp(LOG_RATIO_CLAMP))
    want_loss, want_grad = _sequence_reference(lp, b, a, mask, weights)
    loss, grad, metrics = _run("seq_is", lp, b, a, mask, seq_is={"cap": cap})
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert float(loss) == pytest.approx(want_loss, rel=1e-6, abs=TOL)
    assert torch.allclose(grad.double(), want_grad, rtol=1e-6, atol=TOL)
    clipped = [cap is not None and x >= math.log(cap) for x in log_w]
    assert float(metrics[CLIPPED_FRAC]) == pytest.approx(sum(clipped) / len(clipped), abs=TOL)


@pytest.mark.parametrize("rows", [[2], [1, 4]])
def test_seq_snis_gives_the_responses_with_infinite_weight_the_whole_batch(rows):
    lp, b, a, mask = _with_impossible_tokens(rows)
    n = len(LENGTHS)
    weights = [n / len(rows) if i in rows else 0.0 for i in range(n)]
    want_loss, want_grad = _sequence_reference(lp, b, a, mask, weights)
    loss, grad, metrics = _run("seq_snis", lp, b, a, mask)
    assert float(loss) == pytest.approx(want_loss, abs=TOL)
    assert torch.allclose(grad.double(), want_grad, atol=TOL, rtol=0)
    assert float(metrics[WEIGHT_MEAN]) == pytest.approx(1.0, abs=TOL)  # still 1 by construction


@pytest.mark.parametrize("name", ["seq_is", "seq_snis"])
def test_a_minus_inf_behavior_log_prob_at_padding_changes_nothing(name):
    lp, b, a, mask = _batch(17, 0.2)
    padded = b.clone()
    padded[1, 4] = float("-inf")  # response 1 has 3 tokens: position 4 is padding
    assert not mask[1, 4]
    _assert_bitwise_equal(_run(name, lp, padded, a, mask), _run(name, lp, b, a, mask))


@pytest.mark.parametrize(
    "name, cfg",
    [(n, {}) for n in ("grpo", "mu_grpo", "icepop", "m2po", "geo_mask", "seq_is", "seq_snis", "a3po", "gspo")]
    + [("a3po", {"a3po": {"weight_cap": None}})],
)
def test_every_correction_stays_finite_on_an_impossible_token(name, cfg):
    lp, b, a, mask = _with_impossible_tokens([0, 3])
    context = LossContext(inputs={ALPHA: torch.full((len(LENGTHS),), 0.5)})
    loss, grad, metrics = _run(name, lp, b, a, mask, context=context, **cfg)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    # no metric is NaN (m2po_m2, the mean (log rho)^2 before masking, is honestly +inf here)
    assert not any(torch.isnan(v).any() for v in metrics.values() if isinstance(v, torch.Tensor)), metrics


def test_a3po_without_a_cap_on_an_impossible_token_matches_its_float64_reference():
    """alpha = 0.5: w and r of the impossible tokens are +inf, bounded at e^20 (r with no gradient), as the
    reference computes them from log rho = +inf; the other tokens are the decoupled objective's."""
    lp, b, a, mask = _with_impossible_tokens([0, 3])
    alpha = torch.full((len(LENGTHS),), 0.5)
    loss, grad, _ = _run("a3po", lp, b, a, mask, context=LossContext(inputs={ALPHA: alpha}), a3po={"weight_cap": None})
    want_loss, want_grad = _a3po_reference(lp, b, a, mask, alpha)
    assert math.isfinite(want_loss)
    assert float(loss) == pytest.approx(want_loss, rel=1e-5)
    assert torch.allclose(grad.double(), want_grad, atol=TOL, rtol=1e-5)
    assert grad[0, 1] == 0 and grad[3, 1] == 0


def test_a3po_at_alpha_0_is_ppo_on_an_impossible_token_and_at_alpha_1_keeps_its_gradient():
    """alpha = 0: the proximal policy is the behavior policy, so A-3PO is grpo's PPO loss (weight 1), impossible
    tokens included. alpha = 1: the proximal policy is sg[pi_theta], r = 1 with the gradient of log pi_theta, and
    the behavior weight +inf is over the default cap (the token is dropped) or bounded at e^20 without one."""
    lp, b, a, mask = _with_impossible_tokens([0, 3])
    zeros = LossContext(inputs={ALPHA: torch.zeros(len(LENGTHS))})
    for cap in (5.0, None):
        got = _run("a3po", lp, b, a, mask, context=zeros, a3po={"weight_cap": cap})
        want = _run("grpo", lp, b, a, mask)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    ones = LossContext(inputs={ALPHA: torch.ones(len(LENGTHS))})
    n_tok = int(mask.sum())
    _, grad, _ = _run("a3po", lp, b, a, mask, context=ones, a3po={"weight_cap": None})
    assert torch.isfinite(grad).all()
    assert float(grad[0, 1]) == pytest.approx(-math.exp(LOG_RATIO_CLAMP) * float(a[0]) / n_tok, rel=1e-6)
    _, capped, _ = _run("a3po", lp, b, a, mask, context=ones)
    assert capped[0, 1] == 0 and capped[3, 1] == 0


def test_gspo_bounds_the_ratio_of_a_sequence_with_an_impossible_token():
    """A response with an impossible token has sequence ratio +inf: the same result as a finite log rho so large
    that the ratio is bounded at e^20 (no gradient for that response); the other responses are unchanged."""
    lp, b, a, mask = _with_impossible_tokens([0, 3])
    huge = b.clone()
    huge[0, 1] = lp[0, 1] - 1e4
    huge[3, 1] = lp[3, 1] - 1e4
    got, want = _run("gspo", lp, b, a, mask), _run("gspo", lp, huge, a, mask)
    _assert_bitwise_equal(got, want)
    assert not got[1][0].any() and not got[1][3].any()
    assert got[1][1].abs().sum() > 0  # a possible response keeps its gradient
