"""The preemption notice and the train job's stop decisions (mugrpo.common.preemption, mugrpo.trainer.preemption):
the grace a job is told, what fits in it, when an update in flight is dropped, and what the job says. Real signals
to this process; the job-level behaviour is tests/integration/test_train_preemption.py."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from mugrpo.common.preemption import (
    GRACE_ENV,
    PreemptionInterrupt,
    PreemptionNotice,
    grace_from_env,
    job_grace_s,
    termination_grace_period_s,
)
from mugrpo.trainer.preemption import Preempted, StopPolicy
from mugrpo.trainer.step import UpdateDropped


@pytest.fixture
def restore_sigterm():
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_the_jobs_grace_is_the_stops_less_the_cli_cleanup_reserve():
    assert job_grace_s(25.0) == 20.0  # orchestration.stop_grace_s's default: 5 s kept for the CLI's cleanups
    assert job_grace_s(4.0) == 2.0  # at most half of a short grace
    assert termination_grace_period_s(20.0) == 20 and termination_grace_period_s(0.2) == 1
    assert grace_from_env({GRACE_ENV: "12.5"}) == 12.5 and grace_from_env({}) == 30.0
    with pytest.raises(ValueError, match=GRACE_ENV):
        grace_from_env({GRACE_ENV: "soon"})
    with pytest.raises(ValueError, match=GRACE_ENV):
        grace_from_env({GRACE_ENV: "-1"})


def test_a_sigterm_is_recorded_and_the_time_left_counts_down(restore_sigterm):
    notice = PreemptionNotice(10.0, margin_s=1.0).install()
    assert not notice.requested and notice.left_s() == 9.0
    os.kill(os.getpid(), signal.SIGTERM)  # the process lives on: the handler records it
    assert notice.requested and notice.signal_name == "SIGTERM"
    time.sleep(0.05)
    assert 8.0 < notice.left_s() < 8.96
    assert notice.fits(5.0).fits and not notice.fits(9.5).fits
    assert notice.fits(None).fits  # unknown: tried
    assert "9.5 s" in notice.fits(9.5).describe()


def test_an_interrupting_notice_raises_once_in_the_main_thread(restore_sigterm):
    notice = PreemptionNotice(5.0).install(interrupt=True)
    with pytest.raises(PreemptionInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)  # the handler runs here
    notice.acknowledge()
    os.kill(os.getpid(), signal.SIGTERM)  # once acknowledged, a signal raises nothing
    assert notice.requested


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped raise, on purpose
def test_an_interrupt_lost_in_a_destructor_is_delivered_again(restore_sigterm):
    """A raise that lands in ``__del__`` is printed and dropped by the interpreter; the notice re-delivers it until
    the job acknowledges it (the eval job ran on after its SIGTERM without this)."""

    class Swallows:
        def __del__(self):
            time.sleep(0.3)  # the signal lands here: the interpreter prints the exception and drops it

    notice = PreemptionNotice(5.0).install(interrupt=True)
    t0 = time.monotonic()
    with pytest.raises(PreemptionInterrupt):
        victim = Swallows()
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
        del victim
        while time.monotonic() - t0 < 5:
            time.sleep(0.01)
    notice.acknowledge()
    assert time.monotonic() - t0 < 2


def test_a_notice_stops_interrupting_once_the_job_reaches_its_safe_points(restore_sigterm):
    notice = PreemptionNotice(5.0).install(interrupt=True)
    notice.stop_interrupting()  # a train job's update loop starts: from here it stops at its safe points
    os.kill(os.getpid(), signal.SIGTERM)  # recorded, not raised
    assert notice.requested and notice.signal_name == "SIGTERM"


def _policy(grace_s: float, *, may_drop: bool = True) -> tuple[StopPolicy, PreemptionNotice]:
    notice = PreemptionNotice(grace_s, margin_s=0.0)
    accelerator = SimpleNamespace(num_processes=1, device="cpu")
    return StopPolicy(notice, accelerator, may_drop=may_drop, earlier_checkpoint_s=3.0), notice


def test_an_update_in_flight_runs_on_when_it_and_a_checkpoint_fit():
    stops, notice = _policy(20.0)
    stops.update_s = [4.0, 4.0]
    notice.notify()
    stops.before_micro_batch(1, 2)  # 2 s left of the update + 3 s checkpoint < 20 s: no drop
    assert stops.checkpoint_fit().fits and stops.predicted_checkpoint_s() == 3.0
    stops.checkpoint_written(5.0)
    assert stops.predicted_checkpoint_s() == 5.0  # this job's own measure wins


def test_an_update_in_flight_is_dropped_when_the_rest_does_not_fit():
    stops, notice = _policy(4.0)
    stops.update_s = [4.0]
    stops.before_micro_batch(0, 2)  # no notice: nothing happens
    notice.notify()
    with pytest.raises(UpdateDropped):
        stops.before_micro_batch(0, 2)  # 4 s of update + 3 s checkpoint > 4 s
    tight, notice = _policy(7.0)  # 4 s of update + 3 s of checkpoint would just fit; with the 1.5x allowance, no
    tight.update_s = [4.0]
    notice.notify()
    with pytest.raises(UpdateDropped):
        tight.before_micro_batch(0, 2)
    unsafe, notice = _policy(4.0, may_drop=False)  # an algorithm's compose changed state: never dropped
    unsafe.update_s = [4.0]
    notice.notify()
    unsafe.before_micro_batch(0, 2)


def test_the_job_says_what_it_saved_and_what_a_rerun_redoes():
    stopped = Preempted(stage=1, done=5, saved=5, total=8, dropped=False, checkpoint=None)
    assert stopped.lost == 0
    assert (
        str(stopped)
        == "train stage 1: stopped by SIGTERM after update 5 of 8; saved at update 5 of 8, 0 update(s) to redo"
    )
    _, notice = _policy(0.5)
    notice.notify()
    short = Preempted(stage=0, done=3, saved=2, total=8, dropped=True, checkpoint=notice.fits(6.0))
    assert short.lost == 2 and short.record()["checkpoint_fit"] is False
    assert "update 4 dropped" in str(short) and "the grace was too short for a checkpoint (predicted 6.0 s" in str(
        short
    )
    assert "saved at update 2 (the last checkpoint), 2 update(s) to redo" in str(short)
