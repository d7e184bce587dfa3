"""TransformersEngine and the engine contract, on real models (tiny random policy; SmolLM2 where EOS matters)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from mugrpo.engines import ROLLOUT_ENGINES, Sample, SamplingParams, make_engine
from mugrpo.engines.base import GenerationRequest, generate_requests
from mugrpo.engines.kv_cache import GrowingLayer, kv_bytes_per_token, rows_within_budget
from mugrpo.engines.transformers_engine import (
    TransformersEngine,
    _Item,
    sample_next_tokens,
    top_p_mask,
)
from mugrpo.policy.models import load_policy, response_logprobs
from mugrpo.policy.prefix import shared_prefix_length
from mugrpo.policy.truncation import Truncation

QUESTIONS = ["hi", "What is 2 + 2? Explain every step in detail, please.", "x", "Name three prime numbers."]
# A wide stop set makes the tiny random policy end responses at varied lengths (exercises batch compaction).
MANY_STOP_IDS = tuple(range(100, 4000))


def chat_prompts(tokenizer, questions=QUESTIONS) -> list[list[int]]:
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in questions
    ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> TransformersEngine:
    return TransformersEngine.from_dir(tiny_model_dir, batch_size=8)


@pytest.fixture(scope="module")
def prompts(engine) -> list[list[int]]:
    out = chat_prompts(engine._tokenizer)
    assert len({len(p) for p in out}) > 1, "prompts of different lengths are needed to exercise left padding"
    return out


def flat(groups: list[list[Sample]]) -> list[Sample]:
    return [s for g in groups for s in g]


def max_abs_diff(samples: list[Sample], reference: list[list[float]]) -> float:
    pairs = [zip(s.behavior_logprobs, ref, strict=True) for s, ref in zip(samples, reference, strict=True)]
    return max(abs(a - b) for pair in pairs for a, b in pair)


# --- contract -------------------------------------------------------------------------------------------------------


def test_registry_builds_engines_by_name_and_rejects_unknown(tiny_model_dir):
    eng = make_engine("transformers", tiny_model_dir, batch_size=4)
    assert isinstance(eng, TransformersEngine) and eng.batch_size == 4
    assert {"transformers", "vllm"} <= set(ROLLOUT_ENGINES)
    with pytest.raises(KeyError, match="registered: .*transformers"):
        make_engine("no-such-engine", tiny_model_dir)


def test_sampling_params_validate_and_resolve_per_prompt_temperatures():
    assert SamplingParams(temperature=0.6).temperatures_for(3) == [0.6, 0.6, 0.6]
    assert SamplingParams(temperatures=[0.5, 1.2]).temperatures_for(2) == [0.5, 1.2]
    with pytest.raises(ValueError, match="2 entries but generate got 3 prompts"):
        SamplingParams(temperatures=[0.5, 1.2]).temperatures_for(3)
    with pytest.raises(ValidationError, match="temperatures must be >= 0"):
        SamplingParams(temperatures=[0.5, -1.0])
    with pytest.raises(ValidationError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValidationError):
        SamplingParams(group_size=4)  # unknown keys are rejected (config typos)


def test_sample_requires_one_logprob_per_token():
    with pytest.raises(ValueError, match="2 response tokens but 1 behavior log-probs"):
        Sample([5, 2], [-1.0], "x", "stop", 1.0)
    with pytest.raises(ValueError, match="finish_reason"):
        Sample([5], [-1.0], "x", "eos", 1.0)


def test_bad_prompts_are_rejected_with_their_index(engine):
    with pytest.raises(ValueError, match="prompt 1 has no tokens"):
        engine.generate([[1, 2], []], SamplingParams(n=1, max_new_tokens=2))


# --- sampling primitives --------------------------------------------------------------------------------------------


def test_top_p_mask_follows_vllm_rule():
    probs = torch.tensor([[0.05, 0.25, 0.10, 0.60]])
    kept = torch.isfinite(top_p_mask(probs.log(), 0.7))
    # ascending cumulative mass: 0.05, 0.15, 0.40, 1.0; drop where <= 1 - 0.7 = 0.3 -> keep 0.25 and 0.60
    assert kept.tolist() == [[False, True, False, True]]
    assert torch.isfinite(top_p_mask(probs.log(), 0.01)).sum() == 1  # the top token always survives


def test_sampler_matches_the_tempered_distribution_and_reports_its_logprobs():
    logits = torch.tensor([0.0, 1.0, -1.0, -30.0])
    rows, temperature = 20000, 0.8
    generators = [torch.Generator().manual_seed(i) for i in range(rows)]
    tokens, logprobs = sample_next_tokens(
        logits.repeat(rows, 1), torch.full((rows,), temperature), Truncation(), generators
    )
    expected = torch.softmax(logits / temperature, dim=-1)
    freq = torch.bincount(tokens, minlength=4).double() / rows
    assert torch.allclose(freq, expected.double(), atol=0.015), (freq, expected)
    assert torch.allclose(logprobs, torch.log(expected)[tokens], atol=1e-5)


def test_sampler_with_top_p_samples_only_the_nucleus_and_renormalizes():
    logits = torch.tensor([0.0, 1.0, -1.0, -30.0])
    rows = 4000
    generators = [torch.Generator().manual_seed(i) for i in range(rows)]
    tokens, logprobs = sample_next_tokens(logits.repeat(rows, 1), torch.ones(rows), Truncation(top_p=0.7), generators)
    probs = torch.softmax(logits, dim=-1)  # 0.245, 0.665, 0.090, ~0: nucleus {0, 1}
    assert set(tokens.tolist()) == {0, 1}
    renormalized = probs[:2] / probs[:2].sum()
    assert torch.allclose(logprobs, renormalized.log()[tokens], atol=1e-5)


def test_greedy_rows_take_the_argmax_and_report_untempered_logprobs():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]])
    gens = [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)]
    tokens, logprobs = sample_next_tokens(logits, torch.zeros(2), Truncation(top_p=0.5), gens)
    assert tokens.tolist() == [1, 0]
    assert torch.allclose(logprobs, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])


# --- TransformersEngine ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behavior_logprobs_match_a_teacher_forced_forward(engine, prompts, temperature):
    params = SamplingParams(n=3, max_new_tokens=24, temperature=temperature, seed=5, stop_token_ids=MANY_STOP_IDS)
    groups = engine.generate(prompts, params)
    samples = flat(groups)
    assert [len(g) for g in groups] == [3] * len(prompts)
    lengths = {s.num_tokens for s in samples}
    assert len(lengths) > 2, f"responses should end at varied lengths, got {lengths}"
    reference = response_logprobs(
        engine.model, [p for p in prompts for _ in range(3)], [s.response_token_ids for s in samples], temperature
    )
    assert max_abs_diff(samples, reference) < 1e-4
    for s in samples:
        assert all(math.isfinite(x) and x <= 0 for x in s.behavior_logprobs)
        assert s.temperature == temperature
        ends_on_stop = s.response_token_ids[-1] in set(MANY_STOP_IDS) | {2}
        assert s.finish_reason == ("stop" if ends_on_stop else "length")
        assert s.finish_reason == "stop" or s.num_tokens == 24
        assert s.text == engine._tokenizer.decode(s.response_token_ids, skip_special_tokens=True)


def test_per_prompt_temperatures_are_used_and_recorded(engine, prompts):
    temps = [0.5, 1.3, 0.9, 1.0]
    groups = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=10, temperatures=temps, seed=1))
    assert [{s.temperature for s in g} for g in groups] == [{t} for t in temps]
    samples = flat(groups)
    reference = response_logprobs(
        engine.model,
        [p for p in prompts for _ in range(2)],
        [s.response_token_ids for s in samples],
        [t for t in temps for _ in range(2)],
    )
    assert max_abs_diff(samples, reference) < 1e-4


def test_top_p_logprobs_are_those_of_the_truncated_distribution(engine, prompts):
    params = SamplingParams(n=2, max_new_tokens=8, temperature=1.0, top_p=0.5, seed=3)
    samples = flat(engine.generate(prompts, params))
    full = response_logprobs(
        engine.model, [p for p in prompts for _ in range(2)], [s.response_token_ids for s in samples]
    )
    with torch.inference_mode():
        for sample, prompt, untruncated in zip(samples, [p for p in prompts for _ in range(2)], full, strict=True):
            ids = torch.tensor([prompt + sample.response_token_ids])
            logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            truncated = torch.log_softmax(top_p_mask(logits, 0.5), dim=-1)
            expected = truncated.gather(-1, torch.tensor(sample.response_token_ids)[:, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(sample.behavior_logprobs), expected, atol=1e-4)
            # renormalizing over the nucleus raises each log-prob above the untruncated one
            assert all(b >= u - 1e-5 for b, u in zip(sample.behavior_logprobs, untruncated, strict=True))


def test_greedy_decoding_is_the_teacher_forced_argmax(engine, prompts):
    groups = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=12, temperature=0.0))
    for prompt, group in zip(prompts, groups, strict=True):
        a, b = group
        assert a.response_token_ids == b.response_token_ids  # greedy: the group is G copies
        with torch.inference_mode():
            logits = engine.model(input_ids=torch.tensor([prompt + a.response_token_ids])).logits[0].float()
        predicted = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
        assert a.response_token_ids == predicted
        expected = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)[range(a.num_tokens), predicted]
        assert torch.allclose(torch.tensor(a.behavior_logprobs), expected, atol=1e-4)


def test_same_seed_same_samples_independent_of_batching(tiny_model_dir, engine, prompts):
    params = SamplingParams(n=3, max_new_tokens=8, seed=7, stop_token_ids=MANY_STOP_IDS)
    prompts = prompts[:3]
    first = flat(engine.generate(prompts, params))
    again = flat(engine.generate(prompts, params))
    assert [s.response_token_ids for s in first] == [s.response_token_ids for s in again]
    assert [s.behavior_logprobs for s in first] == [s.behavior_logprobs for s in again]
    other_seed = flat(engine.generate(prompts, params.model_copy(update={"seed": 8})))
    assert [s.response_token_ids for s in first] != [s.response_token_ids for s in other_seed]
    # one prompt's group per forward instead of two: the same tokens (each sample has its own generator)
    rebatched = TransformersEngine(engine.model, engine._tokenizer, batch_size=3)
    assert [s.response_token_ids for s in flat(rebatched.generate(prompts, params))] == [
        s.response_token_ids for s in first
    ]


def test_length_cap_gives_finish_reason_length(engine, prompts):
    samples = flat(engine.generate(prompts[:2], SamplingParams(n=2, max_new_tokens=5, seed=0)))
    assert all(s.num_tokens <= 5 for s in samples)
    assert any(s.finish_reason == "length" and s.num_tokens == 5 for s in samples)


def test_live_model_engine_restores_train_mode_and_closes(tiny_model_dir, prompts):
    model, tokenizer = load_policy(tiny_model_dir)
    model.train()
    with TransformersEngine(model, tokenizer, batch_size=4) as eng:
        eng.generate(prompts[:1], SamplingParams(n=1, max_new_tokens=2))
        assert model.training
    with pytest.raises(RuntimeError, match="closed"):
        eng.generate(prompts[:1], SamplingParams(n=1, max_new_tokens=2))


def test_smollm2_stops_on_eos_which_is_also_its_pad_token(smollm2_dir):
    engine = TransformersEngine.from_dir(smollm2_dir, batch_size=4)
    tokenizer = engine._tokenizer
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 2
    prompts = chat_prompts(tokenizer, ["What is the capital of France? Answer with one word."])
    samples = flat(engine.generate(prompts, SamplingParams(n=3, max_new_tokens=24, temperature=0.7, seed=0)))
    stopped = [s for s in samples if s.finish_reason == "stop"]
    assert stopped, [s.text for s in samples]
    for s in stopped:  # the EOS (= pad) token is part of the response, with a real log-prob
        assert s.response_token_ids[-1] == 2 and math.isfinite(s.behavior_logprobs[-1])
        assert "<|im_end|>" not in s.text
    assert any("Paris" in s.text for s in samples), [s.text for s in samples]
    reference = response_logprobs(engine.model, [prompts[0]] * 3, [s.response_token_ids for s in samples], 0.7)
    assert max_abs_diff(samples, reference) < 1e-4


# --- one batch schedule, batch by memory, the preallocated KV cache -----------------------------------------------


def test_requests_in_one_schedule_get_the_samples_of_their_own_calls(engine, prompts):
    """An evaluation's benchmarks (a greedy k = 1 and a sampled k = 4, different seeds and lengths) share forward
    passes: each gets the samples its own generate call gives."""
    greedy = GenerationRequest(prompts[:3], SamplingParams(temperature=0.0, n=1, max_new_tokens=6, seed=1))
    sampled = GenerationRequest(
        prompts[1:], SamplingParams(temperature=1.0, n=4, max_new_tokens=9, seed=2, stop_token_ids=MANY_STOP_IDS)
    )
    sampled_same_stops = GenerationRequest(prompts[2:], sampled.params.model_copy(update={"seed": 3}))
    requests = [greedy, sampled, sampled_same_stops]
    together = TransformersEngine(engine.model, engine._tokenizer, batch_size=64).generate_many(requests)
    for request, got in zip(requests, together, strict=True):
        alone = engine.generate(request.prompt_token_ids, request.params)
        assert [[s.response_token_ids for s in g] for g in got] == [[s.response_token_ids for s in g] for g in alone]
        assert max_abs_diff(flat(got), [s.behavior_logprobs for s in flat(alone)]) < 1e-5
        assert all(s.num_tokens <= request.params.max_new_tokens for s in flat(got))

    # an engine without generate_many (vLLM's) is called once per request
    class OneCallEngine:
        calls = 0

        def generate(self, prompt_token_ids, params):
            self.calls += 1
            return engine.generate(prompt_token_ids, params)

    one = OneCallEngine()
    assert generate_requests(one, requests) == [engine.generate(r.prompt_token_ids, r.params) for r in requests]
    assert one.calls == len(requests)


def test_auto_batch_fills_rows_up_to_the_kv_budget(engine, prompts):
    params = SamplingParams(n=3, max_new_tokens=8, seed=7, stop_token_ids=MANY_STOP_IDS)
    config = engine.model.config
    per_token = kv_bytes_per_token(config, engine.model.dtype)
    heads = config.num_key_value_heads or config.num_attention_heads
    assert per_token == 2 * config.num_hidden_layers * heads * (config.hidden_size // config.num_attention_heads) * 4
    positions = max(len(p) for p in prompts) + params.max_new_tokens
    # a budget of 7 rows' cache packs two groups of 3 per forward pass; one of 2 rows, one group (never split)
    roomy = TransformersEngine(engine.model, engine._tokenizer, kv_budget_gib=7.5 * per_token * positions / 2**30)
    tight = TransformersEngine(engine.model, engine._tokenizer, kv_budget_gib=2.0 * per_token * positions / 2**30)
    items = [_Item(0, i, p, 1.0, 3, 7, 8) for i, p in enumerate(prompts)]
    assert roomy.rows_per_batch(items) == 7 and [len(b) for b in roomy._batches(items)] == [2, 2]
    assert tight.rows_per_batch(items) == 2 and [len(b) for b in tight._batches(items)] == [1, 1, 1, 1]
    assert rows_within_budget(per_token, positions, 1.0) == 1  # at least one row
    want = [s.response_token_ids for s in flat(engine.generate(prompts, params))]
    assert [s.response_token_ids for s in flat(roomy.generate(prompts, params))] == want
    assert [s.response_token_ids for s in flat(tight.generate(prompts, params))] == want


def test_preallocated_cache_refuses_more_positions_than_its_capacity(tiny_model_dir):
    layer = GrowingLayer(4)
    keys = torch.randn(2, 1, 3, 8)
    k, v = layer.update(keys, keys + 1)
    assert torch.equal(k, keys) and torch.equal(v, keys + 1) and layer.get_seq_length() == 3
    layer.batch_select_indices(torch.tensor([1, 1, 0]))  # a prompt's row repeated into its samples
    k, _ = layer.update(torch.zeros(3, 1, 1, 8), torch.zeros(3, 1, 1, 8))
    assert torch.equal(k[:, :, :3], keys[[1, 1, 0]]) and k.shape == (3, 1, 4, 8)
    with pytest.raises(RuntimeError, match="holds 4 positions; 5 were written"):
        layer.update(torch.zeros(3, 1, 1, 8), torch.zeros(3, 1, 1, 8))


def test_batch_size_must_be_positive_or_auto(engine):
    for bad in (0, -1, "many", 2.5):
        with pytest.raises(ValueError, match="batch_size must be an int >= 1 or 'auto'"):
            TransformersEngine(engine.model, engine._tokenizer, batch_size=bad)
    with pytest.raises(ValueError, match="kv_budget_gib must be > 0"):
        TransformersEngine(engine.model, engine._tokenizer, kv_budget_gib=0)


def test_a_shared_prompt_prefix_is_prefilled_once_with_the_same_samples(engine, prompts):
    """Prompts that share a prefix (the main job's system prompt and worked examples) get it prefilled once: the
    same tokens as prefilling each prompt whole, log-probs equal up to float round-off."""
    preamble = prompts[1][:-1] * 2  # a long shared prefix, then each prompt
    shared = [preamble + p for p in prompts]
    assert shared_prefix_length(shared) == len(preamble) + shared_prefix_length(prompts)
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # each keeps one token of its own
    params = SamplingParams(n=3, max_new_tokens=8, seed=5, stop_token_ids=MANY_STOP_IDS)
    whole = TransformersEngine(engine.model, engine._tokenizer)
    whole.min_shared_prefix = 10**9  # never shares
    once = TransformersEngine(engine.model, engine._tokenizer)
    once.min_shared_prefix = 1
    want, got = flat(whole.generate(shared, params)), flat(once.generate(shared, params))
    assert [s.response_token_ids for s in got] == [s.response_token_ids for s in want]
    assert max_abs_diff(got, [s.behavior_logprobs for s in want]) < 1e-5
    greedy = SamplingParams(temperature=0.0, n=1, max_new_tokens=8)
    assert [s.response_token_ids for s in flat(once.generate(shared, greedy))] == [
        s.response_token_ids for s in flat(whole.generate(shared, greedy))
    ]
