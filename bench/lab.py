"""The lab, measured: `mugrpo lab init` from a clean cache, then each configs/lab/ algorithm over several seeds.

    python bench/lab.py --fresh-cache --init-only             # lab init from a clean state: time and accuracies
    python bench/lab.py --algos grpo mu-grpo --seeds 0 1 2    # held-out greedy before/after, avg@8, wall time

Each run is `mugrpo run configs/lab/ALGO.yaml run.seed=SEED` (a temporary Prefect server per run, as a user gets).
Per run it prints held-out greedy accuracy (200 problems) of the lab policy (stage 0) and of the final policy, avg@8
at T = 1 (100 problems) of both, and the wall time of the whole command. The runs are deterministic, so the
accuracies do not depend on machine load; the wall times do (run under /work/bin/cpu-quiet to record them). Run
folders are deleted once read unless --keep-runs.
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

REPO = Path(__file__).resolve().parents[1]


def lab_init(cache: Path | None) -> dict:
    """`mugrpo lab init` (into ``cache`` if given); returns its lab.json record plus the command's wall seconds."""
    env = {**os.environ, **({"MUGRPO_LAB_CACHE": str(cache)} if cache else {})}
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "mugrpo.cli", "lab", "init"], env=env, capture_output=True, text=True, check=True
    )
    wall = time.monotonic() - t0
    path = Path(out.stdout.strip().splitlines()[-1])
    return {**json.loads((path / "lab.json").read_text()), "wall_s": wall, "path": str(path)}


def accuracy(run_dir: Path, benchmark: str) -> dict[int, float]:
    """Held-out accuracy of ``benchmark`` by evaluated policy (stage k: stage k's behavior policy; the last: final)."""
    from mugrpo.sql import connect

    with connect(str(run_dir)) as cat:
        rows = cat.arrow(
            "SELECT stage, avg(CASE WHEN correct THEN 1.0 ELSE 0.0 END) AS acc FROM evals "
            f"WHERE benchmark = '{benchmark}' GROUP BY stage ORDER BY stage"
        ).to_pylist()
    return {r["stage"]: r["acc"] for r in rows}


def run_algo(algo: str, seed: int, root: Path, overrides: list[str]) -> dict:
    """One `mugrpo run` of configs/lab/ALGO.yaml at ``seed``; returns its figures."""
    run_id = f"lab-{algo}-s{seed}"
    cmd = [sys.executable, "-m", "mugrpo.cli", "run", str(REPO / "configs" / "lab" / f"{algo}.yaml")]
    cmd += [f"run.seed={seed}", f"run.id={run_id}", f"run.root={root}", *overrides]
    log = root / f"{run_id}.log"
    t0 = time.monotonic()
    with log.open("wb") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - t0
    if code != 0:
        raise SystemExit(f"{run_id} failed (exit {code}):\n{log.read_text()[-3000:]}")
    greedy, sampled = accuracy(root / run_id, "lab-heldout"), accuracy(root / run_id, "lab-heldout-t1")
    last = max(greedy)
    return {
        "algo": algo,
        "seed": seed,
        "greedy_before": greedy[0],
        "greedy_after": greedy[last],
        "greedy_by_policy": greedy,
        "avg8_before": sampled[0],
        "avg8_after": sampled[last],
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="*", default=["mu-grpo", "grpo", "naive", "replay", "conspo", "agpo"])
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--root", type=Path, default=None, help="Where runs go (default: a temporary folder).")
    parser.add_argument("--fresh-cache", action="store_true", help="Build the lab policy into an empty cache.")
    parser.add_argument("--init-only", action="store_true", help="Only `mugrpo lab init`.")
    parser.add_argument("--keep-runs", action="store_true", help="Keep the run folders.")
    parser.add_argument("--out", type=Path, default=None, help="Also write the figures here as JSON.")
    parser.add_argument("overrides", nargs="*", help="Config overrides for every run (key=value).")
    args = parser.parse_args(argv)

    cache = Path(tempfile.mkdtemp(prefix="mugrpo-lab-cache-")) if args.fresh_cache else None
    init = lab_init(cache)
    held = init["heldout"]
    print(
        f"lab init: {init['wall_s']:.0f} s wall ({init['seconds']['sft']:.0f} s SFT, {init['steps']} steps, "
        f"{init['parameters'] / 1e6:.2f} M parameters); held-out ({held['greedy']['n']}): greedy "
        f"{held['greedy']['accuracy']:.3f}, T=1 {held['t1']['accuracy']:.3f}",
        flush=True,
    )
    results: dict = {"init": init, "runs": []}
    if not args.init_only:
        root = args.root or Path(tempfile.mkdtemp(prefix="mugrpo-lab-runs-"))
        root.mkdir(parents=True, exist_ok=True)
        env_cache = {"MUGRPO_LAB_CACHE": str(cache)} if cache else {}
        os.environ.update(env_cache)
        print("| algo | seed | greedy before | greedy after | gain | avg@8 before | avg@8 after | wall s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for algo in args.algos:
            for seed in args.seeds:
                r = run_algo(algo, seed, root, args.overrides)
                results["runs"].append(r)
                print(
                    f"| {algo} | {seed} | {r['greedy_before']:.3f} | {r['greedy_after']:.3f} | "
                    f"{r['greedy_after'] - r['greedy_before']:+.3f} | {r['avg8_before']:.3f} | {r['avg8_after']:.3f} | "
                    f"{r['wall_s']:.0f} |",
                    flush=True,
                )
                if args.out:  # after every run: a stopped bench keeps the figures it has
                    args.out.write_text(json.dumps(results, indent=2, default=str))
                if not args.keep_runs:
                    shutil.rmtree(root / f"lab-{algo}-s{seed}", ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, default=str))
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
