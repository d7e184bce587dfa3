"""The stale-data corrections against independent float64 references written from their equations:
the loss value, its gradient with respect to the policy log-probs and the correction metrics (masked / clipped
fraction, ESS), each to 1e-6. The references are plain Python loops over tokens, never the library's helpers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import mugrpo.algorithms  # noqa: F401  (registers a3po)
from mugrpo.algorithms.a3po import ALPHA, A3POConfig, A3POTrainHooks, interpolation_weight
from mugrpo.losses import POLICY_LOSSES, LossContext, PolicyLossConfig, compute_policy_loss
from mugrpo.losses.stale import CLIPPED_FRAC, MASKED_FRAC, WEIGHT_MEAN, WEIGHT_SQ_MEAN, effective_sample_size

TOL = 1e-6
LENGTHS = [5, 3, 6, 4, 6, 2]


def _batch(seed: int, scale: float, offsets: list[float] | None = None):
    """Log-probs, behavior log-probs, advantages and mask of 6 responses (lengths LENGTHS, padded to 6); the policy
    log-probs are the behavior's plus N(offset_i, scale^2) noise."""
    g = torch.Generator().manual_seed(seed)
    b, t = len(LENGTHS), max(LENGTHS)
    mask = torch.tensor([[j < n for j in range(t)] for n in LENGTHS])
    behavior = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3 - 0.05
    noise = torch.randn(b, t, generator=g, dtype=torch.float64) * scale
    if offsets is not None:
        noise = noise + torch.tensor(offsets, dtype=torch.float64).unsqueeze(-1)
    logprobs = torch.where(mask, behavior + noise, 0.0)
    advantages = torch.tensor([1.0, -0.5, 0.8, -1.2, 0.3, -0.7], dtype=torch.float64)
    return logprobs, behavior, advantages, mask


def _run(name, logprobs, behavior, advantages, mask, context=None, **cfg):
    """The library loss in its own precision (fp32), its value, gradient (float64) and metrics."""
    lp = logprobs.float().clone().requires_grad_(True)
    out = compute_policy_loss(lp, behavior.float(), advantages.float(), mask, PolicyLossConfig(name=name, **cfg),
                              context=context)  # fmt: skip
    out.loss.backward()
    return float(out.loss.detach()), lp.grad.double(), {k: float(v) for k, v in out.metrics.items()}


def _tokens(mask):
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]


def _ess(weights: list[float]) -> float:
    s, s2 = sum(weights), sum(w * w for w in weights)
    return 0.0 if s2 == 0 else s * s / (len(weights) * s2)


def _check(got, want_loss, want_grad, want_metrics):
    loss, grad, metrics = got
    assert loss == pytest.approx(want_loss, abs=TOL)
    assert torch.allclose(grad, want_grad, atol=TOL, rtol=0)
    for key, value in want_metrics.items():
        if key == "ess":
            continue
        assert metrics[key] == pytest.approx(value, abs=TOL), key
    assert effective_sample_size(metrics[WEIGHT_MEAN], metrics[WEIGHT_SQ_MEAN]) == pytest.approx(
        want_metrics["ess"], abs=TOL
    )


def _sequence_reference(logprobs, behavior, advantages, mask, weight_of):
    """Token-mean REINFORCE with one weight per response: loss = -(1/N) sum_i |o_i| w_i A_i, dloss/dlp_it =
    -(1/N) w_i A_i; ``weight_of(list of log W_i)`` -> (weights, clipped flags)."""
    n_tok = int(mask.sum())
    log_w = [sum(float(logprobs[i, t] - behavior[i, t]) for t in range(LENGTHS[i])) for i in range(len(LENGTHS))]
    weights, clipped = weight_of(log_w)
    grad = torch.zeros_like(logprobs)
    loss = 0.0
    for i, t in _tokens(mask):
        loss -= weights[i] * float(advantages[i]) / n_tok
        grad[i, t] = -weights[i] * float(advantages[i]) / n_tok
    metrics = {CLIPPED_FRAC: sum(clipped) / len(clipped), MASKED_FRAC: 0.0, "ess": _ess(weights)}
    return loss, grad, metrics


def test_seq_is_matches_its_float64_reference():
    batch = _batch(0, 0.1, offsets=[0.2, -0.1, 0.0, 0.25, -0.2, 0.05])
    cap = 2.0

    def truncated(log_w):
        return [min(math.exp(x), cap) for x in log_w], [math.exp(x) >= cap for x in log_w]

    ref = _sequence_reference(*batch, truncated)
    assert 0 < ref[2][CLIPPED_FRAC] < 1  # the inputs do exercise the truncation
    _check(_run("seq_is", *batch, seq_is={"cap": cap}), *ref)


