"""Work lost per preemption of a train job: the main job's training stage preempted at random moments, with the
SIGTERM and grace a stop or an eviction gives (this code: the job saves the update in flight or drops it) against
what a preemption cost before jobs handled SIGTERM (its default action ended the process at once, as a SIGKILL
does: every update since the last checkpoint lost). Target: <= 1 update lost per preemption.

    python bench/preemption.py                 # the main job's train stage (configs/smollm2-arithmetic.yaml, SmolLM2)
    python bench/preemption.py --quick         # tiny random Llama, 3 moments per arm (CI runs it)
    python bench/preemption.py --moments 20 --before-moments 6 --seed 0 --json out.json

The stage: ``train`` of the config (updates_per_stage, checkpoint_every, rollouts_per_update, micro-batches, lr,
precision resolved as the run would) on synthetic rollouts of its shape (``generation.prompts_per_stage`` groups of
``sampling.n``, responses up to ``max_new_tokens``, prompts of ~100 tokens; :mod:`bench.support.synthetic`), so
only the train job runs. A moment is drawn from the seed as (x, f): the signal lands a fraction f into update
u = s + 1 + floor(x * (U - s)) of the job's next run, where s is the update the stage resumes from; each arm
re-runs the job after every signal (it resumes from its last checkpoint), so the moments of one arm follow each
other through the stage, which restarts from scratch once committed. Arms alternate moment by moment.

The signal is followed by a SIGKILL once the grace has passed, as a stop (``mugrpo run``) and Kubernetes
(``terminationGracePeriodSeconds``) do: work a job had not committed by then is lost.

Update starts are read from the job's log through the pause point ``train/stage=0/update=u`` with a pause of 0 s
(:mod:`mugrpo.common.faults`): the job prints one line as update u starts and goes on at once.

Work lost per preemption (updates) = completed updates redone by the re-run + the fraction of the update in flight
that is thrown away: ``(u - 1 + f) - saved`` when the saved update is below u, else 0 (``saved``: the stage update of
the latest committed checkpoint after the exit, 0 for none).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = "bench-preempt"
MAIN_CONFIG = REPO / "configs" / "smollm2-arithmetic.yaml"
#: The arms: how the preemption is delivered. "before": SIGKILL, what a SIGTERM did to a job with no handler.
ARMS = {"sigterm": signal.SIGTERM, "before": signal.SIGKILL}


@dataclass
class Moment:
    """One preemption of an arm's job and what it cost."""

    arm: str
    index: int
    update: int  # the update in flight at the signal (1-based)
    fraction: float  # how far into it (of the mean update time so far)
    resumed_from: int  # the update the job resumed from
    saved: int  # the latest committed checkpoint after the exit (0: none)
    exit_code: int | None
    exit_s: float  # seconds from the signal to the exit
    lost: float  # updates of work lost (module docstring)
    said: str  # the job's "preempted:" line, if any


#: Each arm's last measured seconds per update (the signal's place inside an update).
_UPDATE_S: dict[str, float] = {}


def _draw(seed: int, n: int) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    return [(rng.random(), rng.random()) for _ in range(n)]


def _spec(args, work: Path, model_dir: Path):
    """The train spec of stage 0 of the bench run: the main config's train section (or a tiny one with --quick)."""
    from mugrpo.config.loading import load_config
    from mugrpo.trainer.spec import TrainSpec

    if args.quick:
        sys.path.insert(0, str(REPO / "tests"))
        from _tiny import train_spec

        train = {"updates_per_stage": 6, "checkpoint_every": 6, "warmup_updates": 0}
        return train_spec(work / "root", RUN, train=train)
    cfg = load_config(MAIN_CONFIG, [f"run.root={work / 'root'}", f"run.id={RUN}", f"model.source={model_dir}"])
    return TrainSpec.from_config(cfg, 0, 0)


def _base(args, work: Path, model_dir: Path) -> Path:
    """A pristine root: the policy and the synthetic rollouts of stage 0 (copied per arm, and again at a restart)."""
    from bench.support.synthetic import commit_synthetic_stage
    from mugrpo.storage.store import Store

    base = work / "base"
    if not (base / RUN).exists():
        shape = (
            {"num_prompts": 8, "group_size": 4}
            if args.quick
            else {"num_prompts": 16, "group_size": 8, "response_tokens": (12, 32), "prompt_repeat": 6}
        )
        commit_synthetic_stage(Store(str(base)), RUN, model_dir, seed=0, **shape)
    return base


def _fresh(base: Path, root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base, root)


def _latest(root: Path) -> int:
    from mugrpo.commits.manifest import latest_checkpoint
    from mugrpo.storage.layout import RunLayout
    from mugrpo.storage.store import Store

    return latest_checkpoint(Store(str(root)), RunLayout(RUN), 0) or 0


def _committed(root: Path) -> bool:
    from mugrpo.commits.manifest import read_job_manifest
    from mugrpo.storage.store import Store

    return read_job_manifest(Store(str(root)), RUN, 0, "train") is not None


