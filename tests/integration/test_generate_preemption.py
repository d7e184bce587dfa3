"""A preempted generation job commits the shards that are complete and never a partial one: SIGTERM while
shard 1 is being committed (the background commit paused before its rename, ``MUGRPO_FAULT_PAUSE``) and shard 2 is
being sampled: the job exits 75 once shard 1 is committed, shard 2 is not written, and a re-run samples only what is
missing, giving the rollouts of an uninterrupted run (per-shard seeds). Tiny policy on CPU, real job processes."""

from __future__ import annotations

import signal
import time

import pytest
from test_fanout import gen_spec, rollouts, start, with_policy, write_specs

from mugrpo.common.faults import FAULT_ENV
from mugrpo.common.preemption import PREEMPTED_EXIT_CODE
from mugrpo.storage.layout import RunLayout

pytestmark = pytest.mark.slow

RUN = "fan"


def test_sigterm_commits_the_complete_shards_and_drops_the_one_in_flight(tmp_path, tiny_model_dir):
    layout = RunLayout(RUN)
    straight = with_policy(tmp_path / "straight", tiny_model_dir)
    log = tmp_path / "straight.log"
    assert start(straight, write_specs(straight, gen_spec(tmp_path / "straight"))[0], log).wait(600) == 0

    store = with_policy(tmp_path / "run", tiny_model_dir)
    spec = write_specs(store, gen_spec(tmp_path / "run"))[0]
    log = tmp_path / "preempted.log"
    proc = start(store, spec, log, **{FAULT_ENV: "shard=00001.parquet:3"})
    deadline = time.monotonic() + 600
    while f"{FAULT_ENV} " not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == PREEMPTED_EXIT_CODE, log.read_text()[-3000:]
    assert "preempted: generate: stopped by SIGTERM" in log.read_text()
    written = [s for s in range(4) if store.exists(layout.rollout_shard(0, s))]
    assert written == [0, 1]  # the shard being committed was committed; the one being sampled was not written
    assert store.read_bytes(layout.rollout_shard(0, 1)) != b""

    log = tmp_path / "rerun.log"
    assert start(store, spec, log).wait(timeout=600) == 0, log.read_text()[-3000:]
    assert "(2 already written)" in log.read_text()
    assert rollouts(store).equals(rollouts(straight))
