"""Training overhead: the training job's tokens/s against a bare forward + backward of the same model on the same
batches, in the same run; peak RSS of each (target ratio >= 0.9).

    python bench/train_overhead.py                         # tiny random Llama with the SmolLM2 tokenizer
    python bench/train_overhead.py --model DIR             # any HF dir, e.g. SmolLM2-135M converted from GGUF
    python bench/train_overhead.py --updates 8 --response-tokens 64 128 --threads 2 --json out.json
    python bench/train_overhead.py --model DIR --dtype float32 bfloat16   # fp32 vs bf16 autocast, alternated

Both sides run in their own subprocess (so ``ru_maxrss`` from ``os.wait4`` is each one's own peak RSS) with the
same thread count, the same committed synthetic rollouts (:mod:`bench.support.synthetic`) and the same
minibatches and micro-batches (the job's seeded order, re-derived here with the job's own functions).

* job: ``python -m mugrpo.jobs.train SPEC`` (mu_grpo loss with veto and all metrics, chunked log-softmax with
  entropy, global-count normalization, grad clipping, AdamW, a checkpoint and the published policy at the end).
  Its tokens/s is the per-update ``tokens_per_second`` of the train_steps table (forward, backward, step).
* bare: ``model(input_ids).logits -> log_softmax -> gather -> -(A * logp).sum() / N -> backward``, then
  ``AdamW.step()``; timed over the same span (forward, backward, step) of each update.

``--dtype bfloat16`` runs both sides under bf16 autocast over fp32 master weights (the job with
``train.mixed_precision: bf16``; the bare side in ``torch.autocast("cpu", bfloat16)`` with an fp32 log-softmax).
Several dtypes alternate within each round, and the run measures this machine's matmul ceiling (a 2048^3 matmul
per dtype, same thread count) before and after, so the bf16 / fp32 speedup of the job reads against the
speedup the hardware gives a plain matmul.

The first update of each side is a warm-up and is left out of the tokens/s medians. ``--rounds`` pairs run one
after the other (bare first in even rounds, the job first in odd ones) and the best of each side is kept, since a
shared machine's load drifts between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = "bench-train"
DTYPES = {"float32": "no", "bfloat16": "bf16"}  # --dtype -> train.mixed_precision


def _bare(spec_path: str, out_path: str) -> None:
    """The bare baseline (runs in its own process); bf16 autocast when the spec says so."""
    import torch

    from mugrpo.commits.policies import local_policy_dir
    from mugrpo.common.seeds import derive_seed
    from mugrpo.policy.models import load_policy
    from mugrpo.trainer.batch import collate
    from mugrpo.trainer.data import load_rollouts, make_minibatch_order, split_minibatch
    from mugrpo.trainer.precision import autocast_context
    from mugrpo.trainer.spec import TrainSpec

    torch.set_flush_denormal(True)  # as the job does (mugrpo.jobs.train.main): compare overhead, not float modes
    spec = TrainSpec.model_validate_json(Path(spec_path).read_text())
    train, store = spec.train, spec.store()
    data = load_rollouts(
        store, spec.run_id, spec.rollout_stages, skip_zero_variance_groups=train.skip_zero_variance_groups
    )
    order = make_minibatch_order(
        data,
        rollouts_per_update=train.rollouts_per_update,
        group_minibatches=False,
        seed=derive_seed(spec.seed, spec.stage, "train-data-order"),
    )
    model, tokenizer = load_policy(local_policy_dir(store, spec.policy_dir))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=train.lr, betas=tuple(train.betas))
    updates = []
    for u in range(train.updates_per_stage):
        indices = order.minibatch(u)
        micro = split_minibatch(
            indices, data, micro_batch_size=train.micro_batch_size, rank=0, world_size=1, keep_groups=False
        )
        batches = [collate([data.rollouts[i] for i in mb], [0] * len(mb), tokenizer.pad_token_id) for mb in micro]
        num_tokens = sum(data.rollouts[i].num_tokens for i in indices)
        start = time.perf_counter()
        for b in batches:
            with autocast_context("cpu", train.mixed_precision):
                logits = model(input_ids=b.input_ids).logits  # [B, L, V]
            logp = torch.log_softmax(logits.float() / b.temperatures[:, None, None], dim=-1)
            logp = logp.gather(1, b.response_index[..., None].expand(-1, -1, logp.shape[-1]))  # response positions
            token_logp = logp.gather(-1, b.response_ids[..., None]).squeeze(-1)
            loss = -(b.advantages[:, None] * token_logp * b.response_mask).sum() / num_tokens
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - start
        updates.append({"num_tokens": num_tokens, "seconds": seconds, "tokens_per_second": num_tokens / seconds})
    Path(out_path).write_text(json.dumps({"updates": updates}))


def _run(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, float]:
    """Run ``cmd``; returns (wall seconds, peak RSS in MiB of that process alone)."""
    start = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}); log: {log}\n{log.read_text()[-3000:]}")
    return time.monotonic() - start, usage.ru_maxrss / 1024  # Linux: KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="HF model dir (default: a tiny random Llama with the SmolLM2 tokenizer)")
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--rollouts-per-update", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--response-tokens", type=int, nargs=2, default=(64, 128), metavar=("MIN", "MAX"))
    parser.add_argument("--prompt-repeat", type=int, default=3, help="prompt length: repeats of a ~15-token question")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--rounds", type=int, default=2, help="bare/job pairs; the best tokens/s of each is kept")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workdir", help="default: a temporary folder")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--dtype",
        nargs="+",
        choices=sorted(DTYPES),
        default=["float32"],
        help="training precision(s): float32, or bfloat16 (bf16 autocast, fp32 master weights); several alternate",
    )
    parser.add_argument("--matmul-size", type=int, default=2048, help="side of the ceiling matmul (0 skips it)")
    parser.add_argument("--bare", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        return _bare(*args.bare)

    from rich.console import Console
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    from bench.support.synthetic import commit_synthetic_stage
    from mugrpo.commits.manifest import read_job_manifest
    from mugrpo.commits.tables import read_table
    from mugrpo.policy.models import make_tiny_random_model
    from mugrpo.storage.layout import RunLayout
    from mugrpo.storage.store import Store
    from mugrpo.trainer.spec import TrainSpec

    hf_logging.disable_progress_bar()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="mugrpo-bench-train-"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir = Path(args.model) if args.model else make_tiny_random_model(work / "tiny", seed=0)
    root = work / "store"
    store = Store(str(root))
    if read_job_manifest(store, RUN, 0, "generate") is None:
        commit_synthetic_stage(
            store,
            RUN,
            model_dir,
            num_prompts=args.prompts,
            group_size=args.group_size,
            response_tokens=tuple(args.response_tokens),
            prompt_repeat=args.prompt_repeat,
            seed=0,
        )
    threads = str(args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONPATH": str(REPO)}
    spec_paths = {}
    for dtype in args.dtype:
        spec = TrainSpec(
            root=str(root),
            run_id=RUN,
            stage=0,
            policy_version=0,
            train={
                "updates_per_stage": args.updates,
                "rollouts_per_update": args.rollouts_per_update,
                "micro_batch_size": args.micro_batch_size,
                "checkpoint_every": args.updates,
                "lr": 1e-5,
                "gradient_checkpointing": args.gradient_checkpointing,
                "mixed_precision": DTYPES[dtype],
            },
        )
        spec_paths[dtype] = work / f"train-{dtype}.spec.json"
        spec_paths[dtype].write_text(spec.model_dump_json())

    def ceiling(tag: str) -> dict[str, float] | None:
        if not args.matmul_size:
            return None
        log = work / f"ceiling-{tag}.log"
        _run(
            [sys.executable, str(REPO / "bench/matmul_ceiling.py"), "--size", str(args.matmul_size), "--json"], env, log
        )
        return json.loads(log.read_text())

    ceilings = [ceiling("before")]
    layout = RunLayout(RUN)
    rounds: dict[str, list[dict]] = {dtype: [] for dtype in args.dtype}
    for r in range(args.rounds):  # alternate sides and dtypes; a shared machine's load drifts between runs
        dtypes = args.dtype if r % 2 == 0 else args.dtype[::-1]
        for dtype in dtypes:
            for leftover in ("checkpoints", "train_steps", "policies/stage=1", "jobs/stage=0/train.manifest.json"):
                store.delete(f"{RUN}/{leftover}", recursive=True)
            bare_out = work / f"bare-{dtype}-{r}.json"
            commands = {
                "bare": [sys.executable, __file__, "--bare", str(spec_paths[dtype]), str(bare_out)],
                "job": [sys.executable, "-m", "mugrpo.jobs.train", str(spec_paths[dtype])],
            }
            order = ("bare", "job") if r % 2 == 0 else ("job", "bare")  # alternate which side runs first
            measured = {side: _run(commands[side], env, work / f"{side}-{dtype}-{r}.log") for side in order}
            (bare_wall, bare_rss), (job_wall, job_rss) = measured["bare"], measured["job"]
            steps = read_table(store, layout.train_steps_part(0, args.updates), "train_steps").to_pylist()
            bare = json.loads(bare_out.read_text())["updates"]
            rounds[dtype].append(
                {
                    "job_tokens_per_s": statistics.median(x["tokens_per_second"] for x in steps[1:] or steps),
                    "bare_tokens_per_s": statistics.median(x["tokens_per_second"] for x in bare[1:] or bare),
                    "job_peak_rss_mib": job_rss,
                    "bare_peak_rss_mib": bare_rss,
                    "job_wall_s": job_wall,
                    "bare_wall_s": bare_wall,
                    "first": order[0],
                    "job_timings": read_job_manifest(store, RUN, 0, "train").timings,
                }
            )
    ceilings.append(ceiling("after"))
    tokens = sum(x["num_tokens"] for x in steps)
    results = {
        "model": str(args.model or "tiny random Llama (hidden 64, 2 layers, vocab 49152)"),
        "updates": args.updates,
        "rollouts_per_update": args.rollouts_per_update,
        "micro_batch_size": args.micro_batch_size,
        "response_tokens": list(args.response_tokens),
        "tokens": tokens,
        "threads": args.threads,
        "gradient_checkpointing": args.gradient_checkpointing,
        "matmul_gflops": ceilings,
        "dtypes": {},
    }
    title = (
        f"training overhead, best of {args.rounds} rounds ({results['model']}, {tokens} response tokens, "
        f"{args.threads} threads)"
    )
    table = Table(title=title)
    for col in ("dtype", "", "tokens/s (median of updates 2..N)", "peak RSS MiB", "process wall s"):
        table.add_column(col, justify="right")
    for dtype, runs in rounds.items():
        best = {key: max(x[key] for x in runs) for key in ("job_tokens_per_s", "bare_tokens_per_s")}
        best |= {key: min(x[key] for x in runs) for key in ("job_wall_s", "bare_wall_s")}
        best |= {key: max(x[key] for x in runs) for key in ("job_peak_rss_mib", "bare_peak_rss_mib")}
        best["ratio"] = best["job_tokens_per_s"] / best["bare_tokens_per_s"]
        results["dtypes"][dtype] = {**best, "rounds": runs}
        table.add_row(dtype, "bare fwd+bwd+AdamW", *_cells(best, "bare"))
        table.add_row(dtype, "mugrpo.jobs.train", *_cells(best, "job"))
        table.add_row(
            dtype,
            "job / bare",
            f"{best['ratio']:.2f}",
            f"{best['job_peak_rss_mib'] / best['bare_peak_rss_mib']:.2f}",
            f"{best['job_wall_s'] / best['bare_wall_s']:.2f}",
        )
    Console().print(table)
    if {"float32", "bfloat16"} <= set(results["dtypes"]):
        fp32, bf16 = results["dtypes"]["float32"], results["dtypes"]["bfloat16"]
        results["bf16_over_fp32"] = {
            side: bf16[f"{side}_tokens_per_s"] / fp32[f"{side}_tokens_per_s"] for side in ("job", "bare")
        }
        speedup = results["bf16_over_fp32"]
        line = f"bf16 / fp32 tokens/s: job {speedup['job']:.2f}, bare {speedup['bare']:.2f}"
        if ceilings[0]:
            matmul = [c["bfloat16"] / c["float32"] for c in ceilings]
            results["bf16_over_fp32"]["matmul"] = max(matmul)
            line += f"; {args.matmul_size}^3 matmul {' / '.join(f'{m:.2f}' for m in matmul)} (before / after)"
        print(line)
    if ceilings[0]:
        print(
            "matmul ceiling GFLOP/s (before / after): "
            + ", ".join(f"{d} {ceilings[0][d]:.0f} / {ceilings[1][d]:.0f}" for d in ("float32", "bfloat16"))
        )
    for dtype, runs in rounds.items():
        print(f"job timings (s), {dtype}, last round: {runs[-1]['job_timings']}")
        print(
            f"per round, {dtype} (tokens/s job, bare):",
            [(round(x["job_tokens_per_s"], 1), round(x["bare_tokens_per_s"], 1)) for x in runs],
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def _cells(best: dict, side: str) -> tuple[str, str, str]:
    return f"{best[f'{side}_tokens_per_s']:.1f}", f"{best[f'{side}_peak_rss_mib']:.0f}", f"{best[f'{side}_wall_s']:.1f}"


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # bench.support (test and benchmark support, not installed)
    main()