def _preempt(arm: str, spec_path: Path, root: Path, log: Path, x: float, f: float, grace_s: float, index: int):
    """Run the job once, signal it at the drawn moment, wait for its exit; the :class:`Moment`."""
    from mugrpo.common.faults import FAULT_ENV
    from mugrpo.common.preemption import GRACE_ENV

    total = json.loads(spec_path.read_text())["train"]["updates_per_stage"]
    start = _latest(root)
    target = start + 1 + int(x * (total - start))
    env = {**os.environ, "PYTHONPATH": str(REPO), FAULT_ENV: "train/stage=0/update=:0", GRACE_ENV: f"{grace_s:g}"}
    log.write_text("")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mugrpo.jobs.train", str(spec_path)], cwd=REPO, env=env, stdout=out, stderr=out
        )
    seen: dict[int, float] = {}
    while proc.poll() is None:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(f"{FAULT_ENV} train/stage=0/update="):
                u = int(line.rsplit("=", 1)[1])
                seen.setdefault(u, time.monotonic())
        if target in seen:
            break
        time.sleep(0.02)
    if proc.poll() is not None:
        raise RuntimeError(f"{arm}: the job ended before update {target}:\n{log.read_text()[-3000:]}")
    starts = sorted(seen.items())
    steps = [b[1] - a[1] for a, b in zip(starts, starts[1:], strict=False)]
    if steps:  # this job's mean update so far, else the arm's last measure (the same stage, the same machine)
        _UPDATE_S[arm] = sum(steps) / len(steps)
    if arm in _UPDATE_S:
        time.sleep(max(f * _UPDATE_S[arm] - (time.monotonic() - seen[target]), 0.0))
    else:
        f = 0.0  # the arm's very first update: no measure yet, the signal lands at its start
    t0 = time.monotonic()
    proc.send_signal(ARMS[arm])
    try:  # the grace ends in a SIGKILL, as a stop and Kubernetes end it
        code = proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait(timeout=60)
    exit_s = time.monotonic() - t0
    saved = _latest(root)
    text = log.read_text(errors="replace")
    said = next((line for line in text.splitlines() if line.startswith("preempted: ")), "")
    lost = max(0.0, (target - 1 + f) - saved) if saved < target else 0.0
    return Moment(arm, index, target, round(f, 3), start, saved, code, round(exit_s, 2), round(lost, 3), said)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny random Llama, 3 moments per arm")
    ap.add_argument("--moments", type=int, default=None, help="preemptions per arm (default 20; --quick: 3)")
    ap.add_argument(
        "--before-moments",
        type=int,
        default=None,
        help="preemptions of the 'before' arm (default: as many as --moments); its loss is the updates since the last "
        "checkpoint, so fewer moments pin it down",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grace", type=float, default=None, help="job grace in s (default: the main job's stop)")
    ap.add_argument("--model", default=None, help="HF dir (default: SmolLM2-135M-Instruct; --quick: tiny)")
    ap.add_argument("--work", type=Path, default=None, help="folder for the runs (default: a temp dir, removed)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from mugrpo.common.preemption import job_grace_s
    from mugrpo.config.loading import load_config
    from mugrpo.policy.models import bench_model_dir

    work = args.work or Path(tempfile.mkdtemp(prefix="mugrpo-bench-preempt-"))
    work.mkdir(parents=True, exist_ok=True)
    n = args.moments or (3 if args.quick else 20)
    before_n = min(n, args.before_moments or n)
    grace = args.grace or job_grace_s(load_config(MAIN_CONFIG).orchestration.stop_grace_s)
    model_dir = bench_model_dir(args.model or ("tiny" if args.quick else "smollm2"), work / "models")
    base = _base(args, work, model_dir)
    spec = _spec(args, work, model_dir)
    total, every = spec.train.updates_per_stage, spec.train.checkpoint_every
    print(f"preemption: {n} moments ({before_n} of the before arm), seed {args.seed}, grace {grace:g} s, {total} "
          f"updates per stage, checkpoint every {every}; model {model_dir.name}")  # fmt: skip
    results: list[Moment] = []
    roots = {}
    for arm in ARMS:
        roots[arm] = work / arm
        _fresh(base, roots[arm])
        spec_path = work / f"{arm}.spec.json"
        spec_path.write_text(spec.model_copy(update={"root": str(roots[arm])}).model_dump_json())
    t_start = time.monotonic()
    try:
        for i, (x, f) in enumerate(_draw(args.seed, n)):
            order = list(ARMS) if i % 2 == 0 else list(reversed(ARMS))
            for arm in order:
                if arm == "before" and i >= before_n:
                    continue
                if _committed(roots[arm]):
                    _fresh(base, roots[arm])
                m = _preempt(arm, work / f"{arm}.spec.json", roots[arm], work / f"{arm}.log", x, f, grace, i)
                results.append(m)
                print(f"  {arm:8s} #{i:2d}: update {m.update} (+{m.fraction:.2f}), resumed from {m.resumed_from}, "
                      f"saved {m.saved}, exit {m.exit_code} in {m.exit_s:.1f} s, lost {m.lost:.2f}")  # fmt: skip
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for arm in ARMS:
        rows = [m for m in results if m.arm == arm]
        lost = [m.lost for m in rows]
        summary[arm] = {
            "moments": len(rows),
            "mean_lost": sum(lost) / len(lost),
            "max_lost": max(lost),
            "over_one": sum(1 for v in lost if v > 1.0),
            "max_exit_s": max(m.exit_s for m in rows),
            "exit_codes": sorted({m.exit_code for m in rows}, key=str),
        }
        s = summary[arm]
        print(f"{arm}: {s['moments']} preemptions, updates lost mean {s['mean_lost']:.2f}, max {s['max_lost']:.2f}, "
              f"{s['over_one']} over 1; exit within {s['max_exit_s']:.1f} s; exit codes {s['exit_codes']}")  # fmt: skip
    after, before = summary["sigterm"]["mean_lost"], summary["before"]["mean_lost"]
    ratio = f"{before / after:.1f}x less" if after > 0 else "none lost"
    met = summary["sigterm"]["max_lost"] <= 1.0
    print(f"work lost per preemption: {after:.2f} updates vs {before:.2f} before ({ratio}); target <= 1 update per "
          f"preemption: {'met' if met else 'MISSED'}; {time.monotonic() - t_start:.0f} s")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "moments": [asdict(m) for m in results]}, indent=2))
    return 0 if met else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
