"""AdamW's step by implementation (``train.optimizer_impl``: for-loop, foreach, fused): seconds per step on the main
job's policy, the arms alternated in one process, and how far their weights differ after the same steps.

    python bench/optimizer_step.py                              # SmolLM2-135M in fp32 (272 tensors, 134.5 M weights)
    python bench/optimizer_step.py --model tiny --steps 2 --rounds 1   # the quick mode its test runs

Each arm owns a copy of the policy's weights and its own AdamW (the trainer's ``build_optimizer``, the main job's
lr 5e-6, betas and decay). Per round each arm takes ``--steps`` steps with the same seeded gradients (the first
round's order: for-loop, foreach, fused; then reversed, and so on); the first round's first step is a warm-up and
not timed. Reported: median seconds per step, each arm's ratio against the for-loop step (torch's own choice on the
CPU, which ``auto``, the default, keeps: torch.optim picks foreach only for CUDA tensors), whether foreach's weights
are bitwise the for-loop's, and the largest absolute difference of fused's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mugrpo.config import TrainSection  # noqa: E402
from mugrpo.policy.models import bench_model_dir, load_model  # noqa: E402
from mugrpo.trainer.optim import build_optimizer  # noqa: E402

ARMS = ("for-loop", "foreach", "fused")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 | tiny | an HF model dir")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--steps", type=int, default=4, help="steps per arm and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", help="default: a temporary folder")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="optimizer-step-"))
    model = load_model(bench_model_dir(args.model, workdir))
    base = [p.detach().clone() for p in model.parameters()]
    params = {arm: [torch.nn.Parameter(t.clone()) for t in base] for arm in ARMS}
    optimizers = {arm: build_optimizer(params[arm], TrainSection(lr=5.0e-6, optimizer_impl=arm)) for arm in ARMS}
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for r in range(args.rounds):
        for arm in ARMS if r % 2 == 0 else tuple(reversed(ARMS)):
            g = torch.Generator().manual_seed(r)  # every arm gets the same gradients in a round
            for step in range(args.steps):
                for p in params[arm]:
                    p.grad = torch.randn(p.shape, generator=g).mul_(1e-3)
                t0 = time.perf_counter()
                optimizers[arm].step()
                if r or step:
                    seconds[arm].append(time.perf_counter() - t0)
    # each arm took the same gradients in the same order (round r's generator seeded r): compare their weights
    median = {arm: statistics.median(v) for arm, v in seconds.items()}
    bitwise = all(torch.equal(a, b) for a, b in zip(params["for-loop"], params["foreach"], strict=True))
    fused_diff = max(float((a - b).abs().max()) for a, b in zip(params["for-loop"], params["fused"], strict=True))
    result = {
        "model": args.model, "threads": args.threads, "tensors": len(base),
        "weights_millions": sum(t.numel() for t in base) / 1e6, "steps": args.steps, "rounds": args.rounds,
        "seconds_per_step": median, "ratio_over_for_loop": {a: median["for-loop"] / median[a] for a in ARMS},
        "foreach_bitwise_equal_to_for_loop": bitwise, "fused_max_abs_diff": fused_diff,
    }  # fmt: skip
    print(f"{result['tensors']} tensors, {result['weights_millions']:.1f} M weights, fp32, {args.threads} threads")
    for arm in ARMS:
        print(f"{arm:>8}: {median[arm]:.3f} s per step (median of {len(seconds[arm])}), "
              f"{result['ratio_over_for_loop'][arm]:.2f}x the for-loop step")  # fmt: skip
    print(f"foreach bitwise equal to for-loop: {bitwise}; fused's largest weight difference: {fused_diff:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
