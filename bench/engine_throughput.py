"""The transformers engine's tokens/s on the main job's prompts, by thread count and batch size, before and after.

    python bench/engine_throughput.py                          # SmolLM2-135M, threads 1 2, batches 8..256 + auto
    python bench/engine_throughput.py --before HEAD~1 --dtype bfloat16 --batches 8 --threads 2
    python bench/engine_throughput.py --quick                  # tiny policy, plumbing (the test runs this)
    python bench/engine_throughput.py --vllm-python .venv-vllm/bin/python --threads 2 --batches auto   # + vLLM

Prompts: ``configs/smollm2-arithmetic.yaml``'s (reasoning-gym two-digit arithmetic with its two worked examples,
~103 tokens), G = 8, 32 new tokens at T = 1, as the main job's generation. Each cell is ONE forward schedule of
``batch`` rows (batch / G prompts; ``auto``: 256 rows, as many passes as the engine's KV budget packs them into), so a
cell's tokens/s is the engine's rate at that batch size. Arms:

- ``before``: the engine module as it was at git revision ``--before`` (``git show REV:mugrpo/engines/
  transformers_engine.py``, imported beside the current one: the growing ``DynamicCache``, noise drawn for every row);
- ``after``: the engine of this tree (the preallocated KV cache of :mod:`mugrpo.engines.kv_cache`, no noise for greedy
  rows, one batch schedule; ``auto`` batch from the KV budget).

Both arms run in this process, alternated per cell (before first in even cells, after first in odd ones: this
machine's load drifts), best of ``--repeats``. A cell's FLOPs are 2 x the policy's matmul parameters per token
processed (each prompt prefilled once, then every generated token; attention's own FLOPs left out), so the fraction of
the machine is FLOP/s over the matmul ceiling measured at the same thread count (bench/matmul_ceiling.py, 1024^3,
before and after the cells, the better one). Prints the table and the after/before ratio per cell; writes ``--json``.

With ``--vllm-python``, vLLM's CPU engine samples the same prompts in the same run: the product's ``VLLMEngine``
(its CPU defaults: eager, a 2 GiB KV cache, its own thread binding) in its virtualenv's interpreter, through
bench/support/engine_probe.py, ``--repeats`` + 1 timed calls of the ``auto`` cell's rows after an untimed warm-up
(best one), engine start excluded; then the transformers engine's ``auto`` cell at the last thread count again (best of
the two passes), so the two are side by side in time. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from matmul_ceiling import matmul_gflops  # noqa: E402

from mugrpo.config import load_config  # noqa: E402
from mugrpo.data.datasets import load_problems  # noqa: E402
from mugrpo.data.prompts import encode_prompt, render_prompt  # noqa: E402
from mugrpo.engines.base import SamplingParams  # noqa: E402
from mugrpo.engines.transformers_engine import TransformersEngine  # noqa: E402
from mugrpo.policy.models import bench_model_dir, load_policy  # noqa: E402

ENGINE_PATH = "mugrpo/engines/transformers_engine.py"
MAIN_CONFIG = REPO / "configs" / "smollm2-arithmetic.yaml"
#: The engine before the preallocated KV cache and the auto batch (the last commit with the growing cache).
BEFORE = "a136c48"
AUTO_ROWS = 256  # rows of an "auto" cell (the engine picks how many passes)


def engine_at(revision: str):
    """The TransformersEngine class of ``revision`` (its module source from git, imported under another name)."""
    source = subprocess.run(
        ["git", "show", f"{revision}:{ENGINE_PATH}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="engine-before-")) / "engine_before.py"
    path.write_text(source.replace('ROLLOUT_ENGINES.register("transformers")', 'ROLLOUT_ENGINES.register("before")'))
    spec = importlib.util.spec_from_file_location("engine_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TransformersEngine


def main_job_prompts(tokenizer, count: int) -> list[list[int]]:
    """``count`` training prompts of the main job, rendered with its prompt config (worked examples included)."""
    cfg = load_config(MAIN_CONFIG)
    problems = load_problems(cfg.data.train)[0][:count]
    return [encode_prompt(tokenizer, render_prompt(tokenizer, p.question, cfg.data.prompt)) for p in problems]


def matmul_parameters(model) -> int:
    """Parameters a token's forward multiplies by: all of them but the input embedding, unless it is tied to the LM
    head (SmolLM2: tied, so the 28M-parameter matrix counts once, as the head)."""
    total = sum(p.numel() for p in model.parameters())
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return total if embed.data_ptr() == head.data_ptr() else total - embed.numel()


def cell(engine, prompts, params, batch) -> tuple[float, int, int]:
    """Seconds, generated tokens and prompt tokens of one schedule of ``batch`` rows."""
    rows = AUTO_ROWS if batch == "auto" else batch
    chosen = prompts[: max(1, rows // params.n)]
    engine.batch_size = batch if batch == "auto" else max(batch, params.n)
    t0 = time.perf_counter()
    groups = engine.generate(chosen, params)
    seconds = time.perf_counter() - t0
    return seconds, sum(s.num_tokens for g in groups for s in g), sum(len(p) for p in chosen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 | tiny | an HF model dir")
    ap.add_argument("--before", default=BEFORE, help="git revision of the before engine")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batches", nargs="+", default=["8", "32", "64", "128", "256", "auto"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--n", type=int, default=8, help="group size G")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="tiny policy, threads 1, batches 8 and auto, 4 new tokens")
    ap.add_argument("--vllm-python", help="the vLLM virtualenv's interpreter: vLLM's CPU engine on the same prompts")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.quick:
        args.model, args.threads, args.batches, args.max_new_tokens = "tiny", [1], ["8", "auto"], 4
    batches = [b if b == "auto" else int(b) for b in args.batches]
    dtype = getattr(torch, args.dtype)

    work = Path(tempfile.mkdtemp(prefix="engine-throughput-"))
    model_dir = bench_model_dir(args.model, work)
    model, tokenizer = load_policy(model_dir, dtype=dtype)
    before_cls = engine_at(args.before)
    arms = {
        "before": before_cls(model, tokenizer, batch_size=64),
        "after": TransformersEngine(model, tokenizer),
    }
    prompts = main_job_prompts(tokenizer, max([AUTO_ROWS, *(b for b in batches if b != "auto")]) // args.n + 1)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, n=args.n, seed=0)
    flop_per_token = 2 * matmul_parameters(model)
    results = {"model": args.model, "dtype": args.dtype, "before": args.before, "n": args.n, "cells": []}
    print(f"{args.model} {args.dtype}, G = {args.n}, {args.max_new_tokens} new tokens, prompts "
          f"{sum(map(len, prompts)) / len(prompts):.0f} tokens on average; before = {args.before}")  # fmt: skip
    for threads in args.threads:
        torch.set_num_threads(threads)
        peak = matmul_gflops(1024, 3)[args.dtype]
        for arm in arms.values():  # warm-up
            cell(arm, prompts, params.model_copy(update={"max_new_tokens": 2}), 8)
        rows = []
        for i, batch in enumerate(batches):
            order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
            best = {}
            for _ in range(args.repeats):
                for name in order:
                    if name == "before" and batch == "auto":
                        continue  # the old engine has no auto batch
                    seconds, tokens, prefill = cell(arms[name], prompts, params, batch)
                    if name not in best or seconds < best[name][0]:
                        best[name] = (seconds, tokens, prefill)
            row = {"threads": threads, "batch": batch}
            for name, (seconds, tokens, prefill) in best.items():
                row[name] = {
                    "seconds": seconds,
                    "tokens": tokens,
                    "tokens_per_s": tokens / seconds,
                    "gflop_per_s": flop_per_token * (tokens + prefill) / seconds / 1e9,
                }
            rows.append(row)
        peak = max(peak, matmul_gflops(1024, 3)[args.dtype])
        for row in rows:
            row["matmul_peak_gflop_per_s"] = peak
            for name in ("before", "after"):
                if name in row:
                    row[name]["peak_fraction"] = row[name]["gflop_per_s"] / peak
        results["cells"].extend(rows)
        print(f"\nthreads {threads} (matmul ceiling {peak:.0f} GFLOP/s {args.dtype})")
        print(f"{'batch':>6} | {'before tok/s':>12} | {'after tok/s':>11} | {'after/before':>12} | {'of peak':>13}")
        for row in rows:
            b, a = row.get("before"), row["after"]
            ratio = f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x" if b else "-"
            before = f"{b['tokens_per_s']:.0f}" if b else "-"
            frac = f"{b['peak_fraction']:.0%} -> {a['peak_fraction']:.0%}" if b else f"{a['peak_fraction']:.0%}"
            print(f"{row['batch']!s:>6} | {before:>12} | {a['tokens_per_s']:>11.0f} | {ratio:>12} | {frac:>13}")
    if args.vllm_python:
        results["vllm"] = vllm_side_by_side(args, model_dir, prompts, params, arms["after"], work)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    shutil.rmtree(work, ignore_errors=True)


def vllm_side_by_side(args, model_dir: Path, prompts, params, engine, work: Path) -> dict:
    """vLLM's CPU engine and this tree's transformers engine on the ``auto`` cell's rows, one after the other
    (module docstring); prints both and their ratio."""
    from engines import run_probe

    rows = AUTO_ROWS
    chosen = prompts[: rows // params.n]
    probe = {
        "engine": "vllm", "model_dir": str(model_dir), "dtype": args.dtype, "threads": args.threads[-1],
        "sizes": [rows], "group_size": params.n, "max_new_tokens": params.max_new_tokens, "calls": args.repeats + 1,
        "syncs": 0, "prompt_token_ids": chosen, "temperature": params.temperature, "seed": 0,
    }  # fmt: skip
    rec = run_probe(args.vllm_python, probe, work, args.threads[-1])
    vllm_tps = max(c["tokens"] / c["seconds"] for c in rec["calls"])
    ours = min((cell(engine, prompts, params, "auto") for _ in range(2)), key=lambda c: c[0])  # the faster pass
    ours_tps = ours[1] / ours[0]
    print(f"\nvLLM's CPU engine on the same {rows} rows ({args.dtype}, eager, its own threads; start "
          f"{rec['start_s']:.0f} s, excluded): {vllm_tps:.0f} tok/s; the transformers engine, auto at "
          f"{args.threads[-1]} threads, right after: {ours_tps:.0f} tok/s; transformers / vLLM "
          f"{ours_tps / vllm_tps:.2f}x")  # fmt: skip
    return {"rows": rows, "vllm_tokens_per_s": vllm_tps, "vllm_start_s": rec["start_s"], "vllm_calls": rec["calls"],
            "transformers_tokens_per_s": ours_tps, "threads": args.threads[-1]}  # fmt: skip


if __name__ == "__main__":
    main()
