"""Job start: seconds from spawn to the generate job's first token and to the train job's first update, for a git ref
("before") against this checkout ("after"), arms alternated; the disk-bound policy and moment loads apart.

    python bench/job_start.py --before main                       # tiny random Llama, 5 rounds
    python bench/job_start.py --before main --model smollm2 --repeats 7 --json out.json
    python bench/job_start.py --before HEAD~3 --model tiny --repeats 1 --threads 1      # a quick check it works

Each job is spawned as the subprocess launcher spawns it (``python -m mugrpo.jobs.KIND SPEC``, this interpreter,
``PYTHONUNBUFFERED=1``) through ``bench/support/job_probe.py``, which stamps the first sampled token, the first
optimizer update, and the seconds of each ``from_pretrained`` weight load and AdamW moment read, without
importing anything ahead of the job. The "before" arm runs the same interpreter with a temporary git worktree
of ``--before`` first on PYTHONPATH; the "after" arm runs this checkout. Rounds alternate the order (before, after;
then after, before), each job runs on a fresh hard-linked copy of a prepared run folder, and the figures are
medians over rounds:

- generate: a stage-0 generate job (policy ``policies/stage=0``, GSM8K prompts, the verifier pool), spawn to first
  token;
- train: a stage-1 train job of a run whose stage 0 was trained (so it reads the stage-0 checkpoint's AdamW
  moments, as every Mu-GRPO stage after the first does), on synthetic committed rollouts, spawn to first update;
- import: ``python -c "import mugrpo.jobs.KIND"``, spawn to exit (the job module's imports alone);
- "less loads": spawn to first work minus the disk-bound weight and moment loads (the figure the 3 s targets
  of the job-start issue count).

The ratio is after / before (below 1: the start got faster). Nothing is asserted; a loaded machine inflates every
figure, so compare ratios, not seconds, unless the machine is quiet.
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
    sys.path.insert(0, str(REPO))  # bench.support, mugrpo: this checkout
PROBE = REPO / "bench" / "support" / "job_probe.py"
DATA = REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
JOBS = ("generate", "train")


def _env(pythonpath: Path, threads: int | None) -> dict[str, str]:
    """A job's environment: this checkout on PYTHONPATH and ``threads`` OpenMP/MKL threads; ``threads=None`` leaves
    the thread count to the process (a vLLM engine: its CPU worker sets and binds its own OpenMP threads, and an
    ``OMP_NUM_THREADS`` set for it slowed SmolLM2 decoding ~12x on 2 cores, docs/benchmarks.md)."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    if threads is None:
        env.pop("OMP_NUM_THREADS", None)
        env.pop("MKL_NUM_THREADS", None)
    else:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        sys.exit(f"{what} failed ({proc.returncode}):\n{proc.stdout[-4000:]}")


def generate_spec(run_id: str, prompts: int, shard_size: int, max_new_tokens: int, group_size: int = 4, **fields):
    """A stage-0 GenerateSpec of run ``run_id`` (root ``"ROOT"``, replaced per spawn by :func:`one_job`) on GSM8K
    train prompts, policy ``policies/stage=0``, the verifier pool of one worker; ``fields`` override the rest (e.g.
    ``engine``, ``dtype``, ``engine_kwargs``)."""
    from mugrpo.data.datasets import DatasetConfig
    from mugrpo.generation import GenerateSpec
    from mugrpo.rewards import RewardConfig
    from mugrpo.storage.layout import RunLayout

    return GenerateSpec(
        root="ROOT",
        run_id=run_id,
        stage=0,
        seed=3,
        policy_dir=RunLayout(run_id).policy_dir(0),
        dataset=DatasetConfig(name="gsm8k", path=str(DATA), answer_kind="gsm8k", limit=200),
        num_prompts=prompts,
        shard_size=shard_size,
        sampling={"temperature": 1.0, "max_new_tokens": max_new_tokens, "n": group_size},
        reward=RewardConfig(components={"math_correctness": 1.0, "format": 0.5}, num_workers=1),
        **fields,
    )


