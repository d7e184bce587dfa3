"""What a train job does with a preemption notice (:class:`mugrpo.common.preemption.PreemptionNotice`): lose at
most the update in flight.

At each safe point of the update loop (:func:`mugrpo.trainer.updates.train_updates`) the job asks its
:class:`StopPolicy`:

- **before an update**: a notice came, so the update is not started;
- **between two micro-batches of an update**: the rest of the update (predicted from this job's earlier updates)
  plus a checkpoint, times :data:`FINISH_ALLOWANCE`, no longer fit in the grace: the update is dropped
  (:class:`mugrpo.trainer.step.UpdateDropped`: no optimizer step, gradients zeroed, RNG back to the update's
  start), so parameters, AdamW and RNG are those of the update before it. Only with one process and with
  algorithms whose ``compose`` changes no state (:attr:`mugrpo.algorithms.TrainHooks.compose_changes_state`);
  otherwise the update always runs to its end;
- **after an update**: a notice came.

Then the updates since the last checkpoint are saved: the checkpoint (:func:`mugrpo.trainer.commit.
write_stage_checkpoint`, the same one a scheduled checkpoint writes) is written when its predicted write time fits
in what is left of the grace, else the job falls back to the last committed checkpoint and says so. Either way it
records ``jobs/stage=k/train.preempted.json`` and raises :class:`Preempted`; the job exits with
:attr:`mugrpo.common.exit_codes.ExitCode.PREEMPTED` (75). A re-run resumes from the checkpoint as from any other, so
its final weights are bitwise those of an uninterrupted run on CPU.

The checkpoint's write time is predicted from this run's own checkpoints: the slowest one this job wrote, else the
slowest an earlier job of the stage wrote (each job records its checkpoints' seconds in
``jobs/stage=k/train.checkpoints.json``), else the mean of the latest train job manifest of an earlier stage
(``timings.checkpoint`` over the checkpoints it wrote). With none (the run's first checkpoint), the write is tried:
a SIGKILL during it leaves only temporary files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import torch

from mugrpo.commits.manifest import read_job_manifest
from mugrpo.common.preemption import Fit, PreemptionNotice
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.spec import TrainSpec
from mugrpo.trainer.step import UpdateDropped

#: Factor on the predicted seconds of "finish the update in flight, then checkpoint" before a job plans on them: a
#: finish that overruns the grace loses every update since the last checkpoint, a drop only the one in flight, so the
#: job finishes only with room to spare (measured on the main job: a finish predicted at 19 s of a 19 s grace was
#: SIGKILLed inside its checkpoint).
FINISH_ALLOWANCE = 1.5


@dataclass
class Preempted(Exception):
    """A train job stopped on a preemption notice.

    Attributes:
        stage: the stage.
        done: stage updates done when it stopped (the update in flight included when it ran to its end).
        saved: stage update of the latest committed checkpoint (0: none; the stage restarts from its start).
        total: the stage's updates.
        dropped: the update in flight (``done + 1``) was abandoned.
        checkpoint: the fit of the checkpoint it wrote or skipped (None: nothing new to save).
        signal_name: the signal of the notice.
    """

    stage: int
    done: int
    saved: int
    total: int
    dropped: bool
    checkpoint: Fit | None
    signal_name: str = "SIGTERM"

    @property
    def lost(self) -> int:
        """Updates a re-run does again: those done since the saved checkpoint, and the dropped one."""
        return self.done - self.saved + int(self.dropped)

    def __str__(self) -> str:
        head = f"train stage {self.stage}: stopped by {self.signal_name} after update {self.done} of {self.total}"
        inflight = f"; update {self.done + 1} dropped (the rest of it did not fit in the grace)" if self.dropped else ""
        if self.checkpoint is not None and not self.checkpoint.fits:
            return (
                f"{head}{inflight}; the grace was too short for a checkpoint ({self.checkpoint.describe()}): "
                f"saved at update {self.saved} (the last checkpoint), {self.lost} update(s) to redo"
            )
        return f"{head}{inflight}; saved at update {self.saved} of {self.total}, {self.lost} update(s) to redo"

    def record(self) -> dict:
        """The JSON record of ``jobs/stage=k/train.preempted.json``."""
        return {
            "stage": self.stage,
            "signal": self.signal_name,
            "done": self.done,
            "saved": self.saved,
            "total": self.total,
            "dropped": self.dropped,
            "lost": self.lost,
            "checkpoint_fit": None if self.checkpoint is None else self.checkpoint.fits,
            "checkpoint_predicted_s": None if self.checkpoint is None else self.checkpoint.predicted_s,
            "grace_left_s": None if self.checkpoint is None else self.checkpoint.left_s,
            "message": str(self),
            "created_at": datetime.now(UTC).isoformat(),
        }


def write_preemption_record(store: Store, layout: RunLayout, stop: Preempted) -> None:
    """Write what the stopped job saved to ``jobs/stage=k/train.preempted.json`` (:meth:`RunLayout.preemption_record`;
    a small JSON file: one PUT), which :func:`mugrpo.commits.manifest.read_preemption_record` reads back."""
    store.write_json(layout.preemption_record(stop.stage), stop.record())


def checkpoint_times_path(layout: RunLayout, stage: int) -> str:
    """Where a train job records the seconds each of its checkpoints took to write (``jobs/stage=k/
    train.checkpoints.json``; read by a re-run of the stage to predict a checkpoint's write time)."""
    return layout.job_error(stage, "train", "checkpoints")


def record_checkpoint_seconds(store: Store, layout: RunLayout, stage: int, seconds: list[float]) -> None:
    """Write the stage's measured checkpoint seconds (:func:`checkpoint_times_path`; one small PUT)."""
    store.write_json(checkpoint_times_path(layout, stage), {"stage": stage, "seconds": [round(s, 3) for s in seconds]})


def earlier_checkpoint_s(store: Store, layout: RunLayout, spec: TrainSpec) -> float | None:
    """Seconds one checkpoint of this run is predicted to take, from the run's own measures: the slowest checkpoint
    an earlier job of this stage recorded (:func:`checkpoint_times_path`), else the mean of the latest earlier
    stage's train job (its manifest's ``timings.checkpoint`` over the checkpoints that job wrote), else None."""
    rel = checkpoint_times_path(layout, spec.stage)
    if store.exists(rel):
        seconds = store.read_json(rel).get("seconds") or []
        if seconds:
            return float(max(seconds))
    every, total = spec.train.checkpoint_every, spec.train.updates_per_stage
    for stage in range(spec.stage - 1, -1, -1):
        manifest = read_job_manifest(store, spec.run_id, stage, "train")
        if manifest is None or "checkpoint" not in manifest.timings:
            continue
        start = int(manifest.counts.get("resumed_from", 0))
        updates = int(manifest.counts.get("updates", total))
        written = sum(1 for u in range(start + 1, updates + 1) if u % every == 0 or u == updates)
        if written:
            return manifest.timings["checkpoint"] / written
    return None


class StopPolicy:
    """The train job's decisions on a preemption notice (module docstring). One per stage's update loop.

    Args:
        notice: the job's notice (None: no notice is watched; every method is then a no-op).
        accelerator: the job's accelerator; with several processes the notice is agreed on (a max-reduce of the
            flag at each update's end) and updates are never dropped.
        may_drop: whether an update may be dropped between micro-batches (no algorithm's compose changes state).
        earlier_checkpoint_s: the run's measured seconds per checkpoint (:func:`earlier_checkpoint_s`), or None.
        record: called with the seconds measured so far after each checkpoint (the main process records them,
            :func:`record_checkpoint_seconds`), or None.
    """

    def __init__(
        self,
        notice: PreemptionNotice | None,
        accelerator,
        *,
        may_drop: bool,
        earlier_checkpoint_s: float | None = None,
        record: Callable[[list[float]], None] | None = None,
    ) -> None:
        self.notice = notice
        self.accelerator = accelerator
        self.world = accelerator.num_processes
        self.may_drop = may_drop and self.world == 1
        self.update_s: list[float] = []
        self.checkpoint_s: list[float] = []
        self.earlier_checkpoint_s = earlier_checkpoint_s
        self.record = record
        self._update_started = 0.0

    @property
    def watching(self) -> bool:
        return self.notice is not None

    def predicted_checkpoint_s(self) -> float | None:
        """Seconds a checkpoint is predicted to take: the slowest of this job's, else the run's earlier mean."""
        return max(self.checkpoint_s) if self.checkpoint_s else self.earlier_checkpoint_s

    def stop_requested(self) -> bool:
        """Whether to stop here (a safe point between updates); agreed on by every process."""
        if self.notice is None:
            return False
        flag = self.notice.requested
        if self.world > 1:
            value = torch.tensor([1.0 if flag else 0.0], device=self.accelerator.device)
            flag = bool(self.accelerator.reduce(value, reduction="sum").item() > 0)
        return flag

    def update_started(self) -> None:
        self._update_started = time.monotonic()

    def update_done(self) -> None:
        self.update_s.append(time.monotonic() - self._update_started)

    def checkpoint_written(self, seconds: float) -> None:
        """A checkpoint took ``seconds``: the prediction of the next one, recorded for a re-run (``record``)."""
        self.checkpoint_s.append(seconds)
        if self.record is not None:
            self.record(list(self.checkpoint_s) + ([self.earlier_checkpoint_s] if self.earlier_checkpoint_s else []))

    def before_micro_batch(self, i: int, n: int) -> None:
        """Drop the update in flight when a notice came and the rest of it plus a checkpoint no longer fit.

        Raises:
            UpdateDropped: so.
        """
        if self.notice is None or not self.may_drop or not self.notice.requested or not self.update_s:
            return
        rest = (sum(self.update_s) / len(self.update_s)) * (n - i) / n
        if not self.notice.fits(FINISH_ALLOWANCE * (rest + (self.predicted_checkpoint_s() or 0.0))).fits:
            raise UpdateDropped(f"update dropped before micro-batch {i + 1} of {n}")

    def checkpoint_fit(self) -> Fit:
        """Whether the checkpoint of a stop fits in what is left (the main process decides; every process follows)."""
        assert self.notice is not None
        fit = self.notice.fits(self.predicted_checkpoint_s())
        if self.world > 1:
            from accelerate.utils import broadcast_object_list

            fit = broadcast_object_list([fit])[0]
        return fit
