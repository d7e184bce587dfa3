"""Fingerprints of what runs compute: sha256 of their rollouts, train_steps, evals, replay tables and final weights.

A refactor that moves code must leave these unchanged. Run it before and after, on the same machine, and compare:

    python bench/behavior_hashes.py --out before.json                      # tiny and synthetic runs (minutes)
    python bench/behavior_hashes.py --runs quick --out before-quick.json   # configs/gsm8k-smollm2-quick.yaml
    python bench/behavior_hashes.py --compare before.json after.json

Runs (all on CPU, real job processes and files):

- ``tiny-cold`` / ``tiny-warm``: the 3-stage tiny-policy config of ``tests/e2e/test_warm.py`` (GRPO, mu = 4), run cold
  (generate, train and eval job processes per stage, then the stage commit) and warm (one segment job that
  publishes every 2 stages).
- ``tiny-replay``: the same, cold, with the rollout-level replay buffer on (draws from update 3).
- ``tiny-agpo``: 2 stages, cold, AGPO (probes, adaptive temperatures, the agpo loss and its clip controller).
- ``tiny-conspo``: 2 stages, cold, ConSPO (whole-group minibatches, positive labels).
- ``syn-*``: train jobs (``python -m mugrpo.jobs.train``) on 3 committed synthetic stages per arm (the tiny policy's
  own responses with made-up binary rewards, so advantages and gradients are not zero, unlike the tiny runs above
  whose rewards are all 0): Mu-GRPO, GRPO with the replay buffer drawing, AGPO's loss and clip controller (probe
  statistics made up per prompt), ConSPO.
- ``quick`` (``--runs quick``): ``mugrpo run configs/gsm8k-smollm2-quick.yaml`` (SmolLM2-135M, bf16, Prefect).

Content hashes are over the rows of each table with the wall-clock columns left out (``created_at``, ``seconds``,
``tokens_per_second``), rows serialized as sorted JSON lines, so they do not depend on file order or timestamps.
Parquet file hashes are listed as well; rollout, train_steps and eval files hold ``created_at``, so those differ
between any two runs, while the replay buffer states and the weights are bitwise reproducible.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RUN = "hashes"
VOLATILE = {"created_at", "seconds", "tokens_per_second"}
TABLE_DIRS = ("rollouts", "train_steps", "evals", "replay")


def tiny_config(root: Path, model_dir: Path, stages: int = 3, **sections) -> dict:
    """The tiny-policy run config of tests/e2e/test_warm.py, with ``sections`` merged over it (one level deep)."""
    cfg = {
        "run": {"id": RUN, "root": str(root), "seed": 3, "num_stages": stages},
        "model": {"source": str(model_dir), "max_context": 512},
        "data": {
            "train": {"name": "gsm8k", "path": str(DATA / "gsm8k/train.jsonl"), "answer_kind": "gsm8k", "limit": 40}
        },
        "generation": {
            "prompts_per_stage": 4,
            "shard_size": 2,
            "sampling": {"temperature": 1.0, "max_new_tokens": 6, "n": 2},
        },
        "reward": {"components": {"math_correctness": 1.0, "format": 0.5}, "num_workers": 1},
        "loss": {"name": "grpo"},
        "train": {
            "updates_per_stage": 4,
            "rollouts_per_update": 4,
            "micro_batch_size": 2,
            "checkpoint_every": 2,
            "skip_zero_variance_groups": False,
            "lr": 1e-3,
        },
        "eval": {
            "every_stage": True,
            "benchmarks": [
                {
                    "dataset": {"name": "gsm8k", "path": str(DATA / "gsm8k/test.jsonl"), "answer_kind": "gsm8k"},
                    "num_prompts": 2,
                    "max_new_tokens": 4,
                }
            ],
        },
        "orchestration": {"retries": 0},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) and key in cfg else value
    return cfg


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _job(module: str, spec: str, log: Path) -> None:
    with open(log, "ab") as out:
        rc = subprocess.run(
            [sys.executable, "-m", f"mugrpo.jobs.{module}", spec], cwd=REPO, env=_env(), stdout=out, stderr=out
        ).returncode
    if rc != 0:
        raise SystemExit(f"{module} job failed (exit {rc}); see {log}")


def run_cold(cfg_dict: dict, log: Path) -> Path:
    """What the stage flow does in cold execution: generate, train (and eval) job processes, then the stage commit."""
    from mugrpo.config import config_from_dict
    from mugrpo.orchestration.job_specs import write_job_specs
    from mugrpo.orchestration.runs import attach_run, commit_stage, init_run
    from schemas import StageTimings

    cfg = config_from_dict(cfg_dict)
    init_run(cfg)
    run = attach_run(cfg)
    for k in range(cfg.run.num_stages):
        urls = write_job_specs(run, k)
        for job in ("generate", "train", "eval"):
            if job in urls:
                _job(job, urls[job], log)
        commit_stage(run, k, StageTimings())
    return Path(cfg.run.root) / RUN


def run_warm(cfg_dict: dict, log: Path, tmp: Path) -> Path:
    """One warm segment job over every stage."""
    from mugrpo.config import config_from_dict
    from mugrpo.execution.warm import SegmentSpec
    from mugrpo.orchestration.runs import init_run

    cfg = config_from_dict(cfg_dict)
    init_run(cfg)
    spec = tmp / f"segment-{cfg.run.id}.json"
    spec.write_text(SegmentSpec.from_config(cfg, 0, cfg.run.num_stages).model_dump_json())
    _job("segment", str(spec), log)
    return Path(cfg.run.root) / RUN


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def table_hash(files: list[Path]) -> dict:
    """Content hash of the rows of ``files`` (one table), wall-clock columns left out, order-independent."""
    import pyarrow.parquet as pq

    lines = []
    for f in files:
        table = pq.read_table(f)
        table = table.drop_columns([c for c in table.column_names if c in VOLATILE])
        lines += [json.dumps(row, sort_keys=True, default=str) for row in table.to_pylist()]
    return {"rows": len(lines), "sha256": _sha("\n".join(sorted(lines)).encode())}


def weights_hash(model_file: Path) -> dict:
    """sha256 of the file and of the tensors (name, dtype, shape, bytes in name order)."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(model_file))
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return {"tensors_sha256": h.hexdigest(), "file_sha256": _sha(model_file.read_bytes())}


