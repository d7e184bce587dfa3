"""Acceptance: warm execution is the cold algorithm run in one process.

- The same 3-stage config (mu = 4 updates per stage) run cold (generate, train and eval jobs as separate
  processes, stage after stage, as the stage flow launches them) and warm (one segment job) gives bitwise the same
  rollouts (token ids, behavior log-probs), train_steps, evals and final weights on CPU. The warm run publishes a
  policy every 2 stages only, so stage 2's behavior policy is stage 1's final checkpoint.
- A warm segment SIGKILLed in the middle of a stage's updates and re-run continues from the last committed stage and
  checkpoint: every (stage, prompt_id, sample_idx) exactly once, updates 1..4 of every stage exactly once, final
  weights bitwise those of the uninterrupted warm run.

Tiny random policy with the real SmolLM2 tokenizer, real GSM8K rows, real job subprocesses and files. Slow (about
a dozen job processes): `make test` runs it, `-m "not slow"` skips it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from _tiny import start_job, tiny_config
from safetensors.torch import load_file

from mugrpo.commits.manifest import checkpoint_steps, read_manifest
from mugrpo.config import config_from_dict
from mugrpo.execution.warm import PROGRESS_TAG, SegmentSpec
from mugrpo.orchestration.job_specs import write_job_specs
from mugrpo.orchestration.runs import attach_run, commit_stage, init_run, open_store
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import StageTimings

RUN = "warm"
STAGES, UPDATES = 3, 4

pytestmark = pytest.mark.slow


def warm_config(root: Path, model_dir: Path, **orchestration) -> dict:
    return tiny_config(
        root,
        model_dir,
        run_id=RUN,
        run={"seed": 3, "num_stages": STAGES},
        loss={"name": "grpo"},
        train={"updates_per_stage": UPDATES, "checkpoint_every": 2},
        eval={"every_stage": True},
        orchestration=orchestration,
    )


def _ok(proc: subprocess.Popen, log: Path) -> None:
    assert proc.wait(timeout=900) == 0, log.read_text()[-4000:]


def run_cold(root: Path, model_dir: Path, log: Path):
    """What the stage flow does in cold execution: three job processes per stage, then the stage commit."""
    cfg = config_from_dict(warm_config(root, model_dir))
    init_run(cfg)
    run = attach_run(cfg)
    for k in range(STAGES):
        urls = write_job_specs(run, k)
        for job in ("generate", "train", "eval"):
            _ok(start_job(job, urls[job], log), log)
        commit_stage(run, k, StageTimings())
    return cfg


def segment_spec(root: Path, model_dir: Path, tmp: Path) -> tuple:
    cfg = config_from_dict(
        warm_config(root, model_dir, execution="warm", segment_stages=STAGES, publish_policy_every=2)
    )
    init_run(cfg)
    path = tmp / f"segment-{root.name}.json"
    path.write_text(SegmentSpec.from_config(cfg, 0, STAGES).model_dump_json())
    return cfg, str(path)


def run_scheduled(root: Path, model_dir: Path, log: Path):
    """Cold execution as the stage flow schedules it (mugrpo.execution.pipeline.run_stage): every job after the first
    pre-started while the job before it runs and forked from the job fork server (orchestration.prestart_jobs,
    orchestration.fork_jobs: the defaults), the next generation beside each checkpoint."""
    from bench.warm_vs_cold import run_cold as run_stages

    cfg = config_from_dict(warm_config(root, model_dir))
    assert cfg.orchestration.prestart_jobs and cfg.orchestration.fork_jobs
    run_stages(cfg, log)
    return cfg


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> dict:
    """A cold run (one new interpreter per job, one job after another), a cold run with pre-started forked jobs,
    and an uninterrupted warm run of the same config (each made once for the module)."""
    tmp = tmp_path_factory.mktemp("warm-vs-cold")
    cold = run_cold(tmp / "cold", tiny_model_dir, tmp / "cold.log")
    scheduled = run_scheduled(tmp / "scheduled", tiny_model_dir, tmp / "scheduled.log")
    warm, spec = segment_spec(tmp / "warm", tiny_model_dir, tmp)
    _ok(start_job("segment", spec, tmp / "warm.log"), tmp / "warm.log")
    return {
        "cold": cold,
        "scheduled": scheduled,
        "scheduled_log": (tmp / "scheduled.log").read_text(),
        "warm": warm,
        "tmp": tmp,
        "warm_log": (tmp / "warm.log").read_text(),
    }


def _rollouts(cfg, stage: int):
    path = open_store(cfg).local_path(RunLayout(RUN).rollouts_dir(stage))
    return pq.read_table(path).sort_by([("prompt_id", "ascending"), ("sample_idx", "ascending")])


def _final_weights(cfg) -> dict[str, torch.Tensor]:
    return load_file(str(open_store(cfg).local_path(RunLayout(RUN).policy_dir(STAGES)) / "model.safetensors"))


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    unequal = [name for name in a if not torch.equal(a[name], b[name])]
    assert not unequal, f"weights differ: {unequal}"


def test_warm_and_cold_give_the_same_rollouts_and_weights(runs):
    cold, warm = runs["cold"], runs["warm"]
    for k in range(STAGES):
        a, b = _rollouts(cold, k), _rollouts(warm, k)
        assert a.num_rows == b.num_rows == 4 * 2
        for column in ("prompt_id", "sample_idx", "response_token_ids", "behavior_logprobs", "reward", "advantage"):
            assert a.column(column).to_pylist() == b.column(column).to_pylist(), (k, column)
        steps = [
            pq.read_table(open_store(c).local_path(RunLayout(RUN).train_steps_dir(k))).sort_by("stage_update")
            for c in (cold, warm)
        ]
        for column in ("stage_update", "loss", "grad_norm", "lr", "ratio_mean"):
            assert steps[0].column(column).to_pylist() == steps[1].column(column).to_pylist(), (k, column)
        evals = [pq.read_table(open_store(c).local_path(RunLayout(RUN).evals_dir(k))) for c in (cold, warm)]
        assert evals[0].column("response_text").to_pylist() == evals[1].column("response_text").to_pylist()
    _assert_same_weights(_final_weights(cold), _final_weights(warm))
    # ... and the warm run did keep its state in memory: one policy load, moments and weights never re-read
    log = runs["warm_log"]
    assert log.count("AdamW moments carried over in memory") == STAGES - 1
    assert "carried over from" not in log
    assert log.count("weights synced into the transformers engine") == STAGES


def test_prestarted_forked_jobs_give_the_same_rollouts_and_weights(runs):
    """One algorithm, one code path: jobs launched ahead of their inputs and forked from the job fork server
    commit what jobs started one after another as new interpreters commit, bitwise."""
    cold, scheduled = runs["cold"], runs["scheduled"]
    for k in range(STAGES):
        a, b = _rollouts(cold, k), _rollouts(scheduled, k)
        for column in ("prompt_id", "sample_idx", "response_token_ids", "behavior_logprobs", "reward", "advantage"):
            assert a.column(column).to_pylist() == b.column(column).to_pylist(), (k, column)
        evals = [pq.read_table(open_store(c).local_path(RunLayout(RUN).evals_dir(k))) for c in (cold, scheduled)]
        assert evals[0].column("response_text").to_pylist() == evals[1].column("response_text").to_pylist()
    _assert_same_weights(_final_weights(cold), _final_weights(scheduled))
    log = runs["scheduled_log"]
    # every train job and every generation after the first was pre-started, and followed
    assert log.count("following the train job pre-started") == STAGES
    assert log.count("following the generate job pre-started") == STAGES - 1
    assert "waiting for" in log and "inputs committed: starting after" in log


def test_warm_commits_the_cold_layout_and_publishes_every_n(runs):
    warm, cold = open_store(runs["warm"]), open_store(runs["cold"])
    layout = RunLayout(RUN)
    for k in range(STAGES):
        manifest, reference = read_manifest(warm, RUN, k), read_manifest(cold, RUN, k)
        assert manifest is not None and manifest.timings.t_total > 0 and manifest.timings.t_sync >= 0
        assert manifest.counts["train/updates"] == UPDATES
        paths = [{f.path for f in m.files if not f.path.startswith("policies/")} for m in (reference, manifest)]
        assert paths[0] == paths[1] and any(p.startswith("rollouts/") for p in paths[1])
    # publish_policy_every=2: policies/stage=1 (stage 0's trained policy) is not published; stage 1 sampled from
    # stage 0's final checkpoint. Once later stages committed, checkpoints no stage needs any more were pruned.
    assert [warm.is_complete_dir(layout.policy_dir(k)) for k in range(STAGES + 1)] == [True, False, True, True]
    assert all(cold.is_complete_dir(layout.policy_dir(k)) for k in range(STAGES + 1))
    for job in ("generate", "train", "eval"):
        spec = json.loads(warm.read_bytes(layout.job_spec(1, job)))
        assert spec["policy_dir"] == layout.checkpoint_dir(0, UPDATES), job
    assert [checkpoint_steps(warm, layout, k) for k in range(STAGES)] == [[], [], [UPDATES]]
    assert [checkpoint_steps(cold, layout, k) for k in range(STAGES)] == [[UPDATES]] * STAGES
    progress = [line for line in runs["warm_log"].splitlines() if line.startswith(PROGRESS_TAG)]
    assert len(progress) == STAGES


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out] + [d for p in out for d in _descendants(int(p))]


def test_sigkill_mid_segment_then_resume(runs, tiny_model_dir):
    tmp = runs["tmp"]
    root = tmp / "killed"
    cfg, spec = segment_spec(root, tiny_model_dir, tmp)
    store, layout = Store(str(root)), RunLayout(RUN)
    log = tmp / "killed.log"
    proc = start_job("segment", spec, log)
    deadline = time.monotonic() + 600
    while not store.is_complete_dir(layout.checkpoint_dir(1, 2)):  # stage 1, after its 2nd of 4 updates
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, "no checkpoint within 600 s"
        time.sleep(0.02)
    victims = _descendants(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    for pid in victims:  # the verifier pool's workers die with the job in a real pod; here kill them by pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert read_manifest(store, RUN, 1) is None and read_manifest(store, RUN, 0) is not None

    _ok(start_job("segment", spec, log), log)
    assert "1 already committed, 2 to run" in log.read_text()

    for k in range(STAGES):
        keys = Counter((r["prompt_id"], r["sample_idx"]) for r in _rollouts(cfg, k).to_pylist())
        assert len(keys) == 8 and set(keys.values()) == {1}, k
        steps = pq.read_table(store.local_path(layout.train_steps_dir(k))).sort_by("stage_update")
        assert steps.column("stage_update").to_pylist() == list(range(1, UPDATES + 1)), k
        a, b = _rollouts(cfg, k), _rollouts(runs["warm"], k)
        assert a.column("response_token_ids").to_pylist() == b.column("response_token_ids").to_pylist(), k
    _assert_same_weights(_final_weights(cfg), _final_weights(runs["warm"]))
