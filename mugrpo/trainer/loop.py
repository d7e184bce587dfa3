"""The training of a stage, end to end: skip when committed, data, setup, updates, publication, manifest.

:class:`Trainer` is the process's :class:`~mugrpo.trainer.setup.Resident` (accelerator, policy, AdamW, the
algorithms' hooks) with the stage lifecycle; a cold train job runs one stage with a fresh one
(:func:`run_training`), a warm segment job (:mod:`mugrpo.execution.warm`) runs stage after stage with the same one.
Both call the same steps, so warm and cold execution are one algorithm. Setup is
:func:`mugrpo.trainer.setup.setup_stage`; the update loop is :mod:`mugrpo.trainer.updates`; checkpoints,
publication and the commit are :mod:`mugrpo.trainer.commit`.

A re-run with the job manifest and the published policy present does nothing; otherwise it resumes from the latest
committed checkpoint with the same data order, optimizer, LR schedule, RNG and algorithm state, so on CPU its final
weights are bitwise those of an uninterrupted run.
"""

from __future__ import annotations

import shutil
import time

from mugrpo.commits.manifest import read_job_manifest
from mugrpo.common.preemption import PreemptionNotice
from mugrpo.common.progress import console
from mugrpo.common.scratch import scratch_dir
from mugrpo.coordination.start_gate import StartGate
from mugrpo.trainer.commit import commit_training, finish_without_updates, publish_policy, write_stage_checkpoint
from mugrpo.trainer.preemption import (
    Preempted,
    StopPolicy,
    earlier_checkpoint_s,
    record_checkpoint_seconds,
    write_preemption_record,
)
from mugrpo.trainer.records import delete_parts_after
from mugrpo.trainer.setup import Resident, load_stage_data, setup_stage
from mugrpo.trainer.spec import TrainSpec
from mugrpo.trainer.stage import StageRun
from mugrpo.trainer.updates import train_updates
from schemas import JobManifest