def prepare(work: Path, model: str, threads: int, prompts: int, max_new_tokens: int) -> dict[str, Path]:
    """The prepared run folders (``generate``, ``train``) and their job specs, made with this checkout."""
    from bench.support.synthetic import commit_synthetic_stage
    from mugrpo.policy.models import bench_model_dir
    from mugrpo.storage.layout import RunLayout
    from mugrpo.storage.store import Store
    from mugrpo.trainer.spec import TrainSpec

    policy = bench_model_dir(model, work / "models")
    gen_root = work / "pristine-generate"
    Store(str(gen_root)).upload_dir(policy, RunLayout("start-gen").policy_dir(0))
    gen = generate_spec("start-gen", prompts, max(1, prompts // 2), max_new_tokens)
    train_root = work / "pristine-train"
    store = Store(str(train_root))
    train = {"updates_per_stage": 2, "rollouts_per_update": 8, "micro_batch_size": 4, "checkpoint_every": 2}
    commit_synthetic_stage(store, "start-train", policy, stage=0, num_prompts=4, group_size=4)
    stage0 = TrainSpec(root=str(train_root), run_id="start-train", stage=0, policy_version=0, train=train)
    spec0 = work / "train-stage0.json"
    spec0.write_text(stage0.model_dump_json())
    proc = subprocess.run(
        [sys.executable, "-m", "mugrpo.jobs.train", str(spec0)],
        env=_env(REPO, threads),
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    _check(proc, "preparing: the stage-0 train job")
    commit_synthetic_stage(
        store, "start-train", policy, stage=1, num_prompts=4, group_size=4, upload_policy=False, seed=1
    )
    stage1 = TrainSpec(root="ROOT", run_id="start-train", stage=1, policy_version=2, train=train)
    specs = {}
    for job, spec in (("generate", gen), ("train", stage1)):
        specs[job] = work / f"{job}.spec.json"
        specs[job].write_text(spec.model_dump_json())
    return {"generate-root": gen_root, "train-root": train_root, **specs}


def before_tree(ref: str, work: Path) -> Path:
    """A detached git worktree of ``ref`` under ``work`` (removed by :func:`drop_tree`)."""
    tree = work / "before"
    proc = subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), ref], capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"git worktree add {ref} failed:\n{proc.stderr}")
    return tree


def drop_tree(tree: Path) -> None:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)


def one_job(
    job: str,
    tree: Path,
    prepared: dict[str, Path],
    work: Path,
    threads: int | None,
    *,
    python: str = sys.executable,
    inspect=None,
) -> dict[str, float]:
    """One spawn of ``job`` from ``tree`` by interpreter ``python`` on a fresh copy of its prepared run folder;
    seconds since the spawn. ``inspect(root)``, if given, reads the run folder before it is removed; its dict is
    merged into the result. For a vLLM generate job ``first_work`` is the end of its first engine batch (its tokens
    are not observable one by one), for the transformers engine the first token; ``engine_ready`` is spawn to the
    rollout engine built (both engines)."""
    root = Path(tempfile.mkdtemp(prefix=f"{job}-", dir=work))
    shutil.rmtree(root)
    subprocess.run(["cp", "-al", str(prepared[f"{job}-root"]), str(root)], check=True)
    spec = root.with_suffix(".spec.json")
    spec.write_text(prepared[job].read_text().replace('"ROOT"', json.dumps(str(root))))
    out = root.with_suffix(".probe.json")
    cmd = [python, str(PROBE), str(out), f"mugrpo.jobs.{job}", str(spec)]
    try:
        t_spawn = time.monotonic()
        proc = subprocess.run(cmd, env=_env(tree, threads), cwd=tree, capture_output=True, text=True)
        t_exit = time.monotonic()
        _check(proc, f"{job} job from {tree}")
        rec = json.loads(out.read_text())
        extra = inspect(root) if inspect is not None else {}
    finally:
        shutil.rmtree(root, ignore_errors=True)
        spec.unlink(missing_ok=True)
        out.unlink(missing_ok=True)
    first = rec["first_update"] if job != "generate" else rec.get("first_token", rec.get("first_batch"))
    loads = rec.get("policy_load_s", 0.0) + rec.get("moment_load_s", 0.0)
    return {
        "first_work": first - t_spawn,
        "interpreter": rec["probe_start"] - t_spawn,
        "policy_load": rec.get("policy_load_s", 0.0),
        "policy_loads": rec.get("policy_loads", 0),
        "tokenizer_loads": rec.get("tokenizer_loads", 0),
        "moment_load": rec.get("moment_load_s", 0.0),
        "less_loads": first - t_spawn - loads,
        "exit": t_exit - t_spawn,
        **({"engine_ready": rec["engine_ready"] - t_spawn} if "engine_ready" in rec else {}),
        **extra,
    }


