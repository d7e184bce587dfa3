"""This machine's matmul ceiling: GFLOP/s of an N^3 matmul in fp32 and bf16 (best of a few), at torch's threads.

    python bench/matmul_ceiling.py                 # 2048^3, torch's default thread count
    python bench/matmul_ceiling.py --size 1024 --threads 1

The other benches call :func:`matmul_gflops` in a subprocess at their own thread count, before and after their
arms, so a bf16 / fp32 speedup of a job reads against what the hardware gives a plain matmul in the same run.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def matmul_gflops(size: int = 2048, repeats: int = 5) -> dict[str, float]:
    """{"float32": GFLOP/s, "bfloat16": GFLOP/s} of a size^3 matmul (2 size^3 FLOP), best of ``repeats``."""
    out = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        a @ b  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        out[name] = 2 * size**3 / best / 1e9
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="print JSON only")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = matmul_gflops(args.size, args.repeats)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{args.size}^3 matmul, {torch.get_num_threads()} threads: fp32 {result['float32']:.0f} GFLOP/s, "
            f"bf16 {result['bfloat16']:.0f} GFLOP/s (x{result['bfloat16'] / result['float32']:.2f})"
        )


if __name__ == "__main__":
    main()