def fingerprint(run_dir: Path, num_stages: int) -> dict:
    """Every table's content hash (per stage and overall), the Parquet file hashes and the final weights."""
    out: dict = {}
    for name in TABLE_DIRS:
        base = run_dir / name
        if not base.is_dir():
            continue
        files = sorted(base.rglob("*.parquet"))
        out[name] = {
            "all": table_hash(files),
            "stages": {d.name: table_hash(sorted(d.rglob("*.parquet"))) for d in sorted(base.iterdir()) if d.is_dir()},
            "files": {str(f.relative_to(run_dir)): _sha(f.read_bytes()) for f in files},
        }
    buffers = sorted((run_dir / "replay_buffer").rglob("*.parquet")) if (run_dir / "replay_buffer").is_dir() else []
    if buffers:
        out["replay_buffer"] = {
            "all": table_hash(buffers),
            "files": {str(f.relative_to(run_dir)): _sha(f.read_bytes()) for f in buffers},
        }
    out["final_weights"] = weights_hash(run_dir / "policies" / f"stage={num_stages}" / "model.safetensors")
    return out


def tiny_policy(tmp: Path) -> Path:
    """The tiny random Llama policy with the SmolLM2 tokenizer the tests use (deterministic)."""
    from mugrpo.policy.models import make_tiny_random_model

    return make_tiny_random_model(tmp / "tiny-policy" / "model", seed=0)


