"""The health panel's statistics against hand computations, its exactness over micro-batch cuts (real tiny policy),
the logit variance of the chunked log-softmax, the batch identity, T*eta from the LR schedule, and the learner
temperature's collation."""

from __future__ import annotations

import dataclasses
import hashlib
import math

import pytest
import torch

from bench.support.synthetic import synthetic_rollout_rows
from mugrpo.config import TrainSection
from mugrpo.losses import PolicyLossConfig, loss_clip_range
from mugrpo.policy.logprobs import token_logprobs_from_hidden
from mugrpo.policy.models import load_policy
from mugrpo.policy.truncation import Truncation
from mugrpo.schedules.lr import LRSchedule
from mugrpo.trainer.batch import collate
from mugrpo.trainer.data import Rollout, _to_rollout
from mugrpo.trainer.forward import PolicyTokenLogprobs
from mugrpo.trainer.health import batch_identity, health_panel, token_health_rows


def _rows(w: list[float], logit_var: list[float], outside: list[float]) -> torch.Tensor:
    return torch.tensor(
        [[math.log(x), v, o] for x, v, o in zip(w, logit_var, outside, strict=True)], dtype=torch.float64
    )


def test_panel_matches_a_hand_computation():
    w = [0.5, 1.0, 2.0, 4.0]
    panel = health_panel(_rows(w, [1.0, 2.0, 3.0, 6.0], [1.0, 0.0, 1.0, 1.0]))
    assert panel["ess"] == pytest.approx(7.5**2 / (4 * (0.25 + 1 + 4 + 16)))  # (sum w)^2 / (N sum w^2)
    k3 = [(x - 1) - math.log(x) for x in w]
    assert panel["kl_sampler"] == pytest.approx(sum(k3) / 4)
    # Linear interpolation between order statistics at q (N - 1): 0.03 and 2.97.
    assert panel["sampler_ratio_p1"] == pytest.approx(0.5 + 0.03 * 0.5)
    assert panel["sampler_ratio_p99"] == pytest.approx(2.0 + 0.97 * 2.0)
    assert panel["sampler_ratio_max"] == pytest.approx(4.0)
    assert panel["sampler_clip_frac"] == pytest.approx(0.75)
    assert panel["logit_var"] == pytest.approx(3.0)


