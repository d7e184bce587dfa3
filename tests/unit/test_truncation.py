"""Truncated sampling (min-p / top-k / top-p): the engine samples under it and the trainer replays it, so the
importance ratio of an unchanged policy is 1 (docs/design.md, "Algorithms": behavior log-probs are those of the
distribution actually sampled)."""

from __future__ import annotations

import math

import pytest
import torch

from mugrpo.engines.base import SamplingParams
from mugrpo.engines.transformers_engine import TransformersEngine
from mugrpo.policy.logprobs import token_logprobs_from_hidden, token_logprobs_from_logits
from mugrpo.policy.models import load_policy
from mugrpo.policy.truncation import Truncation, apply_truncation, truncation_threshold
from mugrpo.trainer.batch import collate
from mugrpo.trainer.data import Rollout
from mugrpo.trainer.forward import PolicyTokenLogprobs


def _vllm_reference(logits: torch.Tensor, t: Truncation) -> torch.Tensor:
    """vLLM v1's order written out directly: min-p on the full softmax, then top-k (ties kept), then top-p by sort."""
    logits = logits.clone()
    if t.min_p > 0:
        probs = logits.softmax(-1)
        logits[probs < t.min_p * probs.amax(-1, keepdim=True)] = float("-inf")
    if t.top_k > 0:
        kth = logits.sort(-1, descending=True).values[:, t.top_k - 1 : t.top_k]
        logits[logits < kth] = float("-inf")
    if t.top_p < 1:
        sorted_logits, order = logits.sort(-1)
        drop = sorted_logits.softmax(-1).cumsum(-1) <= 1 - t.top_p
        drop[:, -1] = False
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits


SETTINGS = [
    Truncation(top_p=0.9),
    Truncation(top_p=0.3),
    Truncation(top_k=20),
    Truncation(top_k=1),
    Truncation(min_p=0.05),
    Truncation(top_p=0.8, top_k=50),
    Truncation(top_p=0.9, top_k=20, min_p=0.02),
]


@pytest.mark.parametrize(("vocab", "scale"), [(500, 3.0), (6000, 0.5), (6000, 2.0), (6000, 12.0)])
@pytest.mark.parametrize("truncation", SETTINGS, ids=repr)
def test_kept_set_follows_vllm_order(truncation, vocab, scale):
    """Peaked and flat rows, so top-p resolves from 256 or 4096 candidates or from a full sort (all three paths)."""
    logits = torch.randn(64, vocab, generator=torch.Generator().manual_seed(0)) * scale
    ours = torch.isfinite(apply_truncation(logits, truncation))
    reference = torch.isfinite(_vllm_reference(logits, truncation))
    assert torch.equal(ours, reference)
    assert ours.any(-1).all() and ours.sum() < ours.numel()  # something kept in every row, something cut


def test_no_truncation_is_the_identity_and_threshold_minus_inf():
    logits = torch.randn(3, 10)
    assert apply_truncation(logits, Truncation()) is logits
    assert torch.isinf(truncation_threshold(logits, Truncation())).all()


