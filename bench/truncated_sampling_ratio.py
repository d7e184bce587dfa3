"""Importance ratio at update 1 (policy unchanged) under truncated sampling, with and without the trainer's replay.

    python bench/truncated_sampling_ratio.py                 # SmolLM2-135M-Instruct, 8 GSM8K prompts x G=2
    python bench/truncated_sampling_ratio.py --model tiny --quick

For each sampling setting, the transformers engine samples responses (behavior log-probs under the truncated,
renormalized distribution, as vLLM's processed_logprobs), then the trainer's forward (:class:`PolicyTokenLogprobs`)
recomputes the log-probs two ways, alternated in this one invocation: with the rows' truncation replayed (the
product) and over the full softmax (a trainer that ignores the truncation). Printed per setting: the token-mean
ratio, the largest |ratio - 1|, the token-mean approx KL to the behavior policy, and the forward time of each
arm (the replay sorts the vocabulary for top-p). Nothing is asserted; tests/unit/test_truncation.py holds the checks.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from mugrpo.data.prompts import PromptConfig, encode_prompt, render_prompt
from mugrpo.engines.base import SamplingParams
from mugrpo.engines.transformers_engine import TransformersEngine
from mugrpo.policy.models import bench_model_dir, load_policy
from mugrpo.policy.truncation import Truncation
from mugrpo.trainer.batch import collate
from mugrpo.trainer.data import Rollout
from mugrpo.trainer.forward import PolicyTokenLogprobs

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"
SETTINGS = [
    (0.7, Truncation(top_p=0.9)),  # the quick config's setting (ratio_mean 0.951 over the full softmax)
    (0.6, Truncation()),
    (1.0, Truncation(top_p=0.9)),
    (1.2, Truncation(top_p=0.9)),
    (1.0, Truncation(top_k=20)),
    (1.0, Truncation(min_p=0.05)),
    (1.0, Truncation(top_p=0.95, top_k=50, min_p=0.02)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny, or an HF model dir")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two arms per setting")
    parser.add_argument("--quick", action="store_true", help="2 prompts, 8 tokens, 3 settings")
    args = parser.parse_args()
    prompts_n, tokens, settings = args.prompts, args.max_new_tokens, SETTINGS
    if args.quick:
        prompts_n, tokens, settings = 2, 8, SETTINGS[:3]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = load_policy(bench_model_dir(args.model, Path(tmp)))
    questions = [json.loads(line)["question"] for line in DATA.read_text().splitlines()[:prompts_n]]
    prompts = [encode_prompt(tokenizer, render_prompt(tokenizer, q, PromptConfig())) for q in questions]
    engine = TransformersEngine(model, tokenizer, batch_size=32)
    forward = PolicyTokenLogprobs(model, chunk_size=512)
    print(f"model {args.model}, {prompts_n} prompts x G=2, <= {tokens} new tokens", flush=True)
    print(
        f"{'T':>4} {'truncation':44s} {'arm':10s} {'ratio mean':>10s} {'max|r-1|':>9s} {'approx KL':>10s} {'fwd s':>6s}"
    )
    for temperature, truncation in settings:
        params = SamplingParams(
            n=2,
            max_new_tokens=tokens,
            temperature=temperature,
            top_p=truncation.top_p,
            top_k=truncation.top_k,
            min_p=truncation.min_p,
            seed=1,
        )
        samples = [(i, s) for i, group in enumerate(engine.generate(prompts, params)) for s in group]
        rows = [
            Rollout(
                0,
                0,
                f"p{i}",
                j % 2,
                prompts[i],
                s.response_token_ids,
                s.behavior_logprobs,
                0.0,
                0.0,
                s.temperature,
                truncation,
            )
            for j, (i, s) in enumerate(samples)
        ]
        batch = collate(rows, [i for i, _ in samples], pad_token_id=tokenizer.pad_token_id)
        for arm, replay in [("replay", True), ("full", False)] * args.rounds:
            batch.truncations = [truncation if replay else Truncation()] * len(rows)
            start = time.perf_counter()
            with torch.no_grad():
                logprobs, _ = forward(batch, return_entropy=False)
            seconds = time.perf_counter() - start
            log_ratio = (logprobs - batch.behavior_logprobs)[batch.response_mask]
            ratio = log_ratio.exp()
            approx_kl = (ratio - 1 - log_ratio).mean().item()  # k3 estimator, as the losses report it
            print(
                f"{temperature:4.1f} {truncation!r:44s} {arm:10s} {ratio.mean().item():10.4f} "
                f"{(ratio - 1).abs().max().item():9.2e} {approx_kl:10.2e} {seconds:6.2f}"
            )


if __name__ == "__main__":
    main()
