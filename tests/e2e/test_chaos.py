"""The chaos harness's quick mode: 6 moments drawn from a seed over cold and warm execution of a tiny 2-stage run,
4 SIGKILLs (the flow, a generate/train/eval/segment job, a verifier worker, or the whole tree) and 2 stops (SIGINT
or SIGTERM to the flow's group or pid: exit within the grace, nothing left, lease released), a resume after each,
then the invariants against uninterrupted runs: the run completes, every rollout once, train_steps updates 1..U once
each, policy_version and staleness unchanged, final weights bitwise equal. Real CLI, flows, jobs, files. The pure
parts (moment draws, the process-tree roles, the invariant checks on doctored files) are tested fast."""

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
    check_run,
    draw_moments,
    in_overlap,
    process_tree,
    run_chaos,
    waiting_job,
)
from bench.support.chaos.procs import JOB_ROLES


def _settings(model_dir: Path, **kw) -> ChaosSettings:
    return ChaosSettings(data_dir=DATA_DIR, model_dir=model_dir, **{**QUICK, **kw})


def test_moments_are_drawn_from_the_seed(tmp_path):
    a, b = draw_moments(_settings(tmp_path, seed=3)), draw_moments(_settings(tmp_path, seed=3))
    assert a == b and a != draw_moments(_settings(tmp_path, seed=4))
    assert [m.arm for m in a] == ["cold", "warm"] * 3
    assert all(0 <= m.delay < 1 and 0 <= m.pick < 1 for m in a)


def test_the_cold_arms_moments_wait_for_a_checkpoint_overlap_or_a_waiting_job(tmp_path):
    moments = draw_moments(_settings(tmp_path, seed=0, moments=12))
    assert [m.index for m in moments if m.at == "overlap"] == [0, 6]  # cold moments 0, 2, 4, 6, ...: 1st and 4th
    assert [m.index for m in moments if m.at == "waiting"] == [2, 8]  # 2nd and 5th: a pre-started job waits
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
        (tmp_path / marker).write_text("{}")
        assert waiting_job(tree, run) is None
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
    first = "6/6 resumed, 0 lost, 0 duplicated, weights equal, 2/2 data edits refused, 2/2 stops clean"
    assert report.summary.splitlines()[0] == first, report.summary + "\n" + "\n".join(lines)
    assert report.ok
    assert sum(a.killed for a in report.arms) == 6 and all(a.completed for a in report.arms)
    # the stop moments: SIGINT to the cold run's group, SIGTERM to the warm run's pid, each within the grace
    stops = [(c.signal, c.target, c.exit_code) for a in report.arms for c in a.stops]
    assert stops == [("SIGINT", "group", 130), ("SIGTERM", "pid", 143)], "\n".join(lines)
