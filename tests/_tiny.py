"""Tiny runs for tests: the one place that builds a tiny run's config and job specs and launches its jobs and flows.

The tiny policy is the session fixture ``tiny_model_dir`` (tests/conftest.py: a 2-layer random Llama with the real
SmolLM2 tokenizer). Everything else a test needs to run it lives here:

- paths: :data:`REPO_ROOT` (this checkout) and :data:`DATA_DIR` (the shared datasets beside it);
- configs: :func:`tiny_config` (a whole run config, sections overridden per test), :func:`write_config`;
- job specs: :func:`train_spec` (a :class:`TrainSpec` on :data:`TINY_TRAIN`), :func:`generate_spec`,
  :func:`write_spec`, :func:`with_policy` (a store holding the initial policy), :func:`policy_weights`;
- launches: :func:`job_env` / :func:`start_job` (``python -m mugrpo.jobs.KIND SPEC``), :func:`run_env` /
  :func:`start_run` / :func:`run_cli` (the real ``mugrpo`` CLI, its flows on the test Prefect server), and
  :func:`descendants` / :func:`kill_tree` (SIGKILL a flow with every job under it, as a preempted pod dies).

Overrides merge into the defaults key by key (:func:`merged`); a value of :data:`DEFAULT` removes the key, so the
product's own default applies (``train={"lr": DEFAULT}``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

#: This checkout (the repository root).
REPO_ROOT = Path(__file__).resolve().parents[1]
#: The shared datasets (GSM8K, MATH-500, AIME24, AMC23): ``shared/data`` beside the checkout.
DATA_DIR = REPO_ROOT.parent / "shared" / "data"
#: The run id of :func:`tiny_config` unless a test names another.
RUN = "tiny"


class _Default:
    """Marks a key to drop from a merged dict (the product's default applies)."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in: nested dicts key by key, other values replaced, :data:`DEFAULT` removed.

    A copy: neither argument is modified."""
    out = {k: (merged(v, {}) if isinstance(v, Mapping) else v) for k, v in base.items()}
    for key, value in over.items():
        if value is DEFAULT:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = merged(value, {}) if isinstance(value, Mapping) else value
    return out


def gsm8k_train(limit: int | None = 40) -> dict[str, Any]:
    """The ``data.train`` section on GSM8K's train split (the first ``limit`` rows; None = all)."""
    section = {"name": "gsm8k", "path": str(DATA_DIR / "gsm8k/train.jsonl"), "answer_kind": "gsm8k"}
    return section if limit is None else {**section, "limit": limit}


def gsm8k_eval(num_prompts: int = 2, max_new_tokens: int = 4) -> dict[str, Any]:
    """One ``eval.benchmarks`` entry: ``num_prompts`` GSM8K test problems, ``max_new_tokens`` per response."""
    dataset = {"name": "gsm8k", "path": str(DATA_DIR / "gsm8k/test.jsonl"), "answer_kind": "gsm8k"}
    return {"dataset": dataset, "num_prompts": num_prompts, "max_new_tokens": max_new_tokens}


def tiny_config(root: Path | str, model_dir: Path, *, run_id: str = RUN, **sections: Any) -> dict[str, Any]:
    """A whole run config (the dict a YAML file holds) of a tiny run: ``num_stages`` 2 of 4 GSM8K prompts x 2
    responses of at most 6 tokens, 3 updates of 4 rollouts (micro-batches of 2) per stage with a checkpoint after
    each, a final evaluation on 2 GSM8K test problems, no retries; stored under ``root/run_id``.

    ``sections`` (``run=``, ``generation=``, ``train=``, ...) merge into these defaults (:func:`merged`).
    A few seconds per stage on a 2-core CPU with ``model_dir`` the tiny policy."""
    base = {
        "run": {"id": run_id, "root": str(root), "seed": 5, "num_stages": 2},
        "model": {"source": str(model_dir), "max_context": 512},
        "data": {"train": gsm8k_train()},
        "generation": {
            "prompts_per_stage": 4,
            "shard_size": 2,
            "sampling": {"temperature": 1.0, "max_new_tokens": 6, "n": 2},
        },
        "reward": {"components": {"math_correctness": 1.0, "format": 0.5}, "num_workers": 1},
        "train": {
            "updates_per_stage": 3,
            "rollouts_per_update": 4,
            "micro_batch_size": 2,
            "checkpoint_every": 1,
            "skip_zero_variance_groups": False,
            "lr": 1e-3,
        },
        "eval": {"every_stage": False, "benchmarks": [gsm8k_eval()]},
        "orchestration": {"retries": 0},
    }
    return merged(base, sections)


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    """Write ``config`` as YAML to ``path`` (what ``mugrpo run PATH`` reads); returns ``path``."""
    path.write_text(yaml.safe_dump(dict(config)))
    return path


#: The ``train`` section of :func:`train_spec`: 4 updates of 8 rollouts in micro-batches of 4, a checkpoint every 2.
TINY_TRAIN: dict[str, Any] = {
    "updates_per_stage": 4,
    "rollouts_per_update": 8,
    "micro_batch_size": 4,
    "checkpoint_every": 2,
    "lr": 1e-3,
}

#: AGPO's loss section as its paper runs it (arXiv 2605.20722): sequence-mean token-mean, k1 reference KL 0.03.
AGPO_LOSS: dict[str, Any] = {
    "name": "agpo",
    "agg_mode": "seq-mean-token-mean",
    "kl_coef": 0.03,
    "kl_estimator": "k1",
    "kl_agg_mode": "token-mean",
}


def train_spec(root: Path | str, run_id: str, *, train: Mapping[str, Any] | None = None, **fields: Any):
    """The :class:`~mugrpo.trainer.spec.TrainSpec` of stage 0 (policy version 0) of run ``run_id`` under ``root``,
    training on :data:`TINY_TRAIN` with ``train`` merged in (:func:`merged`); ``fields`` set or override any other
    spec field (``stage=``, ``policy_version=``, ``loss=``, ``replay=``, ...)."""
    from mugrpo.trainer.spec import TrainSpec

    spec = {"root": str(root), "run_id": run_id, "stage": 0, "policy_version": 0, **fields}
    return TrainSpec(**spec, train=merged(TINY_TRAIN, train or {}))


def write_spec(spec, path: Path) -> Path:
    """Write a job spec (any pydantic job spec) as JSON to ``path`` (what ``python -m mugrpo.jobs.KIND PATH``
    reads); returns ``path``."""
    path.write_text(spec.model_dump_json())
    return path


def policy_weights(store, rel: str) -> dict:
    """The tensors of ``model.safetensors`` in the HF dir at store path ``rel`` (a policy or a checkpoint)."""
    from safetensors.torch import load_file

    return load_file(str(store.local_path(rel) / "model.safetensors"))


def generate_spec(root: Path | str, run_id: str, **fields: Any):
    """The :class:`~mugrpo.generation.GenerateSpec` of stage 0 of run ``run_id`` under ``root``: 6 prompts of
    GSM8K's train split (the first 50 rows, seed 3) in shards of 2, 3 responses of at most 6 tokens at temperature 1,
    sampled from ``policies/stage=0``; ``fields`` override any field (a dict value replaces, it does not merge)."""
    from mugrpo.data.datasets import DatasetConfig
    from mugrpo.generation import GenerateSpec
    from mugrpo.rewards import RewardConfig
    from mugrpo.storage.layout import RunLayout

    spec = dict(
        root=str(root),
        run_id=run_id,
        stage=0,
        seed=3,
        policy_dir=RunLayout(run_id).policy_dir(0),
        dataset=DatasetConfig(**gsm8k_train(limit=50)),
        num_prompts=6,
        shard_size=2,
        sampling={"temperature": 1.0, "max_new_tokens": 6, "n": 3},
        reward=RewardConfig(components={"math_correctness": 1.0, "format": 0.5}, num_workers=1),
    )
    return GenerateSpec(**{**spec, **fields})


def with_policy(root: Path | str, model_dir: Path, run_id: str):
    """A local store at ``root`` holding ``model_dir`` as run ``run_id``'s initial policy (``policies/stage=0``),
    as ``init_run`` leaves it; returns the :class:`~mugrpo.storage.store.Store`."""
    from mugrpo.storage.layout import RunLayout
    from mugrpo.storage.store import Store

    store = Store(str(root))
    store.upload_dir(model_dir, RunLayout(run_id).policy_dir(0))
    return store


# --- launches -----------------------------------------------------------------------------------------------------


def job_env(**extra: str) -> dict[str, str]:
    """The environment of a job process a test starts: this one's, one torch thread (two jobs may run side by
    side on 2 cores), this checkout on PYTHONPATH; ``extra`` added."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT), **extra}


def start_job(
    kind: str,
    spec: Path | str,
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
):
    """Start ``python -m mugrpo.jobs.KIND SPEC`` (as a launcher does) in this checkout; its output (stdout and
    stderr) is appended to ``log``, or readable as text from ``proc.stdout`` when ``log`` is None.

    ``env`` defaults to :func:`job_env`; ``python`` (default: this interpreter) is the job's interpreter, e.g. the
    vLLM virtualenv's. Returns the :class:`subprocess.Popen`."""
    if log is None:
        out: Any = subprocess.PIPE
    else:
        out = open(log, "ab")  # noqa: SIM115  (the child holds it; closed when this process drops it)
    return subprocess.Popen(
        [python or sys.executable, "-m", f"mugrpo.jobs.{kind}", str(spec)],
        cwd=REPO_ROOT,
        env=dict(job_env() if env is None else env),
        stdout=out,
        stderr=subprocess.STDOUT,
        text=log is None,
    )


def run_env(api_url: str, **extra: str) -> dict[str, str]:
    """The environment of a ``mugrpo`` CLI process on the test Prefect server ``api_url`` (the ``prefect_api``
    fixture), with unbuffered output; ``extra`` added."""
    return {**os.environ, "PREFECT_API_URL": api_url, "PYTHONUNBUFFERED": "1", **extra}


def start_run(config_path: Path, env: Mapping[str, str], log: Path) -> subprocess.Popen:
    """Start ``mugrpo run CONFIG`` (the real CLI, its flows and jobs) with its output appended to ``log``."""
    return subprocess.Popen(
        [sys.executable, "-m", "mugrpo.cli", "run", str(config_path)],
        cwd=REPO_ROOT,
        env=dict(env),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def run_cli(args: list[str], env: Mapping[str, str], log: Path | None = None, timeout: float = 1200):
    """Run ``mugrpo ARGS`` to its end (captured as text); with ``log``, append the command, its exit code and its
    output there. Returns the :class:`subprocess.CompletedProcess`."""
    out = subprocess.run(
        [sys.executable, "-m", "mugrpo.cli", *args],
        cwd=REPO_ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if log is not None:
        with log.open("a") as f:
            f.write(f"$ mugrpo {' '.join(args)} -> {out.returncode}\n{out.stdout}\n{out.stderr}\n")
    return out


def descendants(pid: int) -> list[int]:
    """Every descendant pid of ``pid`` (read from /proc; jobs run in sessions of their own), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process under it (what a preempted pod leaves: nothing), then reap ``proc``."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)


#: A job process's command line: (job module, stage, spec name) of ``python -m mugrpo.jobs.JOB ROOT/RUN/jobs/
#: stage=K/NAME.spec.json`` (a forked job's title reads the same).
JOB_RE = re.compile(r"mugrpo\.jobs\.(\w+)[\x00 ].*stage=(\d+)/(\w+)\.spec\.json")


def job_cmdline(pid: int) -> str:
    """The command line of ``pid`` as /proc shows it (NUL-separated; a forked job's is its title), "" once it exited."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def waiting_at_gate(spec_path: str) -> bool:
    """Whether the job of this spec waits at its start gate (mugrpo.coordination.start_gate): a start marker is
    missing."""
    try:
        spec = json.loads(Path(spec_path).read_text())
    except (OSError, ValueError):
        return False
    return any(not (Path(spec["root"]) / m).exists() for m in spec.get("start_after", []))
