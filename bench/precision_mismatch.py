"""Sampler-vs-trainer mismatch by precision: importance-ratio stats at update 1 (policy unchanged), one invocation.

    python bench/precision_mismatch.py                                  # SmolLM2-135M, 8 GSM8K prompts x G=4, 64 tokens
    python bench/precision_mismatch.py --model tiny --prompts 2 --n 2 --max-new-tokens 8    # smoke run
    python bench/precision_mismatch.py --engine vllm --vllm-python .venv-vllm/bin/python   # vLLM samples

One small real stage per sampler arm: the transformers engine samples GSM8K prompts (T = 1, top_p = 1, the same
seeds in every arm) with fp32 weights, bf16 weights, or bf16 weights with an fp32 LM head (``fp32_logits``). The
trainer then computes the log-probs of the same tokens exactly as the training job does (right-padded
micro-batches in a shuffled order, :class:`mugrpo.trainer.forward.PolicyTokenLogprobs` over fp32 master weights)
without autocast or under bf16 autocast. The ratio exp(trainer - behavior) is what update 1 of a stage sees with
the sampler's behavior log-probs. The last arm, ``recompute``, is ``train.recompute_behavior_logprobs``: the
behavior log-probs are the trainer's own (recomputed in data order, ``micro_batch_size`` at a time, as
:func:`mugrpo.trainer.loop.recompute_logprobs` does) and the ratio compares them with the training pass.

With ``--engine vllm`` the sampler is :class:`mugrpo.engines.vllm_engine.VLLMEngine` (fp32 and bf16 weights; vLLM has
no fp32-LM-head option), run as the generate job runs it: in vLLM's own interpreter (``--vllm-python``, the
``generation.python`` of a vLLM run), here this script re-invoked there with ``--sample-only``; the rows come back as
JSON and everything after sampling is the same code as for the transformers engine.

Reported per arm: mean ratio, p1 / p99, min / max, max and mean |log ratio|, tokens with ratio < 1e-4 (the
Mu-GRPO veto's trigger condition), and the sampler's tokens/s. Nothing is asserted; the tests check tolerances.
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

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.support, when run as a script

from mugrpo.policy.models import bench_model_dir

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"
SAMPLERS = {
    "fp32": {"dtype": "float32"},
    "bf16": {"dtype": "bfloat16"},
    "bf16+fp32-logits": {"dtype": "bfloat16", "fp32_logits": True},
}
#: vLLM's sampler arms (engine kwargs of VLLMEngine; CPU defaults such as enforce_eager filled in by the engine).
VLLM_SAMPLERS = {"fp32": {"dtype": "float32"}, "bf16": {"dtype": "bfloat16"}}


def prompts(policy: Path, count: int) -> list[list[int]]:
    from mugrpo.data.datasets import DatasetConfig, load_problems
    from mugrpo.data.prompts import PromptConfig, encode_prompt, render_prompt
    from mugrpo.generation import select_problems
    from mugrpo.policy.models import load_tokenizer

    tok = load_tokenizer(policy)
    problems, _ = load_problems(DatasetConfig(name="gsm8k", path=str(DATA), answer_kind="gsm8k"))
    chosen = select_problems(problems, 0, 0, count)
    return [encode_prompt(tok, render_prompt(tok, p.question, PromptConfig())) for p in chosen]


def sample(policy: Path, prompt_ids: list[list[int]], args, engine_kwargs: dict) -> tuple[list, float]:
    """Rollouts (prompt ids, response ids, behavior log-probs) of one sampler arm, and its tokens/s."""
    from mugrpo.engines import SamplingParams, make_engine
    from mugrpo.engines.transformers_engine import TransformersEngine

    if args.engine == "vllm":
        engine = make_engine("vllm", policy, seed=1, max_model_len=1024, **engine_kwargs)
    else:
        engine = TransformersEngine.from_dir(policy, **engine_kwargs)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, n=args.n, seed=1)
    start = time.perf_counter()
    groups = engine.generate(prompt_ids, params)
    seconds = time.perf_counter() - start
    engine.close()
    rows = [(p, s.response_token_ids, s.behavior_logprobs) for p, g in zip(prompt_ids, groups, strict=True) for s in g]
    return [r for r in rows if r[1]], sum(len(r[1]) for r in rows) / seconds


def sample_in_vllm_python(policy: Path, prompt_ids: list[list[int]], args, engine_kwargs: dict) -> tuple[list, float]:
    """:func:`sample` with vLLM, run in ``args.vllm_python`` (this script with ``--sample-only``) as the jobs run."""
    work = Path(tempfile.mkdtemp(prefix="mugrpo-mismatch-vllm-"))
    try:
        spec, out = work / "spec.json", work / "rows.json"
        spec.write_text(json.dumps({"policy": str(policy), "prompt_ids": prompt_ids, "engine_kwargs": engine_kwargs}))
        cmd = [
            args.vllm_python,
            str(Path(__file__).resolve()),
            "--engine",
            "vllm",
            "--max-new-tokens",
            str(args.max_new_tokens),
        ]
        cmd += ["--n", str(args.n), "--sample-only", str(spec), str(out)]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        subprocess.run(cmd, env=env, check=True)
        result = json.loads(out.read_text())
        return [tuple(r) for r in result["rows"]], result["tokens_per_s"]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def sample_only(args) -> None:
    """``--sample-only SPEC OUT``: one vLLM sampler arm in this interpreter, rows written to OUT as JSON."""
    spec = json.loads(Path(args.sample_only[0]).read_text())
    rows, tps = sample(Path(spec["policy"]), spec["prompt_ids"], args, spec["engine_kwargs"])
    Path(args.sample_only[1]).write_text(json.dumps({"rows": rows, "tokens_per_s": tps}))


def trainer_logprobs(model, rows: list, order: list[int], micro_batch_size: int, mixed_precision: str) -> list:
    """Per-row fp32 log-probs of the response tokens, micro-batched in ``order`` as the training job batches."""
    from bench.support.synthetic import sampled_rollout
    from mugrpo.trainer.batch import collate
    from mugrpo.trainer.precision import autocast_context

    out: list = [None] * len(rows)
    for start in range(0, len(order), micro_batch_size):
        idx = order[start : start + micro_batch_size]
        chunk = [sampled_rollout(i, *rows[i][:3]) for i in idx]
        batch = collate(chunk, [0] * len(chunk), pad_token_id=2)
        with torch.no_grad(), autocast_context("cpu", mixed_precision):
            logprobs, _ = model(batch, return_entropy=False)
        for j, i in enumerate(idx):
            out[i] = logprobs[j, : len(rows[i][1])].float()
    return out


def stats(logprobs: list, behavior: list) -> dict:
    from mugrpo.trainer.precision import ratio_stats

    lp, bh = torch.cat(logprobs), torch.cat([torch.as_tensor(b, dtype=torch.float32) for b in behavior])
    return ratio_stats(lp, bh, torch.ones_like(lp, dtype=torch.bool)).as_dict()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 | tiny | an HF model dir")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4, help="group size G")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--engine", choices=("transformers", "vllm"), default="transformers", help="the sampler")
    ap.add_argument("--vllm-python", default=".venv-vllm/bin/python", help="vLLM's interpreter (--engine vllm)")
    ap.add_argument("--sample-only", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.sample_only:
        sample_only(args)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # as the jobs do

    from mugrpo.policy.models import load_policy
    from mugrpo.trainer.forward import PolicyTokenLogprobs

    tmp = Path(tempfile.mkdtemp(prefix="mugrpo-mismatch-"))
    try:
        policy = bench_model_dir(args.model, tmp)
        prompt_ids = prompts(policy, args.prompts)
        model = PolicyTokenLogprobs(load_policy(policy)[0].eval())
        results: dict = {"model": args.model, "engine": args.engine, "threads": torch.get_num_threads(), "arms": []}
        vllm = args.engine == "vllm"
        for name, engine_kwargs in (VLLM_SAMPLERS if vllm else SAMPLERS).items():
            sampler = sample_in_vllm_python if vllm else sample
            rows, tps = sampler(policy, prompt_ids, args, engine_kwargs)
            shuffled = np.random.default_rng(0).permutation(len(rows)).tolist()
            behavior = [r[2] for r in rows]
            for mixed in ("no", "bf16"):
                lp = trainer_logprobs(model, rows, shuffled, args.micro_batch_size, mixed)
                arm = {"sampler": name, "trainer": mixed, "sampler_tokens_per_s": tps, **stats(lp, behavior)}
                results["arms"].append(arm)
            if name == "bf16" or vllm:  # recompute_behavior_logprobs: the trainer against itself, other batching
                mixed = "bf16" if name == "bf16" else "no"  # as the job's config pairs them
                lp = trainer_logprobs(model, rows, shuffled, args.micro_batch_size, mixed)
                recomputed = trainer_logprobs(model, rows, list(range(len(rows))), args.micro_batch_size, mixed)
                arm = {"sampler": f"{name} (recompute)", "trainer": mixed, "sampler_tokens_per_s": tps}
                results["arms"].append(arm | stats(lp, recomputed))
        cols = ("ratio_mean", "ratio_p1", "ratio_p99", "ratio_min", "ratio_max", "max_abs_log_ratio")
        print(
            f"\nengine {args.engine}, model {args.model}, {args.prompts} prompts x G={args.n}, "
            f"{args.max_new_tokens} new tokens, T=1"
        )
        print("| sampler | trainer | tokens | " + " | ".join(cols) + " | mean abs log ratio | ratio < 1e-4 |")
        print("|---" * (len(cols) + 5) + "|")
        for a in results["arms"]:
            values = " | ".join(f"{a[c]:.4f}" for c in cols)
            print(
                f"| {a['sampler']} | {a['trainer']} | {a['num_tokens']} | {values} | "
                f"{a['mean_abs_log_ratio']:.2e} | {a['below_veto_delta']} |"
            )
        print("sampler tok/s: " + ", ".join(f"{n} {a['sampler_tokens_per_s']:.1f}" for n, a in _per_sampler(results)))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _per_sampler(results: dict):
    seen = {}
    for a in results["arms"]:
        seen.setdefault(a["sampler"].split(" ")[0], a)
    return seen.items()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
