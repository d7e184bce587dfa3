"""vLLM against the transformers engine on this machine, side by side: tokens/s at GRPO's and Mu-GRPO's stage size
(the batching effect the Mu-GRPO paper's rollout speedup rests on), engine start, cold job start and warm sync.

    python bench/engines.py --vllm-python .venv-vllm/bin/python --json engines.json      # SmolLM2-135M, ~18 min (*)
    python bench/engines.py --vllm-python .venv-vllm/bin/python --quick                   # tiny policy, plumbing

(*) on 2 quiet cores if a vLLM start takes ~25 s; ~35 min if it takes ~100 s (then ``--rounds 1``): each round
starts vLLM 6 times and generates ~37k tokens (docs/benchmarks.md).

Stage sizes are those of bench/speedup.py's arms (bench/_arms.py's Budget, same flags): GRPO's stage holds
mu = 4 updates of rollouts (16 rollouts by default), Mu-GRPO's U / K updates (32). Per dtype (bf16, fp32) and round,
engines alternated (vLLM first in even rounds, transformers first in odd ones: this machine's load drifts):

- bare engine: ``bench/support/engine_probe.py`` run by the engine's interpreter: the product's ``VLLMEngine`` /
  ``TransformersEngine`` built with the product's defaults (``make_engine``; vLLM on a CPU gets ``enforce_eager``
  and a 2 GiB KV cache from ``cpu_defaults``; ``--vllm-kwargs '{"enforce_eager": false}'`` measures it compiled),
  engine start seconds, ``--calls`` timed generate calls per stage size, then ``--syncs`` in-place weight loads of
  the policy's state dict into the running engine (T_sync, the warm segment's sync);
- generation job: ``python -m mugrpo.jobs.generate SPEC`` spawned by the engine's interpreter as the stage flow
  spawns it (through bench/job_start.py's ``one_job`` and bench/support/job_probe.py), one stage of each size, one
  shard per stage (as the speedup arms shard): spawn to engine ready, spawn to first token (vLLM: to its first
  batch), wall seconds, and tokens/s over the job's ``gen`` seconds (its sampling and verification) and over its
  wall time.

Reduced per (engine, dtype): medians of tokens/s per size, batch gain = tokens/s at Mu-GRPO's size / at GRPO's,
and printed per dtype: vLLM batch gain / transformers batch gain. A ratio above 1 means vLLM gains more from
Mu-GRPO's larger stages than the transformers engine does (then bench/speedup.py's ``--engine vllm`` is the run
to make). Nothing is asserted; on a loaded machine compare ratios, not seconds.
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
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._arms import GRPO_MU, Budget  # noqa: E402
from bench.job_start import DATA, _env, generate_spec, one_job  # noqa: E402

ENGINES = ("vllm", "transformers")
DTYPES = ("bfloat16", "float32")
ENGINE_PROBE = REPO / "bench" / "support" / "engine_probe.py"


def stage_rollouts(b: Budget) -> dict[str, int]:
    """Rollouts one stage generates in each arm of bench/speedup.py under budget ``b``: ``grpo`` (mu = 4 updates
    per stage) and ``mu`` (Mu-GRPO: U / K updates per stage), each updates x rollouts per update.

    Raises:
        ValueError: the budget cannot be shared by the arms (:meth:`Budget.check`).
    """
    b.check()
    return {"grpo": GRPO_MU * b.rollouts_per_update, "mu": b.updates // b.mu_stages * b.rollouts_per_update}


def tokens_per_s(calls: list[dict], rollouts: int) -> list[float]:
    """Tokens/s of each call of size ``rollouts`` (response tokens / seconds of the call); [] when none."""
    return [c["tokens"] / c["seconds"] for c in calls if c["rollouts"] == rollouts and c["seconds"] > 0]


def batch_gain(tps_large: float, tps_small: float) -> float:
    """Tokens/s at the large (Mu-GRPO) stage size over tokens/s at the small (GRPO) one; nan if either is not > 0."""
    return tps_large / tps_small if tps_large > 0 and tps_small > 0 else float("nan")


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(bare: dict[str, list[dict]], jobs: dict[str, list[dict]], sizes: dict[str, int]) -> dict:
    """Medians per ``"engine/dtype"`` arm and the batch-gain ratios.

    Args:
        bare: per arm, the engine probe records (bench/support/engine_probe.py's OUT.json), one per round.
        jobs: per arm, the generation job records (``size``, ``tokens``, ``gen_s``, ``wall_s``, spawn stamps).
        sizes: ``{"grpo": rollouts, "mu": rollouts}`` (:func:`stage_rollouts`).

    Returns:
        ``{"arms": {arm: {...medians...}}, "ratios": {dtype: {"bare": r, "job": r}}}`` with r = vLLM batch gain /
        transformers batch gain (nan where an arm is missing).
    """
    arms: dict[str, dict] = {}
    for arm in sorted(set(bare) | set(jobs)):
        out: dict = {}
        recs = bare.get(arm, [])
        if recs:
            calls = [c for r in recs for c in r["calls"]]
            for name, n in sizes.items():
                out[f"bare_tps_{name}"] = _median(tokens_per_s(calls, n))
            out["bare_batch_gain"] = batch_gain(out["bare_tps_mu"], out["bare_tps_grpo"])
            out["start_s"] = _median([r["start_s"] for r in recs])
            out["import_s"] = _median([r["import_s"] for r in recs])
            out["sync_s"] = _median([s for r in recs for s in r["sync_s"]])
        runs = jobs.get(arm, [])
        if runs:
            for name, n in sizes.items():
                mine = [j for j in runs if j["size"] == n]
                out[f"job_tps_{name}"] = _median([j["tokens"] / j["gen_s"] for j in mine if j["gen_s"] > 0])
                out[f"job_wall_tps_{name}"] = _median([j["tokens"] / j["wall_s"] for j in mine if j["wall_s"] > 0])
            out["job_batch_gain"] = batch_gain(out["job_tps_mu"], out["job_tps_grpo"])
            for key in ("engine_ready", "first_work", "exit"):
                out[f"job_{key}_s"] = _median([j[key] for j in runs if key in j])
        arms[arm] = out
    ratios = {}
    for dtype in sorted({a.split("/")[1] for a in arms}):
        v, t = arms.get(f"vllm/{dtype}", {}), arms.get(f"transformers/{dtype}", {})
        ratios[dtype] = {
            kind: batch_gain(v.get(f"{kind}_batch_gain", float("nan")), t.get(f"{kind}_batch_gain", float("nan")))
            for kind in ("bare", "job")
        }
    return {"arms": arms, "ratios": ratios}


def questions(n: int) -> list[str]:
    """The first ``n`` GSM8K train questions (the prompts of every bare-engine call)."""
    with open(DATA) as f:
        return [json.loads(line)["question"] for _, line in zip(range(n), f, strict=False)]


def run_probe(python: str, args: dict, work: Path, threads: int) -> dict:
    """One engine probe run by ``python``; its OUT.json record, with ``wall_s`` added."""
    a, out = work / f"{args['engine']}-{args['dtype']}.args.json", work / f"{args['engine']}-{args['dtype']}.out.json"
    a.write_text(json.dumps(args))
    t0 = time.monotonic()
    proc = subprocess.run(
        [python, str(ENGINE_PROBE), str(a), str(out)],
        env=_env(REPO, None if args["engine"] == "vllm" else threads),
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.exit(f"engine probe {args['engine']} {args['dtype']} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    rec = json.loads(out.read_text())
    rec["wall_s"] = time.monotonic() - t0
    return rec


def prepare_job(
    work: Path, policy: Path, engine: str, dtype: str, rollouts: int, b: Budget, threads: int, vllm_kwargs: dict
):
    """A run folder holding the policy at stage 0 and a generate spec of one stage of ``rollouts`` (one shard);
    ``vllm_kwargs`` are the vLLM arm's ``generation.engine_kwargs``."""
    from mugrpo.storage.layout import RunLayout
    from mugrpo.storage.store import Store

    name = f"{engine}-{dtype}-{rollouts}"
    root = work / f"pristine-{name}"
    if not root.exists():
        Store(str(root)).upload_dir(policy, RunLayout("engines").policy_dir(0))
    prompts = rollouts // b.group_size
    kwargs = {"num_threads": threads} if engine == "transformers" else dict(vllm_kwargs)
    spec = generate_spec(
        "engines", prompts, prompts, b.max_new_tokens, b.group_size, engine=engine, dtype=dtype, engine_kwargs=kwargs
    )
    path = work / f"{name}.spec.json"
    path.write_text(spec.model_dump_json())
    return {"generate-root": root, "generate": path}


def job_counts(root: Path) -> dict:
    """Response tokens of the run folder's stage-0 rollouts and its generate job's ``gen`` seconds."""
    import pyarrow.dataset as ds

    from mugrpo.commits.manifest import read_job_manifest
    from mugrpo.storage.store import Store

    tokens = ds.dataset(root / "engines" / "rollouts", format="parquet", partitioning="hive").to_table(
        columns=["num_tokens"]
    )
    m = read_job_manifest(Store(str(root)), "engines", 0, "generate")
    return {"tokens": int(sum(tokens.column("num_tokens").to_pylist())), "gen_s": m.timings.get("gen", 0.0)}


def main() -> None:
    from bench.speedup import add_budget_flags

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny random policy, 1 round, 4 new tokens (plumbing)")
    parser.add_argument(
        "--vllm-python",
        default=os.environ.get("MUGRPO_VLLM_PYTHON"),
        help="the vLLM virtualenv's interpreter (`make vllm-venv`: .venv-vllm/bin/python); default "
        "$MUGRPO_VLLM_PYTHON; without one only the transformers arms run",
    )
    add_budget_flags(parser)
    parser.set_defaults(max_new_tokens=64)
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny or an HF dir (bench_model_dir)")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--rounds", type=int, default=2, help="rounds of all arms, engine order alternated")
    parser.add_argument("--calls", type=int, default=2, help="timed bare-engine generate calls per size per round")
    parser.add_argument("--syncs", type=int, default=2, help="timed in-place weight loads per round")
    parser.add_argument("--no-jobs", action="store_true", help="bare engines only")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (transformers)")
    parser.add_argument("--json", type=Path, help="write every record and the summary here")
    parser.add_argument(
        "--vllm-kwargs",
        type=json.loads,
        default={},
        help="JSON engine kwargs of the vLLM arms, over the product's defaults (on a CPU: eager); "
        "'{\"enforce_eager\": false}' for a compiled engine",
    )
    args = parser.parse_args()
    if args.quick:
        args.model, args.rounds, args.calls, args.syncs, args.max_new_tokens = "tiny", 1, 1, 1, 4
    b = Budget(
        updates=args.updates,
        rollouts_per_update=args.rollouts_per_update,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        mu_stages=args.mu_stages,
    )
    sizes = stage_rollouts(b)
    engines = [e for e in ENGINES if e != "vllm" or args.vllm_python]
    pythons = {
        "vllm": str(Path(args.vllm_python).absolute()) if args.vllm_python else None,
        "transformers": sys.executable,
    }
    work = Path(tempfile.mkdtemp(prefix="mugrpo-engines-"))
    print(
        f"stage sizes (rollouts): {sizes}, G={b.group_size}, {b.max_new_tokens} new tokens; engines {engines}; "
        f"scratch {work}",
        flush=True,
    )
    from mugrpo.policy.models import bench_model_dir

    policy = bench_model_dir(args.model, work / "models")
    prompts = questions(max(sizes.values()) // b.group_size)
    bare: dict[str, list[dict]] = {}
    jobs: dict[str, list[dict]] = {}
    t_all = time.monotonic()
    try:
        for r in range(args.rounds):
            order = engines if r % 2 == 0 else engines[::-1]
            for dtype in args.dtypes.split(","):
                for engine in order:
                    arm = f"{engine}/{dtype}"
                    probe_args = {
                        "engine": engine,
                        "model_dir": str(policy),
                        "dtype": dtype,
                        "threads": args.threads,
                        "sizes": [sizes["grpo"], sizes["mu"]],
                        "group_size": b.group_size,
                        "max_new_tokens": b.max_new_tokens,
                        "calls": args.calls,
                        "syncs": args.syncs,
                        "prompts": prompts,
                        "engine_kwargs": args.vllm_kwargs if engine == "vllm" else {},
                    }
                    rec = run_probe(pythons[engine], probe_args, work, args.threads)
                    bare.setdefault(arm, []).append(rec)
                    print(f"round {r}: {arm} bare: start {rec['start_s']:.1f}s, wall {rec['wall_s']:.1f}s", flush=True)
                    if args.no_jobs:
                        continue
                    for name in ("grpo", "mu") if r % 2 == 0 else ("mu", "grpo"):
                        prepared = prepare_job(
                            work, policy, engine, dtype, sizes[name], b, args.threads, args.vllm_kwargs
                        )
                        t0 = time.monotonic()
                        j = one_job(
                            "generate",
                            REPO,
                            prepared,
                            work,
                            None if engine == "vllm" else args.threads,  # vLLM sets its own OpenMP threads
                            python=pythons[engine],
                            inspect=job_counts,
                        )
                        j.update(size=sizes[name], wall_s=time.monotonic() - t0)
                        jobs.setdefault(arm, []).append(j)
                        print(f"round {r}: {arm} job {name}: {j['tokens']} tokens, wall {j['wall_s']:.1f}s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarize(bare, jobs, sizes)
    print(f"\nmedians over {args.rounds} round(s), model {args.model}, {time.monotonic() - t_all:.0f} s in all")
    cols = (
        "bare_tps_grpo",
        "bare_tps_mu",
        "bare_batch_gain",
        "job_tps_grpo",
        "job_tps_mu",
        "job_batch_gain",
        "start_s",
        "sync_s",
        "job_engine_ready_s",
        "job_first_work_s",
    )
    print(f"{'arm':22}" + "".join(f"{c:>19}" for c in cols))
    for arm, m in summary["arms"].items():
        print(f"{arm:22}" + "".join(f"{m.get(c, float('nan')):19.3f}" for c in cols))
    for dtype, r in summary["ratios"].items():
        print(f"{dtype}: vLLM batch gain / transformers batch gain: bare {r['bare']:.3f}, job {r['job']:.3f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "sizes": sizes,
                    "bare": bare,
                    "jobs": jobs,
                    **summary,
                },
                indent=1,
            )
        )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
