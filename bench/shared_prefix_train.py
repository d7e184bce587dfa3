"""The trainer's shared-prefix forward (``train.shared_prefix``) against the plain one: seconds per micro-batch of
forward + backward on the main job's micro-batches, the two arms alternated in one process, and how far their
results differ.

    python bench/shared_prefix_train.py                    # SmolLM2-135M (fp32 unless --dtype), the main job's prompts
    python bench/shared_prefix_train.py --model tiny --rounds 1 --micro-batches 2   # the quick mode its test runs

A micro-batch is drawn the way the main job's trainer draws one (``configs/smollm2-arithmetic.yaml``: 8 rollouts of
16 prompts x G = 8, single responses shuffled, so mostly different prompts behind the shared system prompt and worked
examples); responses are token ids drawn uniformly from the vocabulary, ``--response-tokens`` long (the main job's
are 32 at most). Per round each arm runs every micro-batch once (the first round's order: plain first; then
alternating), the model's weights untouched (gradients are zeroed, no optimizer step). Reported: median seconds of
forward + backward per micro-batch, the plain / shared ratio, the positions run (the shared prefix counted once),
whether log-probs were bitwise equal, and the largest relative difference of a parameter's gradient.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from engine_throughput import main_job_prompts  # noqa: E402

from mugrpo.policy.models import bench_model_dir, load_policy  # noqa: E402
from mugrpo.trainer.batch import TokenBatch, collate  # noqa: E402
from mugrpo.trainer.data import Rollout  # noqa: E402
from mugrpo.trainer.forward import PolicyTokenLogprobs  # noqa: E402


def main_job_micro_batches(tokenizer, count: int, size: int, response_tokens: tuple[int, int], seed: int):
    """``count`` micro-batches of ``size`` rollouts over 16 main-job prompts x 8 samples, shuffled like single-response
    minibatches."""
    prompts = main_job_prompts(tokenizer, 16)
    rng = np.random.default_rng(seed)
    rows = [(p, s) for p in range(16) for s in range(8)]
    order = rng.permutation(len(rows))
    batches = []
    for b in range(count):
        rollouts = []
        for k in order[b * size : (b + 1) * size]:
            p, s = rows[int(k)]
            n = int(rng.integers(response_tokens[0], response_tokens[1] + 1))
            response = rng.integers(100, len(tokenizer) - 1, size=n).tolist()
            rollouts.append(
                Rollout(
                    stage=0,
                    policy_version=0,
                    prompt_id=str(p),
                    sample_idx=s,
                    prompt_token_ids=prompts[p],
                    response_token_ids=response,
                    behavior_logprobs=[0.0] * n,
                    reward=0.0,
                    advantage=1.0,
                    temperature=1.0,
                )
            )
        batches.append(collate(rollouts, list(range(size)), tokenizer.pad_token_id))
    return batches


def fwd_bwd(model: PolicyTokenLogprobs, batch: TokenBatch, autocast: torch.dtype | None):
    """Seconds, log-probs on real tokens and parameter gradients of one forward + backward (a token-sum loss)."""
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=autocast or torch.float32, enabled=autocast is not None):
        logprobs, _ = model(batch)
    torch.where(batch.response_mask, logprobs, 0.0).sum().backward()
    seconds = time.perf_counter() - t0
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    return seconds, logprobs.detach()[batch.response_mask], grads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 | tiny | an HF model dir")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="bfloat16: autocast")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--response-tokens", type=int, nargs=2, default=(16, 32), metavar=("MIN", "MAX"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", help="default: a temporary folder")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="shared-prefix-"))
    policy, tokenizer = load_policy(bench_model_dir(args.model, workdir))
    policy.train()
    batches = main_job_micro_batches(
        tokenizer, args.micro_batches, args.micro_batch_size, tuple(args.response_tokens), seed=0
    )
    arms = {"plain": PolicyTokenLogprobs(policy, shared_prefix=False), "shared": PolicyTokenLogprobs(policy)}
    autocast = torch.bfloat16 if args.dtype == "bfloat16" else None
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    bitwise, grad_rel = True, 0.0
    for r in range(args.rounds):
        names = list(arms) if r % 2 == 0 else list(reversed(arms))
        for batch in batches:
            out = {}
            for name in names:
                s, lp, grads = fwd_bwd(arms[name], batch, autocast)
                seconds[name].append(s)
                out[name] = (lp, grads)
            bitwise &= torch.equal(out["plain"][0], out["shared"][0])
            for a, b in zip(out["plain"][1], out["shared"][1], strict=True):
                grad_rel = max(grad_rel, float((a - b).norm() / a.norm().clamp_min(1e-30)))
    shared_len = [arms["shared"].shared_length(b) for b in batches]
    positions = {
        "plain": sum(b.input_ids.numel() for b in batches),
        "shared": sum(
            b.input_ids.numel() - (len(b.input_ids) - 1) * n for b, n in zip(batches, shared_len, strict=True)
        ),
    }
    median = {name: statistics.median(v) for name, v in seconds.items()}
    result = {
        "model": args.model, "dtype": args.dtype, "threads": args.threads, "micro_batch_size": args.micro_batch_size,
        "micro_batches": args.micro_batches, "rounds": args.rounds, "shared_prefix_tokens": shared_len,
        "positions": positions, "seconds_per_micro_batch": median, "ratio_plain_over_shared": median["plain"]
        / median["shared"], "logprobs_bitwise_equal": bitwise, "max_grad_rel_diff": grad_rel,
    }  # fmt: skip
    print(f"shared prefix per micro-batch: {shared_len} tokens; positions run {positions['plain']} -> "
          f"{positions['shared']} ({positions['plain'] / positions['shared']:.2f}x fewer)")  # fmt: skip
    for name in arms:
        print(f"{name:>7}: {median[name]:.3f} s per micro-batch (forward + backward, median of {len(seconds[name])})")
    print(f"plain / shared: {result['ratio_plain_over_shared']:.2f}x ({args.dtype}, {args.threads} threads); "
          f"log-probs bitwise equal: {bitwise}; largest relative gradient difference: {grad_rel:.2e}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
