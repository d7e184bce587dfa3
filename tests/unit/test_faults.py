"""The fault-injection pause points of the crash and preemption tests (mugrpo.common.faults): a point pauses only when
``MUGRPO_FAULT_PAUSE`` names it, for the seconds given, and says so on stderr; several ``;``-separated entries each
hold their own points."""

from __future__ import annotations

import time

import pytest

from mugrpo.common.faults import FAULT_ENV, fault_pause


def paused_s(name: str) -> float:
    t0 = time.monotonic()
    fault_pause(name)
    return time.monotonic() - t0


def test_unset_or_unmatched_never_pauses(monkeypatch, capsys):
    monkeypatch.delenv(FAULT_ENV, raising=False)
    assert paused_s("run/rollouts/stage=0/shard=00001.parquet") < 0.05
    monkeypatch.setenv(FAULT_ENV, "checkpoints/stage=0/:0.3")
    assert paused_s("run/rollouts/stage=0/shard=00001.parquet") < 0.05
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "spec",
    ["rollouts/stage=1/shard=00001:0.3", "checkpoints/stage=0/step=000003/:5;rollouts/stage=1/shard=00001:0.3"],
)
def test_a_named_point_pauses_its_seconds_and_says_so(monkeypatch, capsys, spec):
    monkeypatch.setenv(FAULT_ENV, spec)
    assert 0.3 <= paused_s("run/rollouts/stage=1/shard=00001.parquet") < 2.0  # its own entry's 0.3 s, not another's
    assert capsys.readouterr().err == f"{FAULT_ENV} run/rollouts/stage=1/shard=00001.parquet\n"
