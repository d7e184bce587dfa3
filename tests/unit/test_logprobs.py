"""Chunked token log-probs (mugrpo.policy.logprobs) against the naive full-vocabulary log_softmax path."""

import pytest
import torch

from mugrpo.policy.logprobs import token_logprobs_from_hidden, token_logprobs_from_logits


def _inputs(batch=2, tokens=5, width=16, vocab=50, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, tokens, width, generator=gen, dtype=dtype)
    weight = torch.randn(vocab, width, generator=gen, dtype=dtype) * 0.5
    targets = torch.randint(0, vocab, (batch, tokens), generator=gen)
    return hidden, weight, targets


def _naive(hidden, weight, targets, temperature):
    log_p = torch.log_softmax((hidden @ weight.t()).float() / temperature, dim=-1)
    return log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


@pytest.mark.parametrize("chunk_size", [1, 3, 10, 4096])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_matches_naive_in_value_and_gradient(chunk_size, temperature):
    hidden, weight, targets = _inputs()
    gen = torch.Generator().manual_seed(1)
    grad_lp, grad_ent = torch.randn(2, 5, generator=gen), torch.randn(2, 5, generator=gen)

    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, ent = token_logprobs_from_hidden(
        h1, w1, targets, chunk_size=chunk_size, temperature=temperature, return_entropy=True
    )
    ((lp * grad_lp).sum() + (ent * grad_ent).sum()).backward()

    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref_lp, ref_ent = _naive(h2, w2, targets, temperature)
    ((ref_lp * grad_lp).sum() + (ref_ent * grad_ent).sum()).backward()

    assert lp.dtype == torch.float32 and lp.shape == (2, 5)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
    torch.testing.assert_close(h1.grad, h2.grad, atol=1e-5, rtol=0)
    torch.testing.assert_close(w1.grad, w2.grad, atol=1e-5, rtol=0)


def test_entropy_and_logprobs_match_float64_definition():
    hidden, weight, targets = _inputs(seed=3)
    lp, ent = token_logprobs_from_hidden(hidden, weight, targets, chunk_size=4, return_entropy=True)
    probs = torch.softmax(hidden.double() @ weight.double().t(), dim=-1)
    expected_ent = -(probs * probs.log()).sum(-1)
    expected_lp = probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).log()
    torch.testing.assert_close(ent.double(), expected_ent, atol=1e-5, rtol=0)
    torch.testing.assert_close(lp.double(), expected_lp, atol=1e-5, rtol=0)
    assert (ent > 0).all() and (ent <= torch.log(torch.tensor(50.0)) + 1e-5).all()


def test_logits_path_matches_log_softmax_and_temperature():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 4, 11, generator=gen, requires_grad=True)
    targets = torch.randint(0, 11, (3, 4), generator=gen)
    lp, ent = token_logprobs_from_logits(logits, targets, 2.0, return_entropy=True)
    log_p = torch.log_softmax(logits.detach() / 2.0, dim=-1)
    torch.testing.assert_close(lp, log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(ent, -(log_p.exp() * log_p).sum(-1))
    lp.sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    lp_plain, none = token_logprobs_from_logits(logits, targets)
    assert none is None and not torch.allclose(lp_plain, lp)


def test_entropy_not_requested_and_frozen_head():
    hidden, weight, targets = _inputs(seed=5)
    h = hidden.clone().requires_grad_()
    lp, ent = token_logprobs_from_hidden(h, weight, targets, chunk_size=4)
    assert ent is None
    lp.sum().backward()  # weight needs no grad: only the hidden states get one
    ref_h = hidden.clone().requires_grad_()
    _naive(ref_h, weight, targets, 1.0)[0].sum().backward()
    torch.testing.assert_close(h.grad, ref_h.grad, atol=1e-5, rtol=0)
    assert weight.grad is None


def test_non_contiguous_hidden_slice_like_a_causal_shift():
    hidden, weight, targets = _inputs(tokens=7, seed=6)
    full = hidden.clone().requires_grad_()
    lp, _ = token_logprobs_from_hidden(full[:, 1:-1], weight, targets[:, 2:], chunk_size=3)
    lp.sum().backward()
    ref = hidden.clone().requires_grad_()
    ref_lp, _ = _naive(ref[:, 1:-1], weight, targets[:, 2:], 1.0)
    ref_lp.sum().backward()
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(full.grad, ref.grad, atol=1e-5, rtol=0)
    assert (full.grad[:, 0] == 0).all() and (full.grad[:, -1] == 0).all()


def test_bfloat16_inputs_give_fp32_outputs_close_to_fp32_reference():
    hidden, weight, targets = _inputs(seed=7)
    h = hidden.bfloat16().requires_grad_()
    lp, _ = token_logprobs_from_hidden(h, weight.bfloat16(), targets, chunk_size=4)
    lp.sum().backward()
    assert lp.dtype == torch.float32 and h.grad.dtype == torch.bfloat16
    torch.testing.assert_close(lp, _naive(hidden, weight, targets, 1.0)[0], atol=0.1, rtol=0.02)


def test_autocast_does_not_change_the_fp32_lm_head_and_mixed_dtypes_promote():
    """Under bf16 autocast the LM-head matmul still runs in fp32 (same in forward and backward); a bf16 hidden
    state with an fp32 head is promoted to fp32 and gets a bf16 gradient back."""
    hidden, weight, targets = _inputs(seed=8)
    w = weight.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = token_logprobs_from_hidden(hidden, w, targets, chunk_size=4)
    lp.sum().backward()
    ref_w = weight.clone().requires_grad_()
    ref_lp, _ = _naive(hidden, ref_w, targets, 1.0)
    ref_lp.sum().backward()
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(w.grad, ref_w.grad, atol=1e-5, rtol=0)

    h = hidden.bfloat16().requires_grad_()
    mixed, _ = token_logprobs_from_hidden(h, weight, targets, chunk_size=4)
    mixed.sum().backward()
    torch.testing.assert_close(mixed, _naive(hidden.bfloat16().float(), weight, targets, 1.0)[0], atol=1e-5, rtol=0)
    assert h.grad.dtype == torch.bfloat16


def test_matches_a_real_causal_lm_forward():
    """A tiny randomly initialized Llama (no download): chunked log-probs from its hidden states equal the ones from
    its full logits, and the gradient reaches the (tied) embedding the same way."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    input_ids = torch.randint(0, 97, (2, 9))
    targets = input_ids[:, 1:]

    logits = model(input_ids).logits[:, :-1]
    ref_lp, _ = token_logprobs_from_logits(logits, targets, 0.8)
    ref_lp.sum().backward()
    ref_grad = model.get_input_embeddings().weight.grad.clone()
    model.zero_grad()

    hidden = model.model(input_ids).last_hidden_state[:, :-1]
    lp, _ = token_logprobs_from_hidden(hidden, model.lm_head.weight, targets, chunk_size=5, temperature=0.8)
    lp.sum().backward()
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(model.get_input_embeddings().weight.grad, ref_grad, atol=1e-5, rtol=1e-4)


def test_errors_name_the_problem():
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match=r"target_ids must lie in \[0, 50\)"):
        token_logprobs_from_hidden(hidden, weight, targets + 50)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs_from_hidden(hidden, weight, targets, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        token_logprobs_from_hidden(hidden, weight, targets, chunk_size=0)
    with pytest.raises(ValueError, match="lm_head_weight"):
        token_logprobs_from_hidden(hidden, weight[:, :8], targets)
    with pytest.raises(ValueError, match="target_ids has shape"):
        token_logprobs_from_hidden(hidden, weight, targets[:, :2])
