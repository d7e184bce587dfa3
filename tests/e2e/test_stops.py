"""Stops that stop: Ctrl-C (SIGINT) or SIGTERM, to the CLI's process group (a terminal's foreground
group, ``timeout``, ``docker stop``) or to its pid (Kubernetes), ends ``mugrpo run`` within
``orchestration.stop_grace_s`` with exit code 130 / 143, leaves no process behind (jobs, fork server, verifier
pools, the temporary Prefect server), releases the run lease and prints the resume command; ``mugrpo resume`` then
gives the rollouts and final weights of an uninterrupted run (bitwise, on CPU).

A stop reads as a stop: no "Crash detected" line of Prefect's in the output, and on the test server the
run's flow run ends ``Cancelled`` (not ``Crashed``) with the signal and the resume command in its message, its stage
flow runs ``Cancelled`` or ``Completed``. The jobs get their share of the grace: a train job held inside a checkpoint
write (it cannot exit early) is SIGKILLed only ``job_grace_s(stop_grace_s)`` after its SIGTERM, even for a SIGTERM
that Prefect's flow engine took (and re-sent, which once read as a second signal).

Moments: the temporary Prefect server's start, generation, training, inside a checkpoint write (the train job paused
between the temporary file and the rename of a checkpoint marker, ``MUGRPO_FAULT_PAUSE``), a pre-started job
waiting at its start gate, the final evaluation. The signal and its target rotate over the moments (each of SIGINT /
SIGTERM x group / pid at least once) instead of the full cross product; the two earliest moments run on the CLI's
own temporary Prefect server (the one a signal to the group used to kill under the flow), the rest on the test
server. One uninterrupted reference run per module. Real CLI, flows, jobs, files.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _tiny import (
    JOB_RE,
    REPO_ROOT,
    RUN,
    descendants,
    job_cmdline,
    kill_tree,
    run_cli,
    run_env,
    tiny_config,
    waiting_at_gate,
    write_config,
)
from safetensors.torch import load_file

from bench.support.chaos.procs import wait_gone
from mugrpo.cli.lifecycle import RESTART_HINT, RESUME_HINT
from mugrpo.common.preemption import job_grace_s

pytestmark = pytest.mark.slow

GRACE_S = 25.0  # orchestration.stop_grace_s's default
#: Slack of this test's own polling and of the interpreter's exit beyond the grace.
SLACK_S = 3.0
CKPT_PAUSE = "checkpoints/stage=0/step=000002/_COMPLETE"
UPDATE_PAUSE = "train/stage=1/update=2"  # the train job's pause point: update 2 of stage 1 composed


def _config(root: Path, model_dir: Path) -> dict:
    return tiny_config(root, model_dir, orchestration={"retries": 0})


def jobs(pid: int) -> tuple[set, set]:
    """(running, waiting) jobs under ``pid`` as (kind, stage), from their command lines."""
    running, waiting = set(), set()
    for p in descendants(pid):
        cmd = job_cmdline(p)
        match = JOB_RE.search(cmd)
        if match:
            key = (match.group(1), int(match.group(2)))
            (waiting if waiting_at_gate(cmd.replace("\0", " ").split()[-1]) else running).add(key)
    return running, waiting


def _paused(folder: Path, name: str) -> bool:
    return folder.is_dir() and any(p.name.startswith(f".{name}.tmp-") for p in folder.glob(".*"))


# (moment, signal, target, own temporary Prefect server, extra env, condition(run folder, log, cli pid))
MOMENTS = [
    (
        "prefect-server-start",
        signal.SIGINT,
        "group",
        True,
        {},
        lambda run, log, pid: "starting the temporary Prefect server" in log.read_text(errors="replace"),
    ),
    (
        "generation",
        signal.SIGTERM,
        "group",
        True,
        {},
        lambda run, log, pid: ("generate", 0) in jobs(pid)[0],
    ),
    (
        "training",
        signal.SIGINT,
        "pid",
        False,
        {},
        lambda run, log, pid: (
            (run / "checkpoints/stage=0/step=000001/_COMPLETE").exists() and ("train", 0) in jobs(pid)[0]
        ),
    ),
    (
        "checkpoint-write",
        signal.SIGTERM,
        "pid",
        False,
        {"MUGRPO_FAULT_PAUSE": f"{CKPT_PAUSE}:60"},
        lambda run, log, pid: _paused(run / "checkpoints/stage=0/step=000002", "_COMPLETE"),
    ),
    (  # the train job gets its SIGTERM from the CLI while update 2 of stage 1 runs: it saves it
        "update-in-flight",
        signal.SIGTERM,
        "group",
        False,
        {"MUGRPO_FAULT_PAUSE": f"{UPDATE_PAUSE}:3"},
        lambda run, log, pid: f"MUGRPO_FAULT_PAUSE {UPDATE_PAUSE}" in log.read_text(errors="replace"),
    ),
    (
        "prestarted-job-waiting",
        signal.SIGINT,
        "group",
        False,
        {},
        lambda run, log, pid: bool(jobs(pid)[1]),
    ),
    (
        "eval",
        signal.SIGTERM,
        "pid",
        False,
        {},
        lambda run, log, pid: ("eval", 2) in jobs(pid)[0],
    ),
]


def _env(api_url: str, own_server: bool, home: Path, **extra: str) -> dict[str, str]:
    env = run_env(api_url, MUGRPO_RUN_SLOT="off", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    if own_server:  # the CLI starts its temporary server, with its database in a folder of this test
        env.pop("PREFECT_API_URL")
        env["PREFECT_HOME"] = str(home)
    return env


def _start(cfg: Path, env: dict, log: Path) -> subprocess.Popen:
    """``mugrpo run`` as a terminal starts it: leader of its own process group (the foreground group)."""
    return subprocess.Popen(
        [sys.executable, "-m", "mugrpo.cli", "run", str(cfg)],
        cwd=REPO_ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def flow_runs_of(root: Path):
    """The ``mugrpo-run`` flow run of the run stored under ``root`` (on the test server) and its subflow runs."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        recent = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["mugrpo-run"])), sort=FlowRunSort.START_TIME_DESC, limit=50
        )
        mine = [r for r in recent if r.parameters.get("config", {}).get("run", {}).get("root") == str(root)]
        assert len(mine) == 1, [(r.name, r.parameters.get("config", {}).get("run")) for r in recent[:5]]
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[mine[0].id]))
        )
    return mine[0], children