def test_seq_snis_matches_its_float64_reference():
    batch = _batch(1, 0.3)

    def self_normalised(log_w):
        ws = [math.exp(x) for x in log_w]
        return [len(ws) * w / sum(ws) for w in ws], [False] * len(ws)

    ref = _sequence_reference(*batch, self_normalised)
    got = _run("seq_snis", *batch)
    _check(got, *ref)
    assert got[2][WEIGHT_MEAN] == pytest.approx(1.0, abs=TOL)
    assert ref[2]["ess"] < 0.99  # unequal weights: the ESS is below 1


def _token_reference(logprobs, behavior, advantages, mask, keep_of):
    """Token-mean masked IS: loss = -(1/N) sum keep_t rho_t A_t, dloss/dlp_t = -(1/N) keep_t rho_t A_t."""
    n_tok = int(mask.sum())
    tokens = _tokens(mask)
    rho = {(i, t): math.exp(float(logprobs[i, t] - behavior[i, t])) for i, t in tokens}
    keep = keep_of(rho)
    grad = torch.zeros_like(logprobs)
    loss = 0.0
    for i, t in tokens:
        term = rho[i, t] * float(advantages[i]) / n_tok if keep[i, t] else 0.0
        loss -= term
        grad[i, t] = -term
    weights = [rho[k] if keep[k] else 0.0 for k in tokens]
    masked = sum(1 for k in tokens if not keep[k]) / len(tokens)
    return loss, grad, {MASKED_FRAC: masked, CLIPPED_FRAC: 0.0, "ess": _ess(weights)}


def test_geo_mask_matches_its_float64_reference():
    batch = _batch(2, 0.002, offsets=[0.0, 0.03, -0.004, -0.05, 0.006, 0.0])

    def geometric(rho):
        kept = {}
        for i, n in enumerate(LENGTHS):
            g = math.exp(sum(math.log(rho[i, t]) for t in range(n)) / n)
            kept.update({(i, t): 0.99 <= g <= 1.01 for t in range(n)})
        return kept

    ref = _token_reference(*batch, geometric)
    assert 0 < ref[2][MASKED_FRAC] < 1
    got = _run("geo_mask", *batch)
    _check(got, *ref)
    assert got[2]["geo_mask_response_frac"] == pytest.approx(2 / 6, abs=TOL)  # responses 1 and 3 leave the band


def test_icepop_matches_its_float64_reference():
    batch = _batch(3, 0.9)
    ref = _token_reference(*batch, lambda rho: {k: 0.5 <= r <= 2.0 for k, r in rho.items()})
    assert 0 < ref[2][MASKED_FRAC] < 1
    got = _run("icepop", *batch)
    _check(got, *ref)
    # the band is icepop's clip range: a dropped token counts as clipped with PPO's definitions (A > 0 above the
    # band: high; A < 0 below it: low), which the audit's idle-clip rule reads
    lp, b, a, mask = batch
    n_tok = int(mask.sum())
    rho = {(i, t): math.exp(float(lp[i, t] - b[i, t])) for i, t in _tokens(mask)}
    high = sum(1 for (i, _), r in rho.items() if float(a[i]) > 0 and r > 2.0) / n_tok
    low = sum(1 for (i, _), r in rho.items() if float(a[i]) < 0 and r < 0.5) / n_tok
    assert high > 0 and low > 0  # the inputs exercise both sides of the band
    assert got[2]["clip_frac_high"] == pytest.approx(high, abs=TOL)
    assert got[2]["clip_frac_low"] == pytest.approx(low, abs=TOL)


def test_m2po_matches_its_float64_reference():
    batch = _batch(4, 0.3)
    tau = 0.04

    def greedy(rho):  # drop the largest (log rho)^2 one at a time until the kept tokens' mean is below tau
        m2 = {k: math.log(r) ** 2 for k, r in rho.items()}
        kept = set(m2)
        while kept and sum(m2[k] for k in kept) / len(kept) >= tau:
            kept.remove(max(kept, key=lambda k: m2[k]))
        return {k: k in kept for k in m2}

    ref = _token_reference(*batch, greedy)
    assert 0 < ref[2][MASKED_FRAC] < 1
    got = _run("m2po", *batch, m2po={"tau": tau})
    _check(got, *ref)
    assert got[2]["m2po_m2_kept"] < tau <= got[2]["m2po_m2"]


def test_m2po_keeps_everything_under_the_threshold_and_drops_everything_when_even_one_token_is_over():
    lp, b, a, mask = _batch(5, 0.01)
    assert _run("m2po", lp, b, a, mask)[2][MASKED_FRAC] == 0.0
    far = torch.where(mask, b + 1.0, 0.0)  # every (log rho)^2 = 1 >= 0.04
    loss, grad, metrics = _run("m2po", far, b, a, mask)
    assert metrics[MASKED_FRAC] == 1.0 and loss == 0.0 and not grad.any()