def import_time(job: str, tree: Path, threads: int) -> float:
    """Seconds from spawn to exit of ``python -c "import mugrpo.jobs.JOB"`` from ``tree``."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", f"import mugrpo.jobs.{job}"],
        env=_env(tree, threads),
        cwd=tree,
        capture_output=True,
        text=True,
    )
    _check(proc, f"import mugrpo.jobs.{job} from {tree}")
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git ref of the 'before' arm (e.g. main)")
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or an HF dir (bench_model_dir)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds; each runs both arms, order alternated")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--workdir", help="default: a temporary folder (removed at the end)")
    parser.add_argument("--json", help="write every sample and the medians here")
    args = parser.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="job-start-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    tree = before_tree(args.before, work)
    arms = {"before": tree, "after": REPO}
    samples: dict[str, dict[str, list[dict[str, float]]]] = {arm: {} for arm in arms}
    try:
        prepared = prepare(work, args.model, args.threads, args.prompts, args.max_new_tokens)
        for r in range(args.repeats):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for arm in order:
                for job in JOBS:
                    samples[arm].setdefault(job, []).append(one_job(job, arms[arm], prepared, work, args.threads))
                    imp = {"first_work": import_time(job, arms[arm], args.threads)}
                    samples[arm].setdefault(f"import {job}", []).append(imp)
            print(f"round {r + 1}/{args.repeats} done ({' then '.join(order)})", flush=True)
    finally:
        drop_tree(tree)
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    medians = {
        arm: {what: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for what, runs in by.items()}
        for arm, by in samples.items()
    }
    print(f"\nmedians over {args.repeats} rounds, model {args.model}, {args.threads} thread(s), before = {args.before}")
    print(f"{'figure':42} {'before s':>9} {'after s':>9} {'after/before':>13}")
    rows = [
        ("generate: spawn -> first token", "generate", "first_work"),
        ("generate: same, less the weight loads", "generate", "less_loads"),
        ("generate: weight loads (disk-bound)", "generate", "policy_load"),
        ("generate: interpreter up", "generate", "interpreter"),
        ("train: spawn -> first update", "train", "first_work"),
        ("train: same, less weight and moment loads", "train", "less_loads"),
        ("train: weight loads (disk-bound)", "train", "policy_load"),
        ("train: AdamW moment loads (disk-bound)", "train", "moment_load"),
        ("import mugrpo.jobs.generate", "import generate", "first_work"),
        ("import mugrpo.jobs.train", "import train", "first_work"),
    ]
    for label, what, key in rows:
        b, a = medians["before"][what][key], medians["after"][what][key]
        print(f"{label:42} {b:9.2f} {a:9.2f} {a / b if b else float('nan'):13.2f}")
    for job in JOBS:
        for what in ("policy_loads", "tokenizer_loads"):
            n = {arm: medians[arm][job][what] for arm in arms}
            print(f"{job}: {what} by mugrpo.policy.models per job: before {n['before']:g}, after {n['after']:g}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "samples": samples, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