def test_panel_edges_equal_weights_huge_ratio_no_clip_range_no_tokens():
    same = health_panel(_rows([1.0] * 5, [0.0] * 5, [0.0] * 5))
    assert same["ess"] == 1.0 and same["kl_sampler"] == 0.0 and same["sampler_clip_frac"] == 0.0
    huge = torch.tensor([[800.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)  # w = e^800 overflows float64
    assert health_panel(huge)["ess"] == pytest.approx(0.5)  # ESS from scaled weights: one dominant of two
    assert health_panel(_rows([1.0, 2.0], [0.0, 0.0], [math.nan, math.nan]))["sampler_clip_frac"] is None
    assert all(v is None for v in health_panel(torch.zeros(0, 3, dtype=torch.float64)).values())


def _rollout(logprobs: list[float], temperature: float = 1.0, **kw) -> Rollout:
    n = len(logprobs)
    return Rollout(
        stage=0,
        policy_version=0,
        prompt_id=kw.pop("prompt_id", "p"),
        sample_idx=kw.pop("sample_idx", 0),
        prompt_token_ids=[1, 2],
        response_token_ids=list(range(3, 3 + n)),
        behavior_logprobs=logprobs,
        reward=0.0,
        advantage=1.0,
        temperature=temperature,
        **kw,
    )


def test_token_rows_use_the_sampler_log_probs_and_each_loss_clip_range():
    """w is taken against ``sampler_logprobs`` (the engine's), not the recompute in ``behavior_logprobs``; the clip
    range is the loss's (grpo: 1 -+ eps, mu_grpo: [ratio_min, ratio_max], agpo: per group, conspo: none)."""
    engine = [math.log(0.5), math.log(0.2), math.log(0.1)]
    rollout = _rollout([math.log(0.4)] * 3, sampler_logprobs=engine)  # recomputed behavior log-probs differ
    batch = collate([rollout, _rollout([math.log(0.5)], prompt_id="q")], [0, 1], pad_token_id=0)
    assert batch.behavior_logprobs[0, 0].item() == pytest.approx(math.log(0.4))
    policy = torch.log(torch.tensor([[0.55, 0.3, 0.3], [0.5, 0.7, 0.7]]))  # pi_theta; row 2 has one real token
    logit_var = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    rows = token_health_rows(batch, policy, logit_var, PolicyLossConfig(name="grpo"))
    expected_w = [1.1, 1.5, 3.0, 1.0]
    assert rows[:, 0].exp().tolist() == pytest.approx(expected_w)
    assert rows[:, 1].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert rows[:, 2].tolist() == [0.0, 1.0, 1.0, 0.0]  # [0.8, 1.2]
    mu = token_health_rows(batch, policy, logit_var, PolicyLossConfig(name="mu_grpo"))
    assert mu[:, 2].tolist() == [0.0, 0.0, 0.0, 0.0]  # [0, 5]
    batch.inputs["clip_eps"] = torch.tensor([0.05, 0.5])
    agpo = token_health_rows(batch, policy, logit_var, PolicyLossConfig(name="agpo"))
    assert agpo[:, 2].tolist() == [1.0, 1.0, 1.0, 0.0]  # row 1: [0.95, 1.05]; row 2: [0.5, 1.5]
    conspo = token_health_rows(batch, policy, logit_var, PolicyLossConfig(name="conspo"))
    assert conspo[:, 2].isnan().all()
    assert loss_clip_range(PolicyLossConfig(name="gspo", eps_low=0.1, eps_high=0.3)) == (0.9, 1.3)
    assert loss_clip_range(PolicyLossConfig(name="agpo")) is None  # per-group ranges: no single one (the audit's view)


def test_panel_is_the_same_for_one_or_three_micro_batches(tiny_model_dir):
    """The panel is computed once on the update's gathered token rows, so cutting the minibatch into 1 or 3
    micro-batches gives bitwise the same values for the same per-token log-probs; with each cut's own forward pass
    they agree up to the fp32 rounding of the forward (the padded width differs)."""
    model, _ = load_policy(tiny_model_dir)
    rows = synthetic_rollout_rows(tiny_model_dir, run_id="h", num_prompts=3, group_size=2, response_tokens=(2, 12))
    gen = torch.Generator().manual_seed(0)
    rollouts = [  # an engine whose log-probs are off by up to 0.2 nats: the weights are not all 1
        dataclasses.replace(
            r, behavior_logprobs=[x + 0.2 * float(torch.rand(1, generator=gen)) for x in r.behavior_logprobs]
        )
        for r in (_to_rollout(row, "test") for row in rows)
    ]
    wrapper = PolicyTokenLogprobs(model, chunk_size=5)
    config = PolicyLossConfig(name="grpo", eps_low=0.05, eps_high=0.05)
    whole = collate(rollouts, list(range(6)), pad_token_id=0)
    whole_var = torch.empty(whole.response_ids.shape)
    with torch.no_grad():
        whole_lp, _ = wrapper(whole, logit_var_out=whole_var)

    def panel(cuts: list[list[int]], forward: bool) -> dict:
        token_rows = []
        for cut in cuts:
            batch = collate([rollouts[i] for i in cut], cut, pad_token_id=0)
            width = batch.response_ids.shape[1]
            if forward:
                logit_var = torch.empty(batch.response_ids.shape)
                with torch.no_grad():
                    logprobs, _ = wrapper(batch, logit_var_out=logit_var)
            else:  # the whole batch's per-token values, re-cut
                logprobs, logit_var = whole_lp[cut, :width], whole_var[cut, :width]
            token_rows.append(token_health_rows(batch, logprobs, logit_var, config))
        return health_panel(torch.cat(token_rows))

    one = panel([[0, 1, 2, 3, 4, 5]], forward=False)
    assert panel([[0, 1], [2, 3], [4, 5]], forward=False) == one
    assert panel([[0, 1], [2, 3], [4, 5]], forward=True) == pytest.approx(one, rel=1e-5)
    assert 0 < one["ess"] < 1 and one["kl_sampler"] > 0 and 0 < one["sampler_clip_frac"] < 1
    assert one["sampler_ratio_p1"] < one["sampler_ratio_p99"] <= one["sampler_ratio_max"]


@pytest.mark.parametrize("truncation", [Truncation(), Truncation(top_k=5)])
def test_logit_variance_of_the_chunked_log_softmax_is_that_of_the_raw_logits(truncation):
    torch.manual_seed(0)
    hidden, weight = torch.randn(2, 5, 8), torch.randn(11, 8)
    targets = (hidden @ weight.t()).argmax(-1)  # in every top-k kept set
    out = torch.empty(2, 5)
    token_logprobs_from_hidden(
        hidden, weight, targets, chunk_size=3, temperature=0.7, truncation=truncation, logit_var_out=out
    )
    expected = (hidden @ weight.t()).var(dim=-1, unbiased=False)  # over the whole vocabulary, untempered
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="logit_var_out has shape"):
        token_logprobs_from_hidden(hidden, weight, targets, logit_var_out=torch.empty(3))


def test_batch_identity_is_stable_order_independent_and_sensitive():
    rollouts = [_rollout([0.0], prompt_id=p, sample_idx=i) for p in ("a", "b") for i in (0, 1)]
    keys = "\n".join(["0/a/0", "0/a/1", "0/b/0", "0/b/1"])
    assert batch_identity(rollouts) == hashlib.sha256(keys.encode()).hexdigest()[:16]
    assert batch_identity(list(reversed(rollouts))) == batch_identity(rollouts)
    assert batch_identity(rollouts[:3]) != batch_identity(rollouts)
    moved = [*rollouts[:3], _rollout([0.0], prompt_id="b", sample_idx=2)]
    assert batch_identity(moved) != batch_identity(rollouts)


def test_t_eta_is_the_sum_of_the_schedule_and_the_same_for_a_fresh_schedule():
    schedule = LRSchedule(1e-3, 3, 20, "cosine")
    expected = math.fsum(schedule.lr(u) for u in range(1, 13))
    assert schedule.cumulative_lr(12) == expected and schedule.cumulative_lr(0) == 0.0
    resumed = LRSchedule(1e-3, 3, 20, "cosine")  # a resumed job builds its schedule anew
    resumed.load_state_dict(schedule.state_dict())
    assert resumed.cumulative_lr(12) == expected
    assert schedule.cumulative_lr(5) == math.fsum(schedule.lr(u) for u in range(1, 6))  # cache read backwards


def test_learner_temperature_collation_and_refusal():
    sampled, greedy = _rollout([0.0], temperature=0.8), _rollout([0.0], temperature=1.0, greedy=True, prompt_id="g")
    default = collate([sampled, greedy], [0, 1], pad_token_id=0)
    assert default.learner_temperatures is None  # the forward uses each row's sampling temperature
    cooled = collate([sampled, greedy], [0, 1], pad_token_id=0, learner_temperature=1.3)
    assert cooled.learner_temperatures.tolist() == pytest.approx([1.3, 1.0])  # greedy rows keep T = 1
    assert cooled.temperatures.tolist() == pytest.approx([0.8, 1.0])
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="learner_temperature"):
            TrainSection(learner_temperature=bad)