def final_weights(root: Path) -> dict:
    return load_file(str(root / RUN / "policies" / "stage=2" / "model.safetensors"))


def rollout_rows(root: Path) -> list[tuple]:
    rows = []
    for f in sorted((root / RUN / "rollouts").rglob("shard=*.parquet")):
        t = pq.read_table(f, columns=["prompt_id", "sample_idx", "response_token_ids", "reward"]).to_pydict()
        stage = int(f.parent.name.split("=")[1])
        rows += [(stage, *r) for r in zip(*t.values(), strict=True)]
    return sorted(rows, key=lambda r: r[:3])


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir, prefect_api):
    """The uninterrupted run (once per module): its final weights and rollouts."""
    tmp = tmp_path_factory.mktemp("stops-ref")
    cfg = write_config(tmp / "ref.yaml", _config(tmp / "root", tiny_model_dir))
    log = tmp / "ref.log"
    proc = _start(cfg, _env(prefect_api, False, tmp), log)
    try:
        assert proc.wait(timeout=1800) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    return final_weights(tmp / "root"), rollout_rows(tmp / "root")


@pytest.mark.parametrize(
    ("moment", "sig", "target", "own_server", "extra", "cond"),
    MOMENTS,
    ids=[f"{m[0]}-{m[1].name}-{m[2]}" for m in MOMENTS],
)
def test_a_stop_ends_within_the_grace_then_resume_matches_the_uninterrupted_run(
    tmp_path, tiny_model_dir, prefect_api, reference, moment, sig, target, own_server, extra, cond
):
    root = tmp_path / "root"
    run = root / RUN
    cfg = write_config(tmp_path / "run.yaml", _config(root, tiny_model_dir))
    env = _env(prefect_api, own_server, tmp_path / "prefect-home", **extra)
    log = tmp_path / "run.log"
    proc = _start(cfg, env, log)
    tree: set[int] = set()
    try:
        deadline = time.monotonic() + 900
        while not cond(run, log, proc.pid):
            tree.update(descendants(proc.pid))
            if proc.poll() is not None:
                pytest.fail(f"run ended ({proc.returncode}) before {moment}:\n{log.read_text()[-4000:]}")
            assert time.monotonic() < deadline, f"timed out waiting for {moment}:\n{log.read_text()[-4000:]}"
            time.sleep(0.05)
        tree.update(descendants(proc.pid))
        t0 = time.monotonic()
        if target == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        try:
            code = proc.wait(timeout=GRACE_S + 60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{moment}: still running {GRACE_S + 60:.0f} s after {sig.name}:\n{log.read_text()[-4000:]}")
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    text = log.read_text(errors="replace")
    print(f"{moment}: {sig.name} to the {target}, exit {code} after {took:.1f} s")
    assert code == 128 + sig, f"{moment}: exit code {code}, expected {128 + sig}:\n{text[-4000:]}"
    assert took <= GRACE_S + SLACK_S, f"{moment}: exit {took:.1f} s after {sig.name}, grace {GRACE_S} s"
    if moment == "checkpoint-write":  # the job cannot exit inside its paused commit: SIGKILLed after its share only
        assert took >= job_grace_s(GRACE_S) - 0.5, f"{moment}: the job got {took:.1f} s of {job_grace_s(GRACE_S)} s"
    # a stop reads as a stop: none of Prefect's crash lines, and the flow run Cancelled
    assert "Crash detected" not in text and "Finished in state Crashed" not in text, text[-4000:]
    if not own_server:  # the test server outlives the CLI: ask it (the CLI stops its own temporary one)
        flow_run, subflows = flow_runs_of(root)
        state = flow_run.state
        print(f"{moment}: flow run {flow_run.name} {state.name if state else None}: {state.message if state else ''}")
        assert state is not None and state.type.value == "CANCELLED", f"{moment}: flow run {state!r}"
        assert state.message.startswith(f"stopped by {sig.name}; "), state.message
        assert "mugrpo resume" in state.message or "mugrpo run" in state.message, state.message
        assert subflows and all(r.state.type.value in ("CANCELLED", "COMPLETED") for r in subflows), [
            (r.name, r.state) for r in subflows
        ]
    left = wait_gone(list(tree))  # the killed sessions' last processes are reaped by init
    assert not left, f"{moment}: processes left behind: {[(p, job_cmdline(p)[:120]) for p in left]}"
    assert json.loads((run / "_lease.json").read_text())["released"] is True, (run / "_lease.json").read_text()
    if (run / "run.json").exists():
        again = ["resume", str(run)]
        assert f"{RESUME_HINT} {run}" in text, text[-2000:]
    else:  # stopped before the flow wrote run.json: the same `mugrpo run` starts it
        again = ["run", str(cfg)]
        assert f"{RESTART_HINT} mugrpo run {cfg}" in text, text[-2000:]

    if moment == "update-in-flight":  # the job finished the update in flight and saved it: nothing to redo
        record = json.loads((run / "jobs/stage=1/train.preempted.json").read_text())
        assert (record["done"], record["saved"], record["lost"]) == (2, 2, 0), record
        assert "preempted: train stage 1: stopped by SIGTERM after update 2 of 3; saved at update 2" in text

    resumed = run_cli(again, {k: v for k, v in env.items() if k != "MUGRPO_FAULT_PAUSE"}, log)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    if moment == "update-in-flight":
        manifest = json.loads((run / "jobs/stage=1/train.manifest.json").read_text())
        assert manifest["counts"]["resumed_from"] == 2, manifest["counts"]
    weights, rows = reference
    assert rollout_rows(root) == rows, f"{moment}: resumed rollouts differ from the uninterrupted run's"
    resumed_weights = final_weights(root)
    assert resumed_weights.keys() == weights.keys()
    assert all(t.equal(resumed_weights[k]) for k, t in weights.items()), f"{moment}: final weights differ"
