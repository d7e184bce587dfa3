"""The trainer's shared-prefix forward (``train.shared_prefix``, :mod:`mugrpo.policy.prefix`) against the plain one,
on the tiny random policy (CPU, fp32 and bf16 autocast): the same log-probs, entropies and logit variances bit for
bit, and gradients equal up to fp32 summation order (under bf16 autocast: within a fraction of bf16's own error),
for micro-batches of different prompts behind a shared preamble (the main job's system prompt and worked examples)
and of one group (a whole prompt shared).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bench.support.synthetic import synthetic_rollout_rows
from mugrpo.policy.models import load_policy
from mugrpo.trainer.batch import TokenBatch, collate
from mugrpo.trainer.data import _to_rollout
from mugrpo.trainer.forward import PolicyTokenLogprobs
from mugrpo.trainer.setup import enable_activation_checkpointing

PREAMBLE = "System: answer in a box. Example: what is 7 plus 5? 7 + 5 = 12, so the answer is 12. Now the question."


def _batch(tiny_model_dir, *, one_group: bool) -> tuple[TokenBatch, list[int]]:
    """Six rollouts, collated, and their prompt lengths: three prompts x two responses behind a shared preamble, or
    (``one_group``) one prompt x six. One response is empty (a row with nothing to score must not break the gather)."""
    _, tokenizer = load_policy(tiny_model_dir)
    preamble = tokenizer(PREAMBLE, add_special_tokens=False)["input_ids"]
    prompts, group_size = (1, 6) if one_group else (3, 2)
    rows = synthetic_rollout_rows(
        tiny_model_dir, run_id="prefix", num_prompts=prompts, group_size=group_size, response_tokens=(2, 12)
    )
    rollouts = [
        dataclasses.replace(r, prompt_token_ids=preamble + r.prompt_token_ids)
        for r in (_to_rollout(row, "test") for row in rows)
    ]
    rollouts[1] = dataclasses.replace(rollouts[1], response_token_ids=[], behavior_logprobs=[])
    batch = collate(rollouts, [i // group_size for i in range(len(rollouts))], tokenizer.pad_token_id)
    return batch, [len(r.prompt_token_ids) for r in rollouts]


def _run(model: PolicyTokenLogprobs, batch: TokenBatch, autocast: bool):
    """Log-probs, entropy, logit variance and the parameter gradients of a token-sum loss over the real tokens."""
    model.zero_grad(set_to_none=True)
    logit_var = torch.empty(batch.response_ids.shape, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logprobs, entropy = model(batch, logit_var_out=logit_var)
    weights = torch.linspace(-1.0, 1.0, logprobs.numel()).view_as(logprobs)
    (torch.where(batch.response_mask, logprobs * weights, 0.0)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    mask = batch.response_mask
    return logprobs.detach()[mask], entropy[mask], logit_var[mask], grads


@pytest.mark.parametrize("one_group", [False, True], ids=["preamble", "one-group"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_shared_prefix_forward_equals_the_full_forward(tiny_model_dir, one_group, autocast):
    policy, _ = load_policy(tiny_model_dir)
    batch, prompt = _batch(tiny_model_dir, one_group=one_group)
    shared, full = (
        PolicyTokenLogprobs(policy, chunk_size=16),
        PolicyTokenLogprobs(policy, chunk_size=16, shared_prefix=False),
    )
    length = shared.shared_length(batch)
    if one_group:  # the whole prompt but the last token, whose output predicts the first response token
        assert len(set(prompt)) == 1 and length == prompt[0] - 1
    else:  # the preamble and the synthetic prompts' common first words, never a row's last prompt token
        ids = batch.input_ids
        assert 16 <= length < min(prompt) and (ids[:, :length] == ids[:1, :length]).all()
        assert not (ids[:, length] == ids[0, length]).all()
    assert full.shared_length(batch) == 0
    lp_s, ent_s, var_s, grad_s = _run(shared, batch, autocast)
    lp_f, ent_f, var_f, grad_f = _run(full, batch, autocast)
    assert torch.equal(lp_s, lp_f) and torch.equal(ent_s, ent_f) and torch.equal(var_s, var_f)
    assert grad_s.keys() == grad_f.keys() and len(grad_s) > 0
    if not autocast:  # the prefix's gradient is summed over rows before its backward: another fp32 order
        for name in grad_f:
            torch.testing.assert_close(grad_s[name], grad_f[name], rtol=1e-4, atol=1e-6, msg=name)
        return
    # Under bf16 autocast that sum is rounded to bf16 once (the keys and values are bf16): the gradients move by
    # ~0.5%, well inside bf16's own error against fp32 (~3% here), the yardstick this test holds them to.
    grad_fp32 = _run(full, batch, autocast=False)[3]
    for name in grad_f:
        moved = (grad_s[name] - grad_f[name]).norm() / grad_f[name].norm()
        assert moved < 0.5 * (grad_fp32[name] - grad_f[name]).norm() / grad_f[name].norm(), name


def test_short_or_single_row_prefixes_run_whole(tiny_model_dir):
    policy, _ = load_policy(tiny_model_dir)
    batch, _ = _batch(tiny_model_dir, one_group=False)
    model = PolicyTokenLogprobs(policy)
    length = model.shared_length(batch)
    model.min_shared_prefix = length + 1
    assert model.shared_length(batch) == 0  # fewer shared tokens than the minimum
    model.min_shared_prefix = 1
    one_row = dataclasses.replace(batch, input_ids=batch.input_ids[:1])
    assert model.shared_length(one_row) == 0


def test_activation_checkpointing_runs_rows_whole(tiny_model_dir):
    """HF's checkpointed layers drop the KV cache while recomputing, so the trainer runs every row whole there: the
    same log-probs and gradients as the plain forward with checkpointing, and no shared prefix is used."""
    policy, _ = load_policy(tiny_model_dir)
    enable_activation_checkpointing(policy)
    policy.train()
    batch, _ = _batch(tiny_model_dir, one_group=False)
    shared, full = (
        PolicyTokenLogprobs(policy, chunk_size=16),
        PolicyTokenLogprobs(policy, chunk_size=16, shared_prefix=False),
    )
    shared.train(), full.train()
    assert shared.shared_length(batch) == 0
    with torch.no_grad():
        assert shared.shared_length(batch) > 0  # no backward to replay: the prefix is shared
    lp_s, _, _, grad_s = _run(shared, batch, autocast=False)
    lp_f, _, _, grad_f = _run(full, batch, autocast=False)
    assert torch.equal(lp_s, lp_f)
    assert all(torch.equal(grad_s[n], grad_f[n]) for n in grad_f)
