"""The start gate of a pre-started job (mugrpo.coordination.start_gate) and the markers the cold schedule gives each job
(mugrpo.orchestration.job_specs.start_markers): a job waits for exactly the commits the schedule itself waits for,
wakes when they exist, gives up after its timeout naming what is missing, and refuses to run for a writer that lost
the run.

Real Store files, a real run lease; the clock is faked only in the timeout test.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from mugrpo.config import config_from_dict
from mugrpo.coordination.jobspec import JobSpec
from mugrpo.coordination.lease import TOKEN_ENV, LeaseFenced, LeaseRecord
from mugrpo.coordination.start_gate import StartGate, StartTimeout
from mugrpo.orchestration.job_specs import build_job_specs, start_markers
from mugrpo.orchestration.runs import attach_run, prestarts
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import COMPLETE_MARKER, Store
from tests._tiny import tiny_config

RUN = "gate"


def spec(root: Path, markers: list[str], timeout: float = 30.0) -> JobSpec:
    return JobSpec(root=str(root), run_id=RUN, stage=1, start_after=markers, start_timeout_s=timeout)


def test_no_markers_opens_at_once(tmp_path: Path) -> None:
    gate = StartGate(spec(tmp_path, []))
    assert not gate.pending
    t0 = time.monotonic()
    assert gate.wait() >= t0
    assert time.monotonic() - t0 < 0.5


def test_waits_until_every_marker_is_committed(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    layout = RunLayout(RUN)
    markers = [layout.job_manifest(1, "generate"), f"{layout.policy_dir(1)}/{COMPLETE_MARKER}"]
    gate = StartGate(spec(tmp_path, markers))
    assert gate.missing() == markers and gate.pending

    def commit() -> None:
        time.sleep(0.3)
        store.write_bytes(markers[1], b"{}")
        time.sleep(0.3)
        store.write_bytes(markers[0], b"{}")

    writer = threading.Thread(target=commit)
    writer.start()
    said: list[str] = []
    t0 = time.monotonic()
    opened = gate.wait(said.append)
    writer.join()
    assert opened - t0 >= 0.55  # not before the second commit
    assert opened - t0 < 5.0
    assert gate.missing() == []
    assert said[0].startswith("waiting for 2 input(s)") and markers[0] in said[0]
    assert said[-1].startswith("inputs committed")


def test_times_out_naming_the_missing_marker(tmp_path: Path) -> None:
    now = [100.0]
    gate = StartGate(
        spec(tmp_path, [RunLayout(RUN).stage_manifest(0)], timeout=2.0),
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    with pytest.raises(StartTimeout, match=r"stage=0\.json") as err:
        gate.wait()
    assert "2 s" in str(err.value)


def test_a_writer_that_lost_the_lease_does_not_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(str(tmp_path))
    layout = RunLayout(RUN)
    marker = layout.job_manifest(1, "generate")
    store.write_bytes(marker, b"{}")
    now = time.time()
    holder = LeaseRecord("other:1", "new-token", "other", 1, "", now, now, now + 60)
    store.write_bytes(layout.lease, holder.to_bytes())
    monkeypatch.setenv(TOKEN_ENV, "old-token")
    gate = StartGate(spec(tmp_path, [marker]))
    with pytest.raises(LeaseFenced, match="other:1"):
        gate.wait()
    monkeypatch.setenv(TOKEN_ENV, "new-token")
    gate.wait()  # the holder's own job starts


def cfg(root: Path, model: Path, **orchestration):
    data = tiny_config(root, model, run_id=RUN)
    data["run"]["num_stages"] = 3
    data.setdefault("orchestration", {}).update(orchestration)
    return config_from_dict(data, source="test")


def test_markers_are_the_schedules_commits(tmp_path: Path, tiny_model_dir: Path) -> None:
    c = cfg(tmp_path, tiny_model_dir)
    lay = RunLayout(RUN)
    policy = f"{lay.policy_dir(1)}/{COMPLETE_MARKER}"
    # overlap on (the default): generate k+1 starts at the policy's commit, beside train k's checkpoint
    assert start_markers(c, 1, "generate") == [policy]
    assert start_markers(c, 1, "train") == [lay.job_manifest(1, "generate"), lay.stage_manifest(0)]
    assert start_markers(c, 1, "eval") == [lay.job_manifest(1, "train"), lay.job_manifest(2, "generate")]
    assert start_markers(c, 2, "eval") == [lay.job_manifest(2, "train")]  # the last stage overlaps nothing
    assert start_markers(c, 0, "train") == [lay.job_manifest(0, "generate")]
    # overlap off: generate k+1 waits for stage k's commit
    seq = cfg(tmp_path, tiny_model_dir, overlap_checkpoint=False)
    assert start_markers(seq, 1, "generate") == [policy, lay.stage_manifest(0)]
    assert start_markers(seq, 1, "eval") == [lay.job_manifest(1, "train")]
    # no pre-start: warm execution, the switch off, or a stage whose policy is not published
    assert not prestarts(cfg(tmp_path, tiny_model_dir, prestart_jobs=False), 1)
    assert start_markers(cfg(tmp_path, tiny_model_dir, prestart_jobs=False), 1, "train") == []
    assert not prestarts(cfg(tmp_path, tiny_model_dir, execution="warm"), 1)
    every2 = cfg(tmp_path, tiny_model_dir, publish_policy_every=2)
    assert not prestarts(every2, 1) and prestarts(every2, 2)
    with pytest.raises(ValueError, match="not pre-started"):
        build_job_specs(attach_run(every2), 1, ahead=True)


def test_specs_written_ahead_are_the_specs_written_after_the_commit(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A pre-started job reads its spec before its policy exists: it is the spec the schedule writes once the
    policy is committed, plus the start markers. A spec written when its job is launched has no marker, so the job
    also runs by hand (README, 'Each job can also be run alone')."""
    c = cfg(tmp_path, tiny_model_dir)
    run = attach_run(c)
    ahead = {job: s.model_dump() for job, s in build_job_specs(run, 1, ahead=True).items()}
    store = Store(str(tmp_path))
    store.write_bytes(f"{RunLayout(RUN).policy_dir(1)}/{COMPLETE_MARKER}", b"{}")
    after = {job: s.model_dump() for job, s in build_job_specs(run, 1).items()}
    for job in after:
        assert ahead[job]["start_after"] == start_markers(c, 1, job) and after[job]["start_after"] == []
        assert ahead[job]["start_timeout_s"] == c.orchestration.job_timeout_s
        drop = {"start_after", "start_timeout_s"}
        assert {k: v for k, v in ahead[job].items() if k not in drop} == {
            k: v for k, v in after[job].items() if k not in drop
        }
