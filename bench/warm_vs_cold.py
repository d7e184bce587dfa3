"""Seconds per stage, warm against cold execution, on the standard-GRPO baseline config (short run).

    python bench/warm_vs_cold.py                 # SmolLM2-135M, gsm8k-smollm2-grpo.yaml, 3 small stages
    python bench/warm_vs_cold.py --quick         # tiny random model, 2 stages (CI: the plumbing, not the figures)

Both arms run the same config in fresh run folders, as `mugrpo run` would launch them but without Prefect (whose
per-task overhead would only add to the cold arm): cold = three job processes per stage (generate, train, eval
when scheduled) then the stage commit, run by the stage flow's own schedule (mugrpo.execution.pipeline.run_stage, with
the next stage's generation started beside the checkpoint: orchestration.overlap_checkpoint); warm = one segment job
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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


def _command(module: str, spec: str, python: str | None) -> tuple[list[str], dict[str, str]]:
    return [python or sys.executable, "-m", f"mugrpo.jobs.{module}", spec], {**os.environ, "PYTHONPATH": str(REPO)}


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
    cmd, env = _command(module, spec, python)
    with open(log, "ab") as out:
        code = subprocess.run(cmd, env=env, stdout=out, stderr=out)
    if code.returncode != 0:
        raise SystemExit(f"{module} job failed ({code.returncode}); see {log}")
    return time.monotonic() - t0


class _Process:
    """A job running in the background (:class:`mugrpo.execution.pipeline.RunningJob`) on a thread that follows its
    process; a finished stand-in in process."""

    def __init__(self, module: str, future=None) -> None:
        self.module, self.future = module, future

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def result(self) -> None:
        if self.future is not None:
            self.future.result()


class ProcessLauncher:
    """The stage schedule's jobs (:class:`mugrpo.execution.pipeline.StageJobs`) without Prefect: each job one process
    of its interpreter (``flows.stage.job_python``) on the flows' own subprocess launcher
    (:class:`tasks.launchers.subprocess_launcher.SubprocessLauncher`, pre-started jobs included), output appended
    to ``log``. In process (:data:`JOBS_ENV`) a submitted job runs to its end first, so nothing overlaps, and nothing
    is pre-started."""

    def __init__(self, cfg, log: Path) -> None:
        from tasks.launchers.subprocess_launcher import SubprocessLauncher

        self.cfg, self.log = cfg, log
        self.impl = SubprocessLauncher(fork=cfg.orchestration.fork_jobs)

    def _request(self, job_name: str, stage: int, spec_url: str):
        from flows.stage import job_python
        from mugrpo.orchestration.job_specs import job_env
        from tasks.jobs import job_request

        env = {**job_env(self.cfg), "PYTHONPATH": str(REPO)}
        return job_request(
            job_name, spec_url, python=job_python(self.cfg, job_name), env=env,
            timeout_s=self.cfg.orchestration.job_timeout_s, labels={"run": self.cfg.run.id, "stage": str(stage)},
        )  # fmt: skip

    def run(self, job_name: str, stage: int, spec_url: str) -> float:
        from tasks.launchers.errors import JobError
        from tasks.launchers.protocol import launch_job

        if os.environ.get(JOBS_ENV) == "in-process":
            return job(job_name, spec_url, self.log)
        t0 = time.monotonic()
        with open(self.log, "a") as out:
            try:
                launch_job(self._request(job_name, stage, spec_url), self.impl, lambda line: print(line, file=out))
            except JobError as e:
                raise SystemExit(f"{job_name} job of stage {stage} failed; see {self.log}") from e
        return time.monotonic() - t0

    def submit(self, job_name: str, stage: int, spec_url: str) -> _Process:
        if os.environ.get(JOBS_ENV) == "in-process":
            job(job_name, spec_url, self.log)
            return _Process(job_name)
        pool = ThreadPoolExecutor(1, thread_name_prefix=f"{job_name}-{stage}")
        future = pool.submit(self.run, job_name, stage, spec_url)
        pool.shutdown(wait=False)
        return _Process(job_name, future)

    def prestart(self, job_name: str, stage: int, spec_url: str) -> None:
        if os.environ.get(JOBS_ENV) != "in-process":
            self.impl.prestart(self._request(job_name, stage, spec_url))

    def discard_prestarted(self) -> None:
        self.impl.discard_prestarted({"run": self.cfg.run.id})


def run_cold(cfg, log: Path) -> list[dict]:
    """Every stage of ``cfg`` cold, as the stage flow runs them (:func:`mugrpo.execution.pipeline.run_stage`); returns
    each stage's timings."""
    from mugrpo.execution.pipeline import run_stage
    from mugrpo.orchestration.runs import attach_run, init_run

    init_run(cfg)
    run, launcher = attach_run(cfg), ProcessLauncher(cfg, log)
    return [run_stage(run, k, launcher, say=lambda _: None).timings.model_dump() for k in range(cfg.run.num_stages)]


def run_warm(cfg, log: Path, tmp: Path) -> list[dict]:
    from flows.stage import job_python
    from mugrpo.commits.manifest import read_manifest
    from mugrpo.execution.warm import SegmentSpec
    from mugrpo.orchestration.runs import init_run

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
        from mugrpo.policy.models import make_tiny_random_model

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