def test_a3po_matches_its_float64_reference():
    lp, b, a, mask = _batch(6, 0.6, offsets=[0.0, 0.3, -0.2, 1.8, 0.1, -0.4])
    alpha = torch.tensor([0.0, 0.5, 0.75, 0.9, 0.2, 0.6], dtype=torch.float64)
    cap, lo, hi = 5.0, 0.8, 1.2
    n_tok = int(mask.sum())
    grad = torch.zeros_like(lp)
    loss, weights, masked, clipped = 0.0, [], 0, 0
    for i, t in _tokens(mask):
        log_rho = float(lp[i, t] - b[i, t])
        w = math.exp(float(alpha[i]) * log_rho)
        r = math.exp((1 - float(alpha[i])) * log_rho)
        adv = float(a[i])
        if w > cap:
            masked += 1
            weights.append(0.0)
            continue
        weights.append(w)
        unclipped, bounded = r * adv, min(max(r, lo), hi) * adv
        loss -= w * min(unclipped, bounded) / n_tok
        if unclipped <= bounded:  # the unclipped branch is the min: gradient w A r d(log r)/d(lp) = w A r
            grad[i, t] = -w * adv * r / n_tok
        else:
            clipped += 1
    metrics = {MASKED_FRAC: masked / n_tok, "ess": _ess(weights)}
    assert masked > 0 and clipped > 0  # the inputs exercise the cap and the clip
    got = _run("a3po", lp, b, a, mask, context=LossContext(inputs={ALPHA: alpha.float()}))
    _check(got, loss, grad, metrics)
    assert got[2]["clip_frac_low"] + got[2]["clip_frac_high"] == pytest.approx(clipped / n_tok, abs=TOL)


def test_a3po_needs_its_alpha_input():
    lp, b, a, mask = _batch(7, 0.1)
    with pytest.raises(ValueError, match="a3po_alpha"):
        _run("a3po", lp, b, a, mask)


def test_a3po_alpha_interpolates_between_the_versions():
    assert interpolation_weight(0, 1) == 0.0  # the policy is the behavior policy
    assert interpolation_weight(1, 1) == 0.0  # one update ahead: the proximal policy is the behavior policy
    assert interpolation_weight(4, 1) == pytest.approx(3 / 4)
    assert interpolation_weight(8, 2) == pytest.approx(6 / 8)
    with pytest.raises(ValueError, match="staleness"):
        interpolation_weight(-1, 1)
    rows = SimpleNamespace(
        update=11, fresh=[SimpleNamespace(policy_version=6)], extra=[SimpleNamespace(policy_version=2)]
    )
    given = A3POTrainHooks(A3POConfig()).before_update(rows).values[ALPHA]
    assert given == pytest.approx([3 / 4, 7 / 8])  # v_theta = 10: staleness 4 and 8


def test_at_the_behavior_policy_every_correction_is_the_plain_policy_gradient():
    """Ratio 1 everywhere: nothing masked or clipped, ESS 1, loss = -token-mean of A."""
    _, b, a, mask = _batch(8, 0.0)
    want = -sum(float(a[i]) * n for i, n in enumerate(LENGTHS)) / sum(LENGTHS)
    for name in ("seq_is", "seq_snis", "geo_mask", "icepop", "m2po", "a3po"):
        context = LossContext(inputs={ALPHA: torch.full((len(LENGTHS),), 0.5)})
        loss, _, metrics = _run(name, b.clone(), b, a, mask, context=context)
        assert loss == pytest.approx(want, abs=TOL), name
        assert metrics[MASKED_FRAC] == 0.0 and metrics[CLIPPED_FRAC] == 0.0, name
        assert effective_sample_size(metrics[WEIGHT_MEAN], metrics[WEIGHT_SQ_MEAN]) == pytest.approx(1.0), name


@pytest.mark.parametrize("name", ["seq_is", "seq_snis", "geo_mask", "icepop", "m2po", "a3po"])
def test_each_correction_is_registered_and_refuses_the_veto(name):
    assert name in POLICY_LOSSES
    lp, b, a, mask = _batch(9, 0.1)
    with pytest.raises(ValueError, match="veto"):
        _run(name, lp, b, a, mask, veto_enabled=True)


def test_the_bands_are_validated():
    with pytest.raises(ValueError):
        PolicyLossConfig(icepop={"low": 1.5})
    with pytest.raises(ValueError):
        PolicyLossConfig(geo_mask={"high": 0.9})
    assert PolicyLossConfig().m2po.tau == 0.04 and PolicyLossConfig().seq_is.cap == 2.0


def test_a3po_runs_from_the_loss_name_and_its_section_needs_that_loss():
    from mugrpo.config import ConfigError, load_config

    cfg = load_config(None, ["loss.name=a3po"])
    assert cfg.loss.name == "a3po" and cfg.a3po is None  # the section's defaults apply
    assert load_config(None, ["loss.name=a3po", "a3po.proximal_lag=2"]).a3po.proximal_lag == 2
    with pytest.raises(ConfigError, match="only loss.name=a3po uses"):
        load_config(None, ["loss.name=grpo", "a3po.proximal_lag=2"])