class Trainer(Resident):
    """The training side of a run: a :class:`~mugrpo.trainer.setup.Resident` that runs stages. A cold train job
    builds one, trains one stage and exits (:func:`run_training`); a warm segment job (:mod:`mugrpo.execution.warm`)
    keeps one for many consecutive stages. Both run the same steps, in this order:

    - setup (:func:`mugrpo.trainer.setup.setup_stage`): data order, resume point, weights, AdamW, LR schedule,
      RNG, precision, the algorithms' state, the reference policy, as one frozen :class:`StageRun`;
    - train (:func:`mugrpo.trainer.updates.train_updates`): the stage's updates, with a checkpoint every
      ``checkpoint_every`` (:func:`mugrpo.trainer.commit.write_stage_checkpoint`);
    - publish: policies/stage=k+1, when ``spec.publish_policy``, written by the last update's checkpoint just
      before it (which then references the policy's weight files instead of copying them);
      :func:`mugrpo.trainer.commit.publish_policy` publishes afterwards only when no checkpoint did (a resume from
      a final checkpoint of format 1);
    - commit (:func:`mugrpo.trainer.commit.commit_training`): the job manifest jobs/stage=k/train.manifest.json.

    State carried between stages in memory equals what the cold path reads back from storage, bitwise
    (:class:`~mugrpo.trainer.setup.Resident`).
    """

    def run_stage(
        self, spec: TrainSpec, *, origin: float | None = None, notice: PreemptionNotice | None = None
    ) -> JobManifest:
        """Run (or resume, or skip when already committed) the training job of ``spec.stage``.

        Args:
            spec: the stage's training spec.
            origin: ``time.monotonic()`` value the job's switch time counts from: the process start for a cold
                job (the job module passes it), the call for a warm stage (default).
            notice: the job's preemption notice; on it the stage stops at the next safe point and saves what fits
                in the grace (:mod:`mugrpo.trainer.preemption`). None: not watched.

        Returns:
            The job manifest (``jobs/stage=k/train.manifest.json``).

        Raises:
            NonFiniteError: NaN/inf loss or gradient; the prompt ids are also written to
                :func:`mugrpo.trainer.commit.nonfinite_report_path` and no checkpoint is written for the update.
            RolloutDataError, mugrpo.commits.tables.SchemaError, mugrpo.storage.store.ChecksumError: bad rollouts, or a
                checkpoint made for other rollouts (data fingerprint differs).
            ValueError: a checkpoint made for another LR schedule.
            Preempted: the notice stopped the stage; ``jobs/stage=k/train.preempted.json`` says what was saved.
        """
        origin = time.monotonic() if origin is None else origin
        store, layout = spec.store(), spec.layout
        done = read_job_manifest(store, spec.run_id, spec.stage, "train")
        if done is not None and (not spec.publish_policy or store.is_complete_dir(spec.output_policy_dir)):
            console.print(f"train stage {spec.stage}: already committed ({done.counts.get('updates', 0)} updates)")
            return done
        data = load_stage_data(spec, self.accelerator)
        hooks = self.train_hooks(spec)
        if not data.rollouts:
            manifest = finish_without_updates(spec, data, hooks, origin)
            if self.weights_stage == spec.stage:  # unchanged weights: the next stage's behavior policy
                self.weights_stage = spec.stage + 1
            return manifest
        workdir = scratch_dir(f"train-{spec.stage}")
        try:
            run = setup_stage(spec, data=data, hooks=hooks, resident=self, workdir=workdir)
            # The behavior log-prob recompute pass is a forward over this stage's rollouts: training work, so it
            # counts as T_train, not as switch (the Mu-GRPO paper's Table 1 splits T_roll/T_train/T_switch).
            t_switch = time.monotonic() - origin - run.recompute_s
            if self.accelerator.is_main_process:
                delete_parts_after(store, layout, spec.stage, run.plan.start_step)
            if notice is not None:  # from here the job stops at the update loop's safe points and saves
                notice.stop_interrupting()
            stops = StopPolicy(
                notice,
                self.accelerator,
                may_drop=not any(type(h).compose_changes_state for h in hooks.values()),
                earlier_checkpoint_s=earlier_checkpoint_s(store, layout, spec) if notice is not None else None,
                record=(
                    (lambda seconds: record_checkpoint_seconds(store, layout, spec.stage, seconds))
                    if notice is not None and self.accelerator.is_main_process
                    else None
                ),
            )
            try:
                t_loop, t_checkpoint = train_updates(run, lambda step, rows: self._checkpoint(run, step, rows), stops)
            except Preempted as stop:
                if self.accelerator.is_main_process:
                    write_preemption_record(store, layout, stop)
                raise
            publish_policy(run.live, spec)
            manifest = None
            if self.accelerator.is_main_process:
                timings = {"switch": t_switch, "train": run.recompute_s + t_loop, "recompute": run.recompute_s}
                timings["checkpoint"] = t_checkpoint
                manifest = commit_training(
                    spec, data, hooks, start_step=run.plan.start_step, timings=timings, origin=origin
                )
            self.accelerator.wait_for_everyone()
            self.weights_stage = spec.stage + 1
            return manifest
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _checkpoint(self, run: StageRun, step: int, rows: list[dict]) -> None:
        """Checkpoint of ``step`` (:func:`mugrpo.trainer.commit.write_stage_checkpoint`); the in-memory AdamW
        state is then that checkpoint's."""
        write_stage_checkpoint(run, step, rows)
        self.optimizer_source = (run.spec.stage, step)


def run_training(
    spec: TrainSpec,
    *,
    origin: float | None = None,
    gate: StartGate | None = None,
    notice: PreemptionNotice | None = None,
) -> JobManifest:
    """The cold train job: a fresh :class:`Trainer` runs (or resumes, or skips) stage ``spec.stage``. ``origin``: as
    in :meth:`Trainer.run_stage` (the job passes its process start). With a ``gate`` not yet open (a pre-started
    job: its imports and the accelerator are ready), the trainer waits at it first; the switch time counts from
    its opening. ``notice``: as in :meth:`Trainer.run_stage`.

    Raises:
        See :meth:`Trainer.run_stage`; mugrpo.coordination.start_gate.StartTimeout and
        mugrpo.coordination.lease.LeaseFenced from the gate.
    """
    trainer = Trainer(spec.train.mixed_precision)
    if gate is not None and gate.pending:
        origin = gate.wait(console.print)
    return trainer.run_stage(spec, origin=origin, notice=notice)
