"""The chaos harness's quick mode: 7 moments drawn from a seed over cold and warm execution of a tiny 2-stage run,
3 SIGKILLs (the flow, a generate/train/eval/segment job, a verifier worker, or the whole tree), 2 evictions (SIGTERM
to one working job's group with its grace: exit 75 or 0 within it, nothing left, the flow retries the job) and 2
stops (SIGINT or SIGTERM to the flow's group or pid: exit within the grace, nothing left, lease released), a retry
or a resume after each, then the invariants against uninterrupted runs: the run completes, every rollout once,
train_steps updates 1..U once each, policy_version and staleness unchanged, final weights bitwise equal; and the
work each moment lost. Real CLI, flows, jobs, files. The pure parts (moment draws, the process-tree roles, the
invariant checks on doctored files, the work-lost ledger on a hand-made log) are tested fast."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _tiny import DATA_DIR
from safetensors.torch import save_file

from bench.support.chaos import (
    ARM_ROLES,
    QUICK,
    ChaosSettings,
    Moment,
    Proc,
    WorkLedger,
    check_run,
    draw_moments,
    in_overlap,
    process_tree,
    run_chaos,
    waiting_job,
    working_jobs,
)
from bench.support.chaos.accounting import committed_shards, committed_updates, job_stages
from bench.support.chaos.procs import JOB_ROLES


def _settings(model_dir: Path, **kw) -> ChaosSettings:
    return ChaosSettings(data_dir=DATA_DIR, model_dir=model_dir, **{**QUICK, **kw})


def test_moments_are_drawn_from_the_seed(tmp_path):
    a, b = draw_moments(_settings(tmp_path, seed=3)), draw_moments(_settings(tmp_path, seed=3))
    assert a == b and a != draw_moments(_settings(tmp_path, seed=4))
    assert [m.arm for m in a] == ["cold", "warm"] * 3 + ["cold"]
    assert all(0 <= m.delay < 1 and 0 <= m.pick < 1 for m in a)
    # quick mode: cold an overlap SIGKILL, a waiting SIGKILL, a stop, an eviction; warm a SIGKILL, an eviction, a stop
    assert [(m.arm, m.at, m.kind) for m in a] == [
        ("cold", "overlap", "SIGKILL"),
        ("warm", "any", "SIGKILL"),
        ("cold", "waiting", "SIGKILL"),
        ("warm", "any", "eviction"),
        ("cold", "any", "stop"),
        ("warm", "any", "stop"),
        ("cold", "any", "eviction"),
    ]


def test_the_cold_arms_moments_wait_for_a_checkpoint_overlap_or_a_waiting_job(tmp_path):
    moments = draw_moments(_settings(tmp_path, seed=0, moments=14))
    # cold moments 0, 2, 4, 6, ...: the 1st and 7th wait for an overlap, the 4th is an eviction instead
    assert [m.index for m in moments if m.at == "overlap"] == [0, 12]
    assert [m.index for m in moments if m.at == "waiting"] == [2, 8]  # 2nd and 5th: a pre-started job waits
    # evictions: the warm arm's 2nd and 5th (moments 3, 9), the cold arm's 4th (moment 6); never with a stop
    assert [m.index for m in moments if m.evict] == [3, 6, 9]
    assert all(m.at == "any" and m.stop is None and m.kind == "eviction" for m in moments if m.evict)
    no_evictions = draw_moments(_settings(tmp_path, seed=0, moments=14, evictions=False))
    assert not any(m.evict for m in no_evictions)
    assert [m.index for m in no_evictions if m.at == "overlap"] == [0, 6, 12]
    assert [(m.delay, m.pick) for m in no_evictions] == [(m.delay, m.pick) for m in moments]
    moments = moments[:12]
    assert all(m.arm == "cold" for m in moments if m.at != "any")
    # each arm's 3rd and 6th moments are stops, the four (signal, target) pairs in turn
    assert [(m.index, m.stop) for m in moments if m.stop] == [
        (4, ("SIGINT", "group")),
        (5, ("SIGTERM", "pid")),
        (10, ("SIGTERM", "group")),
        (11, ("SIGINT", "pid")),
    ]
    assert all(m.at == "any" for m in moments if m.stop)
    without = draw_moments(_settings(tmp_path, seed=0, moments=12, stops=False))
    assert not any(m.stop for m in without)
    assert [(m.delay, m.pick, m.at) for m in without] == [(m.delay, m.pick, m.at) for m in moments]
    run = tmp_path / "run"
    (run / "stages").mkdir(parents=True)
    assert in_overlap(run, 3) is None
    (run / "policies/stage=1").mkdir(parents=True)
    (run / "policies/stage=1/_COMPLETE").write_text("{}")
    assert in_overlap(run, 3) == 0  # stage 1's policy committed, stage 0 not: its checkpoint and stage 1's generation
    (run / "stages/stage=0.json").write_text("{}")
    assert in_overlap(run, 3) is None


def test_the_work_lost_is_what_dead_jobs_had_done_and_not_committed(tmp_path):
    """The ledger reads a job's progress lines from the run's log; a dead job's updates beyond the latest committed
    checkpoint and its shard in flight are lost, once; committed work is never counted."""
    run, log = tmp_path / "chaos", tmp_path / "run.log"
    ledger = WorkLedger(log, run, updates_per_stage=3)
    prefix = "12:00:00.000 | INFO    | Task run 'train' - [train] "
    log.write_text(
        f"{prefix}train stage 0: 0/3 updates (0%)  loss +0.0000  0 tok/s  0s\n"
        f"{prefix}train stage 0: 1/3 updates (33%)  loss +0.0000  0 tok/s  0s\n"
        f"{prefix}generate stage 1: 4 prompts x G=2 in 2 shards; worker 0 of 1 owns 2 (0 already written), skipped\n"
        f"{prefix}train stage 0: 2/3 updates (67%)  loss +0.0000  0 tok/s  0s\n"
        f"{prefix}train stage 0: 3/3 upd"  # a line being written: not read yet
    )
    ledger.read()
    assert ledger.trained == {0: 2} and ledger.sampling == {1: 2}
    (run / "checkpoints/stage=0/step=000001").mkdir(parents=True)
    (run / "checkpoints/stage=0/step=000001/_COMPLETE").write_text("{}")
    (run / "checkpoints/stage=0/step=000002").mkdir(parents=True)  # not committed: no _COMPLETE
    (run / "rollouts/stage=1").mkdir(parents=True)
    (run / "rollouts/stage=1/shard=00000.parquet").write_text("")
    (run / "rollouts/stage=1/.shard=00001.parquet.tmp-0").write_text("")  # a cut-off commit is not a shard
    assert (committed_updates(run, 0, 3), committed_shards(run, 1)) == (1, 1)
    loss = ledger.lost({0: 1}, {1})
    assert (loss.updates, loss.shards) == (1, 1), loss.describe()  # update 2 done, resumes from 1; shard 1 again
    assert ledger.lost({0: 1}, {1}).updates == 0  # counted once: the stage is back to what is committed
    with log.open("a") as f:
        f.write(f"ates (100%)\n{prefix}generate stage 1: 8 rows from 1 worker(s), mean reward 0.0\n")
    (run / "jobs/stage=0").mkdir(parents=True)
    (run / "jobs/stage=0/train.manifest.json").write_text("{}")
    assert committed_updates(run, 0, 3) == 3  # the stage's training is committed
    ledger.sampling[1] = 2
    until = ledger.offset + len("ates (100%)\n")  # read up to a dead job's end only: not into a retry's lines
    assert ledger.lost({0: 3}, set(), until=until).updates == 0 and ledger.sampling == {1: 2}
    assert ledger.trained == {0: 3}
    ledger.read()
    assert ledger.sampling == {}  # stage 1's generation committed
    # a segment job samples from its progress line's start on, not from its plan (its verifier pool starts between)
    seg = "12:00:01.000 | INFO    | Task run 'segment' - [segment] "
    with log.open("a") as f:
        f.write(f"{seg}generate stage 2: 4 prompts x G=2 in 2 shards; worker 0 of 1 owns 2 (0 already written), s\n")
    ledger.read()
    assert (ledger.planned, ledger.sampling) == ({2: 2}, {})
    assert ledger.lost({}, {2}).shards == 0 and ledger.planned == {}  # taken down before sampling: nothing redone
    with log.open("a") as f:
        f.write(f"{seg}generate stage 2: 4 prompts x G=2 in 2 shards; worker 0 of 1 owns 2 (0 already written), s\n")
        f.write(f"{seg}generate stage 2: starting  0s\n")
    ledger.read()
    assert (ledger.planned, ledger.sampling) == ({}, {2: 2})
    assert ledger.lost({}, {2}).shards == 1
    spec = "/r/chaos/jobs/stage=1/train.spec.json"
    assert job_stages("train", ["python", "-m", "mugrpo.jobs.train", spec], 3) == ({1}, set())
    assert job_stages("segment", ["python", "-m", "mugrpo.jobs.segment", spec], 3) == ({1, 2}, {1, 2})
    assert job_stages("eval", ["python", "-m", "mugrpo.jobs.eval", spec], 3) == (set(), set())


def test_a_moment_picks_among_the_roles_alive_then():
    alive = {"flow", "train", "verifier"}  # choices: flow, train, tree, verifier
    picks = [Moment(0, "cold", 1.0, pick).role(alive) for pick in (0.0, 0.3, 0.6, 0.99)]
    assert picks == ["flow", "train", "tree", "verifier"]
    assert Moment(0, "warm", 1.0, 0.9).role(set()) == "tree"
    assert set(ARM_ROLES["warm"]) >= {"flow", "segment", "verifier", "tree"}


def test_process_tree_names_roles_by_command_line(tmp_path):
    """A flow stand-in with a fake job child (argv has `mugrpo.jobs.train`) that spawns a multiprocessing worker."""
    child = (
        "import multiprocessing as mp, sys, time\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('spawn').Process(target=time.sleep, args=(60,)); p.start()\n"
        "    q = mp.get_context('forkserver').Process(target=time.sleep, args=(60,)); q.start()\n"
        "    open(sys.argv[2], 'w').write('ready'); time.sleep(60)\n"
    )
    script = tmp_path / "job.py"
    script.write_text(child)
    ready = tmp_path / "ready"
    flow = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])", sys.executable, str(script),
         "mugrpo.jobs.train", str(ready)]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        roles = [p.role for p in process_tree(flow.pid)]
        assert roles[0] == "flow" and "train" in roles
        # the spawned worker and the one forked from the job's multiprocessing forkserver; the forkserver itself is
        # not a victim role (it only starts new workers)
        assert roles.count("verifier") == 2 and roles.count("verifier-forkserver") == 1
    finally:
        for p in reversed(process_tree(flow.pid)):
            os.kill(p.pid, 9)
        flow.wait()
    assert process_tree(flow.pid) == []
    assert set(JOB_ROLES) == {"generate", "train", "eval", "segment"}


def test_a_waiting_job_is_one_whose_start_markers_are_missing(tmp_path):
    run = tmp_path / "chaos"
    spec = run / "jobs/stage=1/train.spec.json"
    spec.parent.mkdir(parents=True)
    marker = "chaos/jobs/stage=1/generate.manifest.json"
    spec.write_text(json.dumps({"start_after": [marker]}))
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "mugrpo.jobs.train", str(spec)])
    try:
        deadline = time.monotonic() + 30
        while b"mugrpo.jobs.train" not in Path(f"/proc/{job.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        tree = [Proc(os.getpid(), 1, "flow"), Proc(job.pid, os.getpid(), "train")]
        assert waiting_job(tree, run).pid == job.pid
        assert working_jobs(tree, run) == []  # an eviction moment does not pick it
        (tmp_path / marker).write_text("{}")
        assert waiting_job(tree, run) is None
        assert working_jobs(tree, run) == [tree[1]]
    finally:
        job.kill()
        job.wait()


def _fake_run(root: Path) -> Path:
    """A 1-stage run folder with a rollout shard, train_steps and a final policy (hand-made tables)."""
    run = root / "chaos"
    (run / "rollouts/stage=0").mkdir(parents=True)
    (run / "train_steps/stage=0").mkdir(parents=True)
    (run / "policies/stage=1").mkdir(parents=True)
    (run / "stages").mkdir()
    (run / "stages/stage=0.json").write_text("{}")
    pq.write_table(
        pa.table({"prompt_id": ["a", "a", "b", "b"], "sample_idx": [0, 1, 0, 1], "policy_version": [0, 0, 0, 0]}),
        run / "rollouts/stage=0/shard=00000.parquet",
    )
    pq.write_table(pa.table({"update": [1, 2], "staleness": [0, 1]}), run / "train_steps/stage=0/part-00002.parquet")
    save_file({"w": torch.arange(4.0)}, str(run / "policies/stage=1/model.safetensors"))
    (run / "jobs/stage=0").mkdir(parents=True)
    plan = {"run_id": "chaos", "stage": 0, "seed": 0, "prompt_start": 0, "dataset_size": 2, "dataset_sha256": "0" * 64}
    (run / "jobs/stage=0/generate.plan.json").write_text(json.dumps({**plan, "prompt_ids": ["a", "b"]}))
    return run


def test_invariants_name_what_differs(tmp_path):
    ref = _fake_run(tmp_path / "ref")
    run = tmp_path / "run" / "chaos"
    shutil.copytree(ref, run)
    check = check_run(run, ref, 1)
    assert check.ok and check.weights_equal and check.lost == check.duplicated == 0

    pq.write_table(  # two lost rollouts, a duplicated one, a changed policy_version
        pa.table({"prompt_id": ["a", "a", "b"], "sample_idx": [0, 0, 1], "policy_version": [0, 0, 3]}),
        run / "rollouts/stage=0/shard=00000.parquet",
    )
    pq.write_table(
        pa.table({"update": [1, 1, 2], "staleness": [0, 0, 1]}), run / "train_steps/stage=0/part-00002.parquet"
    )
    save_file({"w": torch.arange(4.0) + 1e-7}, str(run / "policies/stage=1/model.safetensors"))
    check = check_run(run, ref, 1)
    assert (check.lost, check.duplicated, check.weights_equal) == (2, 1, False)  # a1, b0 lost; a0 twice
    text = "\n".join(check.problems)
    for expected in (
        "rollouts lost",
        "duplicated rollouts",
        "policy_version changed",
        "repeated [1]",
        "final weight w",
    ):
        assert expected in text, text
    (run / "stages/stage=0.json").unlink()
    assert "no stage manifest for stages [0]" in "\n".join(check_run(run, ref, 1).problems)


@pytest.mark.slow
def test_quick_chaos_run_keeps_every_invariant(tiny_model_dir, prefect_api, tmp_path):
    settings = _settings(tiny_model_dir, seed=0)
    lines: list[str] = []
    report = run_chaos(settings, work=tmp_path, api_url=prefect_api, say=lines.append)
    first = (
        "7/7 resumed, 0 lost, 0 duplicated, weights equal, 2/2 data edits refused, 2/2 stops clean, 2/2 evictions clean"
    )
    said = report.summary + "\n" + "\n".join(lines)
    assert report.summary.splitlines()[0] == first, said
    assert report.ok
    assert sum(a.killed for a in report.arms) == 7 and all(a.completed for a in report.arms)
    # the stop moments: SIGINT to the cold run's group, SIGTERM to the warm run's pid, each within the grace
    stops = [(c.signal, c.target, c.exit_code) for a in report.arms for c in a.stops]
    assert stops == [("SIGINT", "group", 130), ("SIGTERM", "pid", 143)], said
    # the evictions: the cold job exited 75 and the flow retried it (its first attempt since the stop restarted the
    # flow), or 0 (its work was done: the flow went on, or completed when it was the run's last job)
    (cold,) = [c for a in report.arms if a.arm == "cold" for c in a.evictions]
    assert (cold.exit, cold.flow) in {("exit 75", "retried it"), ("exit 0", "went on"), ("exit 0", "exited 0")}, said
    # every reached moment counted the work it lost; a notice to a cold job never loses a completed update (it saves
    # them in its grace); the summary's second line gives the means per kind
    kinds = [w.kind for a in report.arms for w in a.work]
    assert sorted(kinds) == sorted(["SIGKILL"] * 3 + ["eviction"] * 2 + ["stop"] * 2), said
    cold_work = next(a.work for a in report.arms if a.arm == "cold")
    assert all(w.loss.updates == 0 for w in cold_work if w.kind != "SIGKILL"), said
    assert report.summary.splitlines()[1].startswith("work lost per moment"), said
    assert set(report.work_lost) == {"SIGKILL", "eviction", "stop"}
