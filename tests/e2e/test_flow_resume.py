"""Acceptance for resume: a 2-stage tiny run whose whole flow process tree is SIGKILLed at six points
(during generation, during training, between stages, during the stage manifest write, during stage-1 generation,
during the final evaluation) and re-run each time completes with exact rollout counts, no duplicated
(stage, prompt_id, sample_idx), and final weights bitwise equal to an uninterrupted run's.

Each kill asserts its phase, so every point tests what it claims: which job processes were running
when it fired (read from /proc: ``python -m mugrpo.jobs.KIND .../jobs/stage=K/KIND.spec.json``) and what was
committed after it (job and stage manifests). The two commit-time points pause the flow's own write
(``MUGRPO_FAULT_PAUSE``) so that no job runs then. These six points run the jobs one after another
(``orchestration.overlap_checkpoint: false``); a second test kills inside the checkpoint overlap (the next stage's
generation beside the train job's final checkpoint write) and checks that the overlapped run commits what the
sequential one does.

Runs the real CLI (`mugrpo run`), real Prefect flows on a real local Prefect server, real job subprocesses.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _prefect import (
    deploy_local_flow,
    flow_run_logs,
    prefect_api,
    prefect_server,
    process_worker,
    run_deployment_and_wait,
)
from _tiny import (
    JOB_RE,
    RUN,
    descendants,
    job_cmdline,
    kill_tree,
    run_env,
    start_run,
    tiny_config,
    waiting_at_gate,
    write_config,
)
from safetensors.torch import load_file

pytestmark = pytest.mark.slow


def wait_for(proc: subprocess.Popen, cond, what: str, log: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"run ended (code {proc.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            kill_tree(proc)
            pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.05)


def final_weights(root: Path) -> dict:
    return load_file(str(root / RUN / "policies" / "stage=2" / "model.safetensors"))


def running_jobs(proc: subprocess.Popen) -> set[tuple[str, int]]:
    """(kind, stage) of each job process under the flow process that runs, read from its command line; a job
    pre-started and still waiting at its start gate (a marker of its spec's ``start_after`` missing) does not."""
    jobs = set()
    for pid in descendants(proc.pid):
        cmdline = job_cmdline(pid)
        match = JOB_RE.search(cmdline)
        if match and not waiting_at_gate(cmdline.replace("\0", " ").split()[-1]):
            jobs.add((match.group(1), int(match.group(2))))
    return jobs


def wait_for_kill_point(proc: subprocess.Popen, cond, jobs: set, what: str, log: Path) -> set:
    """Wait until ``cond()`` holds while exactly ``jobs`` run under the flow; returns that snapshot of running jobs
    (the one the kill acts on)."""
    seen: dict[str, set] = {}

    def fired() -> bool:
        if not cond():
            return False
        seen["jobs"] = running_jobs(proc)
        return seen["jobs"] == jobs

    wait_for(proc, fired, what, log)
    return seen["jobs"]


def committed(run: Path) -> set[str]:
    """What the store has committed: ``stage=K`` for stage manifests, ``KIND@K`` for job manifests."""
    stages = {p.stem for p in (run / "stages").glob("stage=*.json")}
    jobs = {
        f"{p.name.split('.')[0]}@{p.parent.name.split('=')[1]}" for p in (run / "jobs").glob("stage=*/*.manifest.json")
    }
    return stages | jobs


def rollout_keys(root: Path) -> Counter:
    keys: Counter = Counter()
    for f in sorted((root / RUN / "rollouts").rglob("shard=*.parquet")):
        t = pq.read_table(f, columns=["prompt_id", "sample_idx"])
        stage = int(f.parent.name.split("=")[1])
        keys.update((stage, p, s) for p, s in zip(t["prompt_id"].to_pylist(), t["sample_idx"].to_pylist(), strict=True))
    return keys


#: The jobs strictly one after another (no checkpoint overlap, no job pre-started): the six points below are that
#: schedule's moments; the overlap's own are in test_sigkill_inside_the_checkpoint_overlap_then_resume_matches_the_
#: sequential_run, and a pre-started job's (killed while it waits at its gate) in tests/chaos.
SEQUENTIAL = {"retries": 0, "overlap_checkpoint": False, "prestart_jobs": False}


@pytest.fixture(scope="module")
def sequential_run(tmp_path_factory, tiny_model_dir, prefect_api) -> Path:  # noqa: F811
    """The uninterrupted run with its jobs one after another (once per module): the reference of both kill tests
    (a run's files do not depend on its root). Returns its root."""
    tmp = tmp_path_factory.mktemp("sequential")
    root, log = tmp / "sequential", tmp / "sequential.log"
    cfg = write_config(tmp / "sequential.yaml", tiny_config(root, tiny_model_dir, orchestration=SEQUENTIAL))
    proc = start_run(cfg, run_env(prefect_api, MUGRPO_RUN_SLOT="off"), log)
    assert proc.wait(timeout=1800) == 0, log.read_text()[-4000:]
    return root


def test_sigkill_at_six_points_then_resume_matches_uninterrupted(tmp_path, tiny_model_dir, prefect_api, sequential_run):
    # A killed flow's run slot (flows/exclusive.py) frees only after its >= 60 s lease: off here, where a run is
    # killed and resumed six times (test_run_exclusive.py tests the slot, this test the resumed files).
    env = run_env(prefect_api, MUGRPO_RUN_SLOT="off")
    reference = final_weights(sequential_run)

    root = tmp_path / "killed"
    cfg = write_config(tmp_path / "killed.yaml", tiny_config(root, tiny_model_dir, orchestration=SEQUENTIAL))
    run = root / RUN
    paused = lambda folder, name: any(p.name.startswith(f".{name}.tmp-") for p in (run / folder).glob(".*"))  # noqa: E731
    # (what, file condition, extra env, the jobs that must be running when it fires, what must be committed after)
    kill_points = [
        (
            "during generation",  # shard 1's write held open: the kill lands before the job commits
            lambda: (run / "rollouts/stage=0/shard=00000.parquet").exists(),
            {"MUGRPO_FAULT_PAUSE": "rollouts/stage=0/shard=00001:60"},
            {("generate", 0)},
            set(),
        ),
        (
            "during training",
            lambda: (run / "checkpoints/stage=0/step=000001/_COMPLETE").exists(),
            {},
            {("train", 0)},
            {"generate@0"},
        ),
        (
            "between stages",  # stage 0 committed, the flow paused writing stage 1's first job spec
            lambda: (run / "stages/stage=0.json").exists() and paused("jobs/stage=1", "generate.spec.json"),
            {"MUGRPO_FAULT_PAUSE": "jobs/stage=1/generate.spec.json:60"},
            set(),
            {"generate@0", "train@0", "stage=0"},
        ),
        (
            "during stage-1 generation",  # shard 1's write held open: the kill lands before the job commits
            lambda: (run / "rollouts/stage=1/shard=00000.parquet").exists(),
            {"MUGRPO_FAULT_PAUSE": "rollouts/stage=1/shard=00001:60"},
            {("generate", 1)},
            {"generate@0", "train@0", "stage=0"},
        ),
        (
            "during the stage manifest write",
            lambda: paused("stages", "stage=1.json"),
            {"MUGRPO_FAULT_PAUSE": "stages/stage=1.json:60"},
            set(),
            {"generate@0", "train@0", "stage=0", "generate@1", "train@1"},
        ),
        (
            "during the final evaluation",  # the eval job process is running, not just its spec written
            lambda: (run / "jobs/stage=2/eval.spec.json").exists(),
            {},
            {("eval", 2)},
            {"generate@0", "train@0", "stage=0", "generate@1", "train@1", "stage=1"},
        ),
    ]
    log = tmp_path / "killed.log"
    for what, cond, extra, jobs, done in kill_points:
        proc = start_run(cfg, {**env, **extra}, log)
        running = wait_for_kill_point(proc, cond, jobs, what, log)
        kill_tree(proc)
        assert running == jobs, f"kill {what}: jobs running {running}, expected {jobs}"
        assert committed(run) == done, f"kill {what}: committed {sorted(committed(run))}, expected {sorted(done)}"
        keys = rollout_keys(root)
        assert set(keys.values()) <= {1}, f"duplicated rollouts after a kill {what}"
    proc = start_run(cfg, env, log)
    assert proc.wait(timeout=1800) == 0, log.read_text()[-4000:]

    keys = rollout_keys(root)
    assert len(keys) == 2 * 4 * 2 and set(keys.values()) == {1}
    steps = sorted(
        u
        for f in (run / "train_steps").rglob("part-*.parquet")
        for u in pq.read_table(f, columns=["update"])["update"].to_pylist()
    )
    assert steps == list(range(1, 7))
    weights = final_weights(root)
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert tensor.equal(weights[name]), f"{name} differs from the uninterrupted run"
    out = subprocess.run(
        [sys.executable, "-m", "mugrpo.cli", "status", str(run)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "complete" in out.stdout, out.stdout + out.stderr


def rollout_rows(root: Path) -> list[tuple]:
    """Every rollout as (stage, prompt_id, sample_idx, response tokens, reward), sorted."""
    rows = []
    for f in sorted((root / RUN / "rollouts").rglob("shard=*.parquet")):
        t = pq.read_table(f, columns=["prompt_id", "sample_idx", "response_token_ids", "reward"]).to_pydict()
        stage = int(f.parent.name.split("=")[1])
        rows += [(stage, *r) for r in zip(*t.values(), strict=True)]
    return sorted(rows, key=lambda r: r[:3])


def stage_timings(root: Path, stage: int) -> dict:
    return json.loads((root / RUN / "stages" / f"stage={stage}.json").read_text())["timings"]


def test_sigkill_inside_the_checkpoint_overlap_then_resume_matches_the_sequential_run(
    tmp_path, tiny_model_dir, prefect_api, sequential_run
):
    """Stage 1's generation starts once stage 0's train job has committed the policy of stage 1,
    beside that job's final checkpoint write (mugrpo.execution.pipeline). The overlapped run commits the same rollouts
    and final weights as the jobs run one after another, its stage timings say what was overlapped, and a SIGKILL at
    each moment of the overlap resumes to the same files. The checkpoint write is held open
    (``MUGRPO_FAULT_PAUSE`` on stage 0's final checkpoint) so that each moment is reached for sure."""
    env = run_env(prefect_api, MUGRPO_RUN_SLOT="off")
    runs = {"sequential": sequential_run, "overlapped": tmp_path / "overlapped"}
    cfg = write_config(
        tmp_path / "overlapped.yaml", tiny_config(runs["overlapped"], tiny_model_dir, orchestration={"retries": 0})
    )
    log = tmp_path / "overlapped.log"
    proc = start_run(cfg, env, log)
    assert proc.wait(timeout=1800) == 0, log.read_text()[-4000:]
    reference, ref_rows = final_weights(runs["sequential"]), rollout_rows(runs["sequential"])
    assert len(ref_rows) == 2 * 4 * 2
    assert stage_timings(runs["sequential"], 0)["t_next_gen"] == 0.0
    # the overlapped run: stage 0's schedule ran stage 1's generation (inside its t_total), part of it beside the
    # checkpoint; stage 1 kept that job's own wall time as its t_gen
    t0, t1 = stage_timings(runs["overlapped"], 0), stage_timings(runs["overlapped"], 1)
    assert 0.0 < t0["t_next_gen"] < t0["t_total"] and 0.0 <= t0["t_overlap"] <= t0["t_next_gen"], t0
    assert t1["t_gen"] > 0.0 and t1["t_next_gen"] == 0.0, t1
    assert rollout_rows(runs["overlapped"]) == ref_rows
    weights = final_weights(runs["overlapped"])
    assert all(t.equal(weights[k]) for k, t in reference.items()), "overlapped run's weights differ"

    root = tmp_path / "killed"
    cfg = write_config(tmp_path / "killed.yaml", tiny_config(root, tiny_model_dir, orchestration={"retries": 0}))
    run = root / RUN
    held = {"MUGRPO_FAULT_PAUSE": "checkpoints/stage=0/step=000003/:120"}  # stage 0's final checkpoint, held open
    policy_1 = lambda: (run / "policies/stage=1/_COMPLETE").exists()  # noqa: E731
    ckpt_open = lambda: not (run / "checkpoints/stage=0/step=000003/_COMPLETE").exists()  # noqa: E731
    # stage 1's second shard, held open too where the kill must land while stage 1's generation still runs: a shard
    # of the tiny policy takes milliseconds, less than the test's look at the running jobs
    shard_1 = {"MUGRPO_FAULT_PAUSE": f"{held['MUGRPO_FAULT_PAUSE']};rollouts/stage=1/shard=00001:120"}
    # (what, condition, the jobs running when it fires, kill the whole tree (else the train job only), committed,
    # what is held open)
    kill_points = [
        (
            "as stage 1's generation starts beside the checkpoint",
            lambda: policy_1() and ckpt_open() and not (run / "rollouts/stage=1").exists(),
            {("train", 0), ("generate", 1)},
            True,
            {"generate@0"},
            held,
        ),
        (
            "after stage 1's first shard, the checkpoint still open",
            lambda: ckpt_open() and (run / "rollouts/stage=1/shard=00000.parquet").exists(),
            {("train", 0), ("generate", 1)},
            True,
            {"generate@0"},
            shard_1,
        ),
        (
            "the train job alone, stage 1's generation committed, the checkpoint still open",
            lambda: ckpt_open() and (run / "jobs/stage=1/generate.manifest.json").exists(),
            {("train", 0)},
            False,
            {"generate@0", "generate@1"},
            held,
        ),
    ]
    log = tmp_path / "killed.log"
    for what, cond, jobs, tree, done, hold in kill_points:
        proc = start_run(cfg, {**env, **hold}, log)
        running = wait_for_kill_point(proc, cond, jobs, what, log)
        if tree:
            kill_tree(proc)
        else:  # the flow sees its train task fail, lets the generation it runs finish, then fails the run
            train = [  # stage 0's train job (stage 1's, pre-started, waits at its gate beside it)
                pid
                for pid in descendants(proc.pid)
                if (match := JOB_RE.search(job_cmdline(pid))) and match.group(1, 2, 3) == ("train", "0", "train")
            ]
            os.kill(train[0], signal.SIGKILL)
            assert proc.wait(timeout=600) != 0, log.read_text()[-4000:]
            kill_tree(proc)  # what the failed flow left (verifier workers)
        assert running == jobs, f"kill {what}: jobs running {running}, expected {jobs}"
        assert policy_1(), f"kill {what}: the policy of stage 1 is not committed"
        assert committed(run) == done, f"kill {what}: committed {sorted(committed(run))}, expected {sorted(done)}"
        assert set(rollout_keys(root).values()) <= {1}, f"duplicated rollouts after a kill {what}"
    proc = start_run(cfg, env, log)
    assert proc.wait(timeout=1800) == 0, log.read_text()[-4000:]

    assert rollout_rows(root) == ref_rows
    steps = sorted(
        u
        for f in (run / "train_steps").rglob("part-*.parquet")
        for u in pq.read_table(f, columns=["update"])["update"].to_pylist()
    )
    assert steps == list(range(1, 7))
    weights = final_weights(root)
    for name, tensor in reference.items():
        assert tensor.equal(weights[name]), f"{name} differs from the sequential run"
    out = subprocess.run(
        [sys.executable, "-m", "mugrpo.cli", "verify", str(run)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_run_flow_as_a_deployment_on_a_process_work_pool(tmp_path, tiny_model_dir, process_worker):
    """The real run flow, deployed to a `process` work pool and executed by a real worker (a Kubernetes pool runs
    the same deployment with infra/prefect.yaml; no cluster exists here)."""
    from mugrpo.config import config_from_dict

    config = config_from_dict(tiny_config(tmp_path / "root", tiny_model_dir, run={"num_stages": 1})).to_json_dict()
    deployment_id = deploy_local_flow("flows/run.py:run_flow", name="tiny-e2e", pool=process_worker.pool)
    flow_run = run_deployment_and_wait(deployment_id, parameters={"config": config}, timeout_s=900)
    assert flow_run.state.is_completed(), f"{flow_run.state}\n{process_worker.log_tail()}"
    run = tmp_path / "root" / RUN
    assert (run / "stages/stage=0.json").exists() and (run / "policies/stage=1/_COMPLETE").exists()
    assert (run / "evals/stage=1/gsm8k.parquet").exists()
    report = (run / "report.html").read_text()
    # the seven plots of every report and the health panel's (drawn when train_steps carries it: this run does)
    assert report.count("<svg") == 8 and "Per-stage summary" in report and "Health vs updates" in report
    worker_output = process_worker.log_tail(2000)  # the flow-run subprocess logs to the worker's output
    assert "[generate]" in worker_output and "[train]" in worker_output