def tiny_runs(tmp: Path, model: Path) -> dict:
    log = tmp / "jobs.log"
    results = {}
    arms = {
        "tiny-cold": (tiny_config(tmp / "cold", model), "cold"),
        "tiny-warm": (
            tiny_config(
                tmp / "warm",
                model,
                orchestration={"retries": 0, "execution": "warm", "segment_stages": 3, "publish_policy_every": 2},
            ),
            "warm",
        ),
        "tiny-replay": (
            tiny_config(
                tmp / "replay",
                model,
                replay={"enabled": True, "ratio": 0.5, "alpha": 0.5, "tau_max": 5, "warmup_updates": 2},
            ),
            "cold",
        ),
        "tiny-agpo": (
            tiny_config(
                tmp / "agpo",
                model,
                stages=2,
                advantage={"estimator": "agpo", "dispersion": "std"},
                loss={"name": "agpo", "agg_mode": "seq-mean-token-mean"},
                agpo={"probe": True},
                train={"updates_per_stage": 2, "checkpoint_every": 1, "rollouts_per_update": 4},
            ),
            "cold",
        ),
        "tiny-conspo": (
            tiny_config(
                tmp / "conspo",
                model,
                stages=2,
                loss={"name": "conspo", "conspo": {"positive_rule": "reward_threshold", "positive_threshold": 0.5}},
                train={"group_minibatches": True, "updates_per_stage": 2},
            ),
            "cold",
        ),
    }
    for name, (cfg, how) in arms.items():
        print(f"[behavior_hashes] {name} ...", flush=True)
        run_dir = run_warm(cfg, log, tmp) if how == "warm" else run_cold(cfg, log)
        results[name] = fingerprint(run_dir, cfg["run"]["num_stages"])
        shutil.rmtree(run_dir.parent, ignore_errors=True)
    return results


SYN_STAGES, SYN_UPDATES = 3, 4
#: Synthetic arms: (loss section, train settings over the defaults below, other spec sections).
SYN_ARMS = {
    "syn-mu_grpo": ({"name": "mu_grpo"}, {}, {}),
    "syn-replay": (
        {"name": "grpo", "eps_low": 0.2, "eps_high": 0.28, "dual_clip_c": 10.0},
        {},
        {"replay": {"enabled": True, "ratio": 0.5, "alpha": 0.5, "tau_max": 5, "warmup_updates": 2, "capacity": 20}},
    ),
    "syn-agpo": (
        {"name": "agpo", "agg_mode": "seq-mean-token-mean", "kl_coef": 0.03, "kl_estimator": "k1"},
        {},
        {"agpo": {}},
    ),
    "syn-conspo": (
        {"name": "conspo", "conspo": {"tau": 1.0, "margin": 1.0, "margin_alpha": 1.0}},
        {"group_minibatches": True, "rollouts_per_update": 8, "micro_batch_size": 4},
        {},
    ),
}


