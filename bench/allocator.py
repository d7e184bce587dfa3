"""A job process's allocator policy (:mod:`mugrpo.common.allocator`) against the C library's defaults: page faults,
kernel time and wall time of the main job's evaluation sampling and training micro-batches.

    python bench/allocator.py                                  # SmolLM2-135M in the precision `auto` picks here
    python bench/allocator.py --dtype float32 --repeats 3
    python bench/allocator.py --model tiny --prompts 8 --micro-batches 1 --repeats 1   # the quick mode its test runs

Each arm is a fresh interpreter (the allocator's settings are per process), alternated ``--repeats`` times (off
first in even rounds, on first in odd ones: this machine's load drifts). In each the same work runs twice, the
second pass measured (the first warms the heap, as a job's first stage does):
- evaluation sampling: the main job's evaluation (``configs/smollm2-arithmetic.yaml``: ``--prompts`` held-out-style
  prompts greedy and a quarter of them x 4 at T = 1, 32 new tokens) in one batch schedule of the transformers engine;
- training: ``--micro-batches`` main-job micro-batches of 8 (bench/shared_prefix_train.py's), forward + backward,
  under bf16 autocast when the dtype is bfloat16 (the trainer's fp32 master weights), else fp32.
Per arm and phase: wall seconds, user and kernel CPU seconds, minor page faults (``getrusage``), and a digest of the
generated token ids and of the gradients, which must be equal between the arms (the policy changes allocation only).
Prints the medians and off / on ratios; writes ``--json``. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

PHASES = ("sampling", "training")
FIELDS = ("wall_s", "user_s", "sys_s", "minor_faults")


def _usage() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_minflt


def _measure(work) -> tuple[dict, str]:
    """Run ``work`` (returns a digest) twice; the second run's figures and its digest."""
    work()
    u0, s0, f0 = _usage()
    t0 = time.perf_counter()
    digest = work()
    wall = time.perf_counter() - t0
    u1, s1, f1 = _usage()
    return {"wall_s": wall, "user_s": u1 - u0, "sys_s": s1 - s0, "minor_faults": f1 - f0}, digest


def child(args) -> dict:
    """One arm in this process: the allocator policy as ``MUGRPO_KEEP_FREED_MEMORY`` says, then both phases."""
    from mugrpo.common.allocator import keep_freed_memory

    applied = keep_freed_memory()
    import torch
    from engine_throughput import main_job_prompts
    from shared_prefix_train import fwd_bwd, main_job_micro_batches

    from mugrpo.engines.base import GenerationRequest, SamplingParams
    from mugrpo.engines.transformers_engine import TransformersEngine
    from mugrpo.policy.models import bench_model_dir, load_policy
    from mugrpo.trainer.forward import PolicyTokenLogprobs

    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir)
    dtype = getattr(torch, args.dtype)
    out = {"applied": applied}

    model_dir = bench_model_dir(args.model, workdir)
    policy, tokenizer = load_policy(model_dir, dtype=dtype)
    engine = TransformersEngine(policy, tokenizer)
    prompts = main_job_prompts(tokenizer, args.prompts)
    requests = [
        GenerationRequest(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=32)),
        GenerationRequest(
            prompts[: max(1, len(prompts) // 4)], SamplingParams(n=4, temperature=1.0, max_new_tokens=32)
        ),
    ]

    def sample() -> str:
        h = hashlib.sha256()
        for result in engine.generate_many(requests):
            for group in result:
                for s in group:
                    h.update(str((s.response_token_ids, s.behavior_logprobs)).encode())
        return h.hexdigest()[:16]

    out["sampling"], out["sampling_digest"] = _measure(sample)
    engine.close()

    policy, tokenizer = load_policy(model_dir)  # fp32 master weights, as the trainer
    policy.train()
    batches = main_job_micro_batches(tokenizer, args.micro_batches, 8, (16, 32), seed=0)
    model = PolicyTokenLogprobs(policy)
    autocast = torch.bfloat16 if args.dtype == "bfloat16" else None

    def train() -> str:
        h = hashlib.sha256()
        for batch in batches:
            _, _, grads = fwd_bwd(model, batch, autocast)
            for g in grads:
                h.update(g.float().numpy().tobytes())
        return h.hexdigest()[:16]

    out["training"], out["training_digest"] = _measure(train)
    return out


def run_arm(arm: str, args) -> dict:
    env = {**os.environ, "MUGRPO_KEEP_FREED_MEMORY": "1" if arm == "on" else "0", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, __file__, "--child", "--model", args.model, "--dtype", args.dtype, "--threads",
           str(args.threads), "--prompts", str(args.prompts), "--micro-batches", str(args.micro_batches),
           "--workdir", args.workdir]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"arm {arm} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 | tiny | an HF model dir")
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16; default: what `auto` picks on this machine")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompts", type=int, default=200, help="greedy prompts (a quarter of them also x 4 at T = 1)")
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workdir", help="default: a temporary folder")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dtype is None:
        from mugrpo.common.hardware import auto_choice
        from mugrpo.config.precision import CHOICES

        args.dtype = CHOICES["model.dtype"][auto_choice()[0]]
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="allocator-bench-")
    if args.child:
        print(json.dumps(child(args)))
        return
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for r in range(args.repeats):
        for arm in ("off", "on") if r % 2 == 0 else ("on", "off"):
            res = run_arm(arm, args)
            runs[arm].append(res)
            print(f"round {r} {arm:>3}: " + "; ".join(
                f"{p} {res[p]['wall_s']:.2f} s wall, {res[p]['sys_s']:.2f} s kernel, {res[p]['minor_faults']:,} faults"
                for p in PHASES), flush=True)  # fmt: skip
    median = {arm: {p: {f: statistics.median(x[p][f] for x in v) for f in FIELDS} for p in PHASES}
              for arm, v in runs.items()}  # fmt: skip
    equal = {p: len({x[f"{p}_digest"] for v in runs.values() for x in v}) == 1 for p in PHASES}
    applied = all(x["applied"] for x in runs["on"]) and not any(x["applied"] for x in runs["off"])
    print(f"\n{args.model}, {args.dtype}, {args.threads} threads, median of {args.repeats} per arm "
          f"(policy applied in the on arm only: {applied})")  # fmt: skip
    print(f"{'phase':>9} {'field':>13} {'off':>12} {'on':>12} {'off / on':>9}")
    for p in PHASES:
        for f in FIELDS:
            off, on = median["off"][p][f], median["on"][p][f]
            print(f"{p:>9} {f:>13} {off:>12,.2f} {on:>12,.2f} {off / on if on else float('inf'):>9.2f}")
        print(f"{p:>9} {'same bits':>13} {str(equal[p]):>12}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs, "median": median,
                                               "same_bits": equal, "applied": applied}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
