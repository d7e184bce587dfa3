"""Branching a run: an lr ablation from stage K as a fork that reuses the parent's rollouts, against a fresh run of
the same config (docs/branching.md).

    python bench/fork.py                       # the main job (configs/smollm2-arithmetic.yaml), K = 2, lr 1e-5
    python bench/fork.py --quick               # a tiny random policy, 2 stages, K = 1: the plumbing, not the figures
    python bench/fork.py --baseline parent     # the parent itself as the fresh run (same work, lr 5e-6): half the time

The parent is the main job as shipped (one `mugrpo run`, not timed). Then, per repeat, two arms in alternating order
(the machine's load drifts), each the command a user runs:
- fresh: `mugrpo run CONFIG train.lr=LR` (a new run id): every stage sampled, trained and evaluated;
- fork:  `mugrpo fork PARENT --at-stage K --id ID --reuse-rollouts train.lr=LR`: stages below K referenced, stage K
         re-scored from the parent's responses, then trained like the fresh run from the parent's policy and AdamW
         moments; the evaluation of the policy of stage K is the parent's (the eval config is unchanged).
Both arms end with the same number of stages, updates and evaluated policies. For each it reports the command's wall
seconds, the seconds to its final policy (the final policy's commit marker, from the command's start) and the held-out
accuracy of each evaluated policy; then the ratio fork / fresh of both times against the target (<= 0.5). Nothing is
asserted; the precision and the machine are printed. The run folders are freed unless --keep is given.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.real_lm import MAIN, heldout_scores, quick_overrides  # noqa: E402

TARGET = 0.5


def _cli(args: list[str], log: Path) -> float:
    """Run ``mugrpo ARGS``; returns its wall seconds. Exits naming the log when it fails."""
    cmd = [sys.executable, "-m", "mugrpo.cli", *args]
    started = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, check=False).returncode
    if rc != 0:
        raise SystemExit(f"`mugrpo {' '.join(args[:2])}` failed with exit code {rc}; its output is in {log}")
    return time.monotonic() - started


def _report(root: Path, run_id: str, wall_s: float, started: float) -> dict:
    """Wall seconds, seconds to the final policy, and the held-out score of each problem at each policy the run
    evaluated itself (a fork's policy of stage K is evaluated by its parent)."""
    from mugrpo.evaluation.metrics import clustered_mean_ci

    cfg = json.loads((root / run_id / "run.json").read_text())["config"]
    final = root / run_id / "policies" / f"stage={cfg['run']['num_stages']}" / "_COMPLETE"
    scores = heldout_scores(root / run_id)
    return {
        "run_id": run_id,
        "wall_s": round(wall_s, 1),
        "to_final_policy_s": round(final.stat().st_mtime - started, 1),
        "accuracy": {k: round(clustered_mean_ci(list(v.values())).mean, 3) for k, v in sorted(scores.items())},
        "final_scores": scores[max(scores)],
    }


def run_fresh(root: Path, run_id: str, lr: str, extra: list[str], log: Path) -> dict:
    started = time.time()
    wall = _cli(["run", str(MAIN), f"run.root={root}", f"run.id={run_id}", f"train.lr={lr}", *extra], log)
    return _report(root, run_id, wall, started)


def run_fork(root: Path, run_id: str, stage: int, lr: str, log: Path) -> dict:
    started = time.time()
    args = ["fork", str(root / "parent"), "--at-stage", str(stage), "--id", run_id, "--reuse-rollouts"]
    wall = _cli([*args, f"train.lr={lr}"], log)
    return _report(root, run_id, wall, started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", type=int, default=2, help="K: the fork stage (default 2; --quick: 1)")
    parser.add_argument("--lr", default="1.0e-5", help="the ablation's train.lr (the main job's is 5e-6)")
    parser.add_argument("--repeats", type=int, default=1, help="pairs of arms, their order alternating")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--keep", type=Path, help="keep the runs under this folder (default: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="tiny random policy, 2 stages: the plumbing")
    parser.add_argument(
        "--baseline",
        choices=["fresh", "parent"],
        default="fresh",
        help="fresh: a new run of the fork's config (the default); parent: the parent run itself, the same stages, "
        "prompts, G and updates at the main job's lr (half the bench's time: the lr changes no amount of work)",
    )
    args = parser.parse_args()

    from mugrpo.inspection.environment import environment_report

    root = args.keep or Path(tempfile.mkdtemp(prefix="mugrpo-fork-"))
    root.mkdir(parents=True, exist_ok=True)
    log = root / "bench.log"
    extra: list[str] = []
    stage = args.stage
    if args.quick:
        from mugrpo.policy.models import make_tiny_random_model

        extra = [*quick_overrides(make_tiny_random_model(root / "tiny-model", seed=0)), "run.num_stages=2"]
        stage = 1
    env = environment_report()
    print(f"date {datetime.date.today()}  cpu {env['cpu']}  torch {env['packages']['torch']}")
    print(f"auto precision: {env['auto_precision']['choice']} ({env['auto_precision']['reason']})")
    print(f"runs under {root}; their output in {log}")
    results: dict[str, list[dict]] = {"fresh": [], "fork": []}
    try:
        timing = root / "parent.timing.json"  # the parent's own figures, kept with it for --keep reruns
        if not timing.exists():
            started = time.time()
            wall = _cli(["run", str(MAIN), f"run.root={root}", "run.id=parent", *extra], log)
            timing.write_text(json.dumps({"wall_s": wall, "started": started}))
        parent = _report(root, "parent", **json.loads(timing.read_text()))
        print(
            f"parent (the main job as shipped): {parent['wall_s']:.0f} s, final policy after "
            f"{parent['to_final_policy_s']:.0f} s"
        )
        for i in range(args.repeats):
            order = ["fresh", "fork"] if i % 2 == 0 else ["fork", "fresh"]
            for arm in order:
                if arm == "fresh" and args.baseline == "parent":
                    results[arm].append(parent)  # the same work: the configs differ in train.lr only
                    continue
                run_id = f"{arm}-{i}"
                if arm == "fresh":
                    results[arm].append(run_fresh(root, run_id, args.lr, extra, log))
                else:
                    results[arm].append(run_fork(root, run_id, stage, args.lr, log))
                r = results[arm][-1]
                print(f"  {arm} #{i}: {r['wall_s']:.0f} s wall, final policy after {r['to_final_policy_s']:.0f} s")
    finally:
        summary = {}
        if results["fresh"] and len(results["fork"]) == len(results["fresh"]):
            fresh_wall = sum(r["wall_s"] for r in results["fresh"])
            fresh_final = sum(r["to_final_policy_s"] for r in results["fresh"])
            summary = {
                "wall_ratio": sum(r["wall_s"] for r in results["fork"]) / fresh_wall,
                "to_final_policy_ratio": sum(r["to_final_policy_s"] for r in results["fork"]) / fresh_final,
            }
            for name, ratio in list(summary.items()):
                verdict = "met" if ratio <= TARGET else "missed"
                print(f"fork / fresh, {name.removesuffix('_ratio')}: {ratio:.2f} (target <= {TARGET}: {verdict})")
            for arm, runs in results.items():
                print(f"  {arm} held-out accuracy by stage: {runs[-1]['accuracy']}")
            from mugrpo.evaluation.metrics import paired_difference_ci

            diff = paired_difference_ci(results["fork"][-1]["final_scores"], results["fresh"][-1]["final_scores"])
            summary["final_fork_minus_fresh"] = {"mean": diff.mean, "ci95": [diff.low, diff.high], "problems": diff.n}
            print(f"final policy, fork - fresh: {diff.mean:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}] (paired)")
        if args.out:
            record = {"date": str(datetime.date.today()), "env": env, "stage": stage, "lr": args.lr}
            args.out.write_text(json.dumps({**record, "results": results, "summary": summary}, indent=2))
        if args.keep is None:  # a SmolLM2 run writes ~2-7 GB: freed
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
