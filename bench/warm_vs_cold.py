"""Seconds per stage, warm against cold execution, on the standard-GRPO baseline config (short run).

    python bench/warm_vs_cold.py                 # SmolLM2-135M, gsm8k-smollm2-grpo.yaml, 3 small stages
    python bench/warm_vs_cold.py --quick         # tiny random model, 2 stages (CI: the plumbing, not the figures)

Both arms run the same config in fresh run folders, as `mugrpo run` would launch them but without Prefect (whose
per-task overhead would only add to the cold arm): cold = three job processes per stage (generate, train, eval
when scheduled) then the stage commit, exactly what flows/stage.py launches; warm = one segment job
(mugrpo.jobs.segment) for all stages. T_switch per stage is computed as the stage flow computes it (each job's
wall seconds minus the work it reports) for cold, and is what the segment records for warm (t_total minus work).
Arms alternate (cold, warm, then warm, cold with --repeats 2, ...). It prints per-stage seconds of both arms and
the warm/cold ratios. Nothing is asserted.
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
WORK = {"generate": "gen", "train": "train", "eval": "eval"}


def config(root: Path, run_id: str, quick: bool, stages: int, model: str) -> dict:
    from mugrpo.config import load_config

    overrides = [
        f"run.root={root}",
        f"run.id={run_id}",
        f"run.num_stages={stages}",
        "orchestration.segment_stages=100",
        "eval.benchmarks=[]",  # T_switch is the question; evaluation only adds work to both arms
    ]
    if quick:
        overrides += [
            f"model.source={model}",
            "generation.prompts_per_stage=2",
            "generation.sampling.n=2",
            "generation.sampling.max_new_tokens=8",
            "train.rollouts_per_update=4",
            "train.micro_batch_size=2",
            "train.updates_per_stage=2",
            "train.checkpoint_every=2",
            "train.skip_zero_variance_groups=false",
        ]
    else:  # the GRPO baseline's G = 8 and sampling, with stages small enough that switching is visible on 2 cores
        overrides += [
            "generation.prompts_per_stage=2",
            "generation.sampling.max_new_tokens=16",
            "train.rollouts_per_update=4",
            "train.updates_per_stage=2",
            "train.checkpoint_every=2",
            "train.skip_zero_variance_groups=false",
        ]
    return load_config(REPO / "configs" / "gsm8k-smollm2-grpo.yaml", overrides)


#: Set to "in-process" to run each job's ``main`` in this process instead of a new one (bench/quality.py --quick: CI
#: checks structure; job start-up times, T_switch included, are then not those of real job processes).
JOBS_ENV = "MUGRPO_BENCH_JOBS"


def job(module: str, spec: str, log: Path, python: str | None = None) -> float:
    """Run job ``mugrpo.jobs.MODULE SPEC`` in a process of ``python`` (the job's interpreter, as the stage flow's
    ``job_python`` picks it; None = this one), or in this process (:data:`JOBS_ENV`); returns its wall seconds.

    Raises:
        SystemExit: the job failed (see ``log``).
    """
    t0 = time.monotonic()
    if os.environ.get(JOBS_ENV) == "in-process":
        import importlib

        try:
            importlib.import_module(f"mugrpo.jobs.{module}").main([spec])
        except SystemExit as e:
            if e.code not in (0, None):
                raise SystemExit(f"{module} job failed ({e.code}) in process") from e
        return time.monotonic() - t0
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log, "ab") as out:
        cmd = [python or sys.executable, "-m", f"mugrpo.jobs.{module}", spec]
        code = subprocess.run(cmd, env=env, stdout=out, stderr=out)
    if code.returncode != 0:
        raise SystemExit(f"{module} job failed ({code.returncode}); see {log}")
    return time.monotonic() - t0


def run_cold(cfg, log: Path) -> list[dict]:
    from flows.stage import job_python
    from mugrpo.manifest import read_job_manifest
    from mugrpo.runs import commit_stage, init_run, write_job_specs
    from schemas import StageTimings

    store = init_run(cfg)
    out = []
    for k in range(cfg.run.num_stages):
        t0 = time.monotonic()
        urls = write_job_specs(cfg, k)
        walls, switch = {}, 0.0
        for name in ("generate", "train", "eval"):
            if name in urls:
                walls[name] = job(name, urls[name], log, job_python(cfg, name))
                work = read_job_manifest(store, cfg.run.id, k, name).timings.get(WORK[name], 0.0)
                switch += max(walls[name] - work, 0.0)
        t = StageTimings(
            t_gen=walls["generate"],
            t_train=walls["train"],
            t_eval=walls.get("eval", 0.0),
            t_switch=switch,
            t_total=time.monotonic() - t0,
        )
        out.append(commit_stage(cfg, k, t).timings.model_dump())
    return out


def run_warm(cfg, log: Path, tmp: Path) -> list[dict]:
    from flows.stage import job_python
    from mugrpo.manifest import read_manifest
    from mugrpo.runs import init_run
    from mugrpo.warm import SegmentSpec

    store = init_run(cfg)
    spec = tmp / f"{cfg.run.id}.segment.json"
    spec.write_text(SegmentSpec.from_config(cfg, 0, cfg.run.num_stages).model_dump_json())
    job("segment", str(spec), log, job_python(cfg, "segment"))
    return [read_manifest(store, cfg.run.id, k).timings.model_dump() for k in range(cfg.run.num_stages)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny random model, 2 stages")
    parser.add_argument("--stages", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1, help="pairs of arms, alternating the order")
    args = parser.parse_args()
    stages = args.stages or (2 if args.quick else 3)
    tmp = Path(tempfile.mkdtemp(prefix="mugrpo-warm-vs-cold-"))
    model = "smollm2"
    if args.quick:
        from mugrpo.models import make_tiny_random_model

        model = str(make_tiny_random_model(tmp / "tiny", seed=0))
    results: dict[str, list[list[dict]]] = {"cold": [], "warm": []}
    for r in range(args.repeats):
        for arm in ("cold", "warm") if r % 2 == 0 else ("warm", "cold"):
            cfg = config(tmp / arm, f"{arm}-{r}", args.quick, stages, model)
            log = tmp / f"{arm}-{r}.log"
            t0 = time.monotonic()
            timings = run_cold(cfg, log) if arm == "cold" else run_warm(cfg, log, tmp)
            print(f"{arm} repeat {r}: {time.monotonic() - t0:.1f} s wall, log {log}", flush=True)
            results[arm].append(timings)
    print(f"\nseconds per stage ({stages} stages, {args.repeats} repeat(s); stage 0 of warm includes the job start)")
    print(f"{'stage':>5} {'arm':>5} {'T_gen':>7} {'T_train':>7} {'T_switch':>8} {'T_sync':>7} {'T_total':>7}")
    for k in range(stages):
        for arm in ("cold", "warm"):
            t = {f: statistics.median(run[k][f] for run in results[arm]) for f in results[arm][0][k]}
            print(
                f"{k:>5} {arm:>5} {t['t_gen']:>7.1f} {t['t_train']:>7.1f} {t['t_switch']:>8.2f} "
                f"{t['t_sync']:>7.3f} {t['t_total']:>7.1f}"
            )
    later = range(1, stages)  # stages after the first: what a long warm segment pays per stage
    summary = {}
    for f in ("t_switch", "t_total"):
        cold = statistics.median(run[k][f] for run in results["cold"] for k in later)
        warm = statistics.median(run[k][f] for run in results["warm"] for k in later)
        summary[f] = {"cold": cold, "warm": warm, "warm/cold": warm / cold if cold else float("nan")}
    print("\nmedian over stages 1..K-1:", json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