@pytest.mark.parametrize("bad", [{"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"min_p": 1.0}, {"min_p": -0.1}])
def test_bad_truncation_values_are_rejected(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        Truncation(**bad)


@pytest.mark.parametrize("chunk_size", [1, 3, 64])
@pytest.mark.parametrize("truncation", [Truncation(top_p=0.7), Truncation(top_k=5), SETTINGS[-1]], ids=repr)
def test_chunked_truncated_logprobs_match_the_masked_log_softmax_in_value_and_gradient(chunk_size, truncation):
    gen = torch.Generator().manual_seed(2)
    hidden, weight = torch.randn(2, 6, 16, generator=gen), torch.randn(40, 16, generator=gen) * 0.8
    targets = torch.randint(0, 40, (2, 6), generator=gen)
    grad_lp, grad_ent = torch.randn(2, 6, generator=gen), torch.randn(2, 6, generator=gen)

    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, ent = token_logprobs_from_hidden(
        h1, w1, targets, chunk_size=chunk_size, temperature=0.8, truncation=truncation, return_entropy=True
    )
    ((lp * grad_lp).sum() + (ent * grad_ent).sum()).backward()

    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref_lp, ref_ent = token_logprobs_from_logits(h2 @ w2.t(), targets, 0.8, truncation=truncation, return_entropy=True)
    ((ref_lp * grad_lp).sum() + (ref_ent * grad_ent).sum()).backward()
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    torch.testing.assert_close(h1.grad, h2.grad, atol=1e-5, rtol=0)
    torch.testing.assert_close(w1.grad, w2.grad, atol=1e-5, rtol=0)

    # the reference itself: log_softmax over the kept set (the targets added), entropy of that distribution
    scaled = (hidden @ weight.t()) / 0.8
    flat = scaled.reshape(-1, 40)
    masked = apply_truncation(flat, truncation, always_keep=targets.reshape(-1))
    log_p = masked.log_softmax(-1)
    expected = log_p.gather(-1, targets.reshape(-1, 1)).view(2, 6)
    torch.testing.assert_close(lp.detach(), expected, atol=1e-5, rtol=0)
    expected_ent = -(log_p.exp() * log_p.nan_to_num(neginf=0.0)).sum(-1).view(2, 6)
    torch.testing.assert_close(ent.detach(), expected_ent, atol=1e-5, rtol=0)


def test_a_target_outside_the_current_kept_set_keeps_a_finite_logprob():
    logits = torch.tensor([[[5.0, 4.0, -3.0, -4.0]]], requires_grad=True)
    lp, _ = token_logprobs_from_logits(logits, torch.tensor([[3]]), truncation=Truncation(top_k=1))
    assert math.isfinite(lp.item())
    lp.sum().backward()
    assert logits.grad[0, 0, 1] == 0.0 and logits.grad[0, 0, 2] == 0.0  # outside {top-1, target}: no gradient
    # the target is renormalized with the top-1 token only
    assert lp.item() == pytest.approx(-math.log1p(math.exp(9.0)), abs=1e-5)


# --- update 1 with an unchanged policy: ratio exactly 1 -----------------------------------------------------------


@pytest.fixture(scope="module")
def policy_and_engine(tiny_model_dir):
    model, tokenizer = load_policy(tiny_model_dir)
    return model, TransformersEngine(model, tokenizer, batch_size=8)


GRID = (
    [(t, Truncation(top_p=p)) for t in (0.6, 1.0, 1.2) for p in (1.0, 0.9)]
    + [(t, Truncation(top_k=20)) for t in (0.6, 1.0, 1.2)]
    + [(1.0, Truncation(top_p=0.9, top_k=20, min_p=0.01))]
)


@pytest.mark.parametrize(("temperature", "truncation"), GRID, ids=lambda v: repr(v))
def test_update_one_ratio_is_one_under_truncated_sampling(policy_and_engine, temperature, truncation):
    model, engine = policy_and_engine
    prompts = [[1, 4093, 28, 253, 1015], [1, 9690, 198, 19556, 28, 3, 2213, 30]]
    params = SamplingParams(
        n=2,
        max_new_tokens=12,
        temperature=temperature,
        top_p=truncation.top_p,
        top_k=truncation.top_k,
        min_p=truncation.min_p,
        seed=5,
    )
    samples = [s for group in engine.generate(prompts, params) for s in group]
    rollouts = [
        Rollout(
            0,
            0,
            f"p{i // 2}",
            i % 2,
            prompts[i // 2],
            s.response_token_ids,
            s.behavior_logprobs,
            0.0,
            1.0,
            s.temperature,
            truncation,
        )
        for i, s in enumerate(samples)
    ]
    batch = collate(rollouts, [i // 2 for i in range(len(rollouts))], pad_token_id=2)
    with torch.no_grad():
        logprobs, _ = PolicyTokenLogprobs(model, chunk_size=16)(batch, return_entropy=False)
        ratio = (logprobs - batch.behavior_logprobs).exp()[batch.response_mask]
        assert (ratio - 1).abs().max().item() < 1e-4

        # the bias this fixes: the full softmax scales every ratio by the kept mass
        batch.truncations = [Truncation()] * len(rollouts)
        untruncated, _ = PolicyTokenLogprobs(model, chunk_size=16)(batch, return_entropy=False)
        full_ratio = (untruncated - batch.behavior_logprobs).exp()[batch.response_mask]
    if truncation.active:
        assert full_ratio.mean().item() < 0.99
    else:
        assert (full_ratio - 1).abs().max().item() < 1e-4


# --- the reproduction: generation job at T = 0.7, top_p = 0.9, then one update of the training job -------


def test_generate_then_train_logs_ratio_one_at_update_one_under_top_p(tmp_path, tiny_model_dir):
    from _tiny import DEFAULT, generate_spec, train_spec, with_policy

    from mugrpo.data.datasets import DatasetConfig
    from mugrpo.generation import GenerateSpec, run_generate
    from mugrpo.rewards import RewardConfig
    from mugrpo.storage.layout import RunLayout
    from mugrpo.storage.store import Store
    from mugrpo.trainer.loop import run_training

    root = tmp_path / "store"
    dataset = tmp_path / "train.jsonl"
    dataset.write_text("".join(f'{{"question": "What is {i} + {i}?", "answer": "#### {2 * i}"}}\n' for i in range(4)))
    with_policy(root, tiny_model_dir, "trunc")
    run_generate(
        generate_spec(
            root,
            "trunc",
            seed=1,
            dataset=DatasetConfig(name="sums", path=str(dataset), answer_kind="gsm8k"),
            num_prompts=4,
            shard_size=4,
            sampling={"temperature": 0.7, "top_p": 0.9, "top_k": 0, "max_new_tokens": 8, "n": 2},
            reward=RewardConfig(components={"math_correctness": 1.0}, num_workers=1),
        )
    )
    train = {"updates_per_stage": 1, "checkpoint_every": DEFAULT}
    train["skip_zero_variance_groups"] = False  # a random policy earns no reward; the ratio is what is checked
    run_training(train_spec(root, "trunc", train=train))
    store = Store(str(root))
    import pyarrow.parquet as pq

    steps = pq.read_table(store.local_path(RunLayout("trunc").train_steps_dir(0))).to_pydict()
    rollouts = pq.read_table(store.local_path(RunLayout("trunc").rollouts_dir(0))).to_pydict()
    assert all(p == pytest.approx(0.9) for p in rollouts["top_p"]) and set(rollouts["top_k"]) == {0}
    assert steps["ratio_mean"][0] == pytest.approx(1.0, abs=1e-4)  # 0.951 before the fix (T 0.7, SmolLM2)
    assert abs(steps["approx_kl_behavior"][0]) < 1e-5
