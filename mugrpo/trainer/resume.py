"""Resume of a stage's training state (:func:`mugrpo.trainer.setup.setup_stage` calls these in this order): the
resume point, then AdamW, the LR schedule and the RNG, then the algorithms' state.

A stage resumes from its latest committed checkpoint with the same data order, AdamW state, LR schedule, RNG and
algorithm state, so on CPU its final weights are bitwise those of an uninterrupted run; at a stage's start it takes
the stage's seed and, with ``carry_optimizer_state``, the previous stage's final AdamW moments.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from accelerate.utils import set_seed

from mugrpo.algorithms import ResumePoint, StageStart, TrainHooks
from mugrpo.commits.manifest import latest_checkpoint, read_job_manifest
from mugrpo.commits.tables import RolloutDataError
from mugrpo.common.progress import console
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.checkpoint import LoadedCheckpoint, read_checkpoint, read_optimizer_state, restore_rng_state
from mugrpo.trainer.commit import inner_optimizer, set_full_optimizer_state
from mugrpo.trainer.data import RolloutSet, load_rollouts
from mugrpo.trainer.optim import LRSchedule, build_lr_schedule
from mugrpo.trainer.spec import TrainSpec


def resume_point(
    spec: TrainSpec, store: Store, layout: RunLayout, data: RolloutSet, workdir: Path
) -> tuple[int, LoadedCheckpoint | None]:
    """(latest committed stage update, its checkpoint read into ``workdir``) or (0, None).

    Raises:
        RolloutDataError: the checkpoint was made for other rollouts (data fingerprint differs).
    """
    start_step = latest_checkpoint(store, layout, spec.stage)
    if start_step is None:
        return 0, None
    ckpt = read_checkpoint(store, layout.checkpoint_dir(spec.stage, start_step), workdir / "resume")
    if ckpt.trainer_state["data_fingerprint"] != data.fingerprint:
        raise RolloutDataError(
            f"checkpoint {store.uri(layout.checkpoint_dir(spec.stage, start_step))} was made for other "
            "rollouts (data fingerprint differs); delete the stage's checkpoints to start over"
        )
    return start_step, ckpt


def resume_optimizer(
    resident, spec: TrainSpec, store: Store, layout: RunLayout, ckpt: LoadedCheckpoint | None, seed: int
) -> LRSchedule:
    """AdamW state, LR schedule and RNG from the stage's checkpoint; at a stage's start instead the stage's RNG
    ``seed`` and the previous stage's final AdamW moments (``carry_optimizer_state``) or fresh ones. Sets
    ``resident.optimizer_source`` (``resident``: the process's :class:`mugrpo.trainer.setup.Resident`, prepared);
    returns the LR schedule.

    Raises:
        ValueError: a checkpoint made for another LR schedule.
        RuntimeError: ``carry_optimizer_state`` and the previous stage's train job has not committed.
        mugrpo.commits.retention.OptimizerStatePruned: the moments to carry over were pruned
            (``train.keep_optimizer_state``); fresh ones are never taken silently in their place.
    """
    accelerator, inner = resident.accelerator, inner_optimizer(resident.optimizer)
    schedule = build_lr_schedule(spec.train, spec.total_updates)
    if ckpt is not None:
        set_full_optimizer_state(resident.model, inner, ckpt.optimizer_state)
        schedule.load_state_dict(ckpt.trainer_state["lr_schedule"])
        restore_rng_state(ckpt.rng_states[accelerator.process_index])
        resident.optimizer_source = (spec.stage, ckpt.step)
        console.print(f"train stage {spec.stage}: resuming after update {ckpt.step} of {spec.train.updates_per_stage}")
        return schedule
    set_seed(seed)
    if (
        spec.carry_optimizer_state
        and spec.stage > 0
        and read_job_manifest(store, spec.run_id, spec.stage - 1, "train") is None
    ):
        # its final checkpoint (the moments carried over) may still be being written (mugrpo.execution.pipeline)
        raise RuntimeError(
            f"train stage {spec.stage}: the train job of stage {spec.stage - 1} has not committed "
            f"({store.uri(layout.job_manifest(spec.stage - 1, 'train'))} is missing): its final checkpoint holds "
            f"the AdamW moments this stage starts from; run stage {spec.stage - 1}'s training first"
        )
    previous = latest_checkpoint(store, layout, spec.stage - 1) if spec.stage > 0 else None
    if spec.carry_optimizer_state and previous is not None:
        if resident.optimizer_source != (spec.stage - 1, previous):
            prev_rel = layout.checkpoint_dir(spec.stage - 1, previous)
            set_full_optimizer_state(resident.model, inner, read_optimizer_state(store, prev_rel))
            console.print(f"train stage {spec.stage}: AdamW moments carried over from {store.uri(prev_rel)}")
        else:
            console.print(f"train stage {spec.stage}: AdamW moments carried over in memory")
        resident.optimizer_source = (spec.stage - 1, previous)
    else:
        inner.state.clear()  # what a freshly built AdamW holds: moments are created at the first step
        resident.optimizer_source = None
    return schedule


def start_algorithms(
    hooks: Mapping[str, TrainHooks],
    spec: TrainSpec,
    store: Store,
    layout: RunLayout,
    data: RolloutSet,
    ckpt: LoadedCheckpoint | None,
    is_main: bool,
) -> None:
    """Each algorithm on in the stage restores its state from the checkpoint, else from the previous stage's commit
    (:meth:`mugrpo.algorithms.TrainHooks.start`)."""
    resume = None
    if ckpt is not None:
        folder = layout.checkpoint_dir(spec.stage, ckpt.step)
        resume = ResumePoint(ckpt.step, ckpt.trainer_state, ckpt.extra_file, lambda name: store.uri(f"{folder}/{name}"))
    ctx = StageStart(
        store=store,
        layout=layout,
        stage=spec.stage,
        seed=spec.seed,
        rollout_stages=spec.rollout_stages,
        rollouts=data.rollouts,
        load_rollouts=lambda k: load_rollouts(store, spec.run_id, [k], skip_zero_variance_groups=False).rollouts,
        resume=resume,
        is_main=is_main,
    )
    for h in hooks.values():
        h.start(ctx)