def synthetic_runs(tmp: Path, model: Path) -> dict:
    """Train jobs on committed synthetic stages (see the module docstring), one run per arm."""
    sys.path.insert(0, str(REPO))  # bench.support: the test and benchmark support package of this checkout
    try:
        from bench.support.synthetic import commit_rollouts, synthetic_rollout_rows
    except ImportError:  # a checkout from before the test support left the library
        from mugrpo.trainer.synthetic import commit_rollouts, synthetic_rollout_rows
    from mugrpo.storage.layout import RunLayout
    from mugrpo.storage.store import Store

    results = {}
    for name, (loss, train, sections) in SYN_ARMS.items():
        print(f"[behavior_hashes] {name} ...", flush=True)
        root = tmp / name
        store = Store(str(root))
        store.upload_dir(model, RunLayout(RUN).policy_dir(0), meta={"stage": 0})
        for k in range(SYN_STAGES):
            rows = synthetic_rollout_rows(
                model, run_id=RUN, stage=k, policy_version=k * SYN_UPDATES, num_prompts=5, group_size=4,
                seed=100 + k, zero_variance_prompts=1,
            )  # fmt: skip
            if "agpo" in sections:  # probe statistics of each prompt, as the generation job stores them
                for r in rows:
                    p = int(r["prompt_id"], 16) % 7
                    r.update(is_probe=False, probe_sigma=0.1 * p, probe_vote_entropy=0.2 * p, probe_skew=0.0)
            commit_rollouts(store, RUN, k, rows)
            spec = {
                "root": str(root),
                "run_id": RUN,
                "seed": 5,
                "stage": k,
                "policy_version": k * SYN_UPDATES,
                "total_updates": SYN_STAGES * SYN_UPDATES,
                "train": {
                    "updates_per_stage": SYN_UPDATES,
                    "rollouts_per_update": 4,
                    "micro_batch_size": 2,
                    "checkpoint_every": 2,
                    "lr": 1e-3,
                    "skip_zero_variance_groups": False,
                    **train,
                },
                "loss": loss,
                **sections,
            }
            path = tmp / f"{name}-{k}.spec.json"
            path.write_text(json.dumps(spec))
            _job("train", str(path), tmp / "jobs.log")
        results[name] = fingerprint(root / RUN, SYN_STAGES)
        shutil.rmtree(root, ignore_errors=True)
    return results


def quick_run(tmp: Path) -> dict:
    """configs/gsm8k-smollm2-quick.yaml through `mugrpo run` (the Prefect flow), in a temporary run root."""
    root = tmp / "quick"
    mugrpo = Path(sys.executable).with_name("mugrpo")
    cmd = [str(mugrpo), "run", "configs/gsm8k-smollm2-quick.yaml", f"run.root={root}"]
    with open(tmp / "quick.log", "ab") as out:
        rc = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=out).returncode
    if rc != 0:
        raise SystemExit(f"quick run failed (exit {rc}); see {tmp / 'quick.log'}")
    run_dir = root / "gsm8k-smollm2-quick"
    result = fingerprint(run_dir, 2)
    shutil.rmtree(root, ignore_errors=True)
    return result


def _flat(d: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        out.update(_flat(v, key) if isinstance(v, dict) else {key: v})
    return out


def compare(a_path: str, b_path: str) -> int:
    """Print every fingerprint that differs (file hashes of timestamped tables excepted); exit 1 if any does."""
    a, b = _flat(json.loads(Path(a_path).read_text())), _flat(json.loads(Path(b_path).read_text()))
    timestamped = (".rollouts.files.", ".train_steps.files.", ".evals.files.", ".replay.files.")
    keys = sorted(k for k in set(a) | set(b) if not any(t in k for t in timestamped))
    differ = [k for k in keys if a.get(k) != b.get(k)]
    for k in differ:
        print(f"DIFFERS {k}: {a.get(k)} != {b.get(k)}")
    print(f"{len(keys) - len(differ)} of {len(keys)} fingerprints equal")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the fingerprints here (JSON); default: print them")
    parser.add_argument(
        "--runs",
        nargs="+",
        choices=("tiny", "synthetic", "quick"),
        default=["tiny", "synthetic"],
        help="which runs (default: tiny synthetic; quick takes ~10 min on 2 cores)",
    )
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two fingerprint files and exit")
    args = parser.parse_args()
    if args.compare:
        raise SystemExit(compare(*args.compare))
    tmp = Path(tempfile.mkdtemp(prefix="mugrpo-hashes-"))
    try:
        results = {}
        if "tiny" in args.runs or "synthetic" in args.runs:
            model = tiny_policy(tmp)
            results.update(tiny_runs(tmp, model) if "tiny" in args.runs else {})
            results.update(synthetic_runs(tmp, model) if "synthetic" in args.runs else {})
        if "quick" in args.runs:
            print("[behavior_hashes] quick ...", flush=True)
            results["quick"] = quick_run(tmp)
    except BaseException:
        print(f"[behavior_hashes] logs kept in {tmp}", file=sys.stderr)
        raise
    text = json.dumps(results, indent=1, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
