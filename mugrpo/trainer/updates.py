"""The update loop of a stage: updates ``start_step + 1 .. updates_per_stage``, each one composed, trained and
recorded in this order, with a checkpoint every ``train.checkpoint_every`` updates and after the last one.

    compose    the minibatch of the data order, plus the rollouts the algorithms add (TrainHooks.compose), each
               added rollout its own group; cut into this rank's micro-batches and collated
    inputs     per-rollout loss inputs from the algorithms (TrainHooks.before_update), e.g. clip ranges
    step       one optimizer update (:func:`mugrpo.trainer.step.train_update`) at the LR schedule's lr
    record     the algorithms' columns and metrics (TrainHooks.after_update), then the update's train_steps row
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from mugrpo.algorithms import TrainHooks, UpdateRows
from mugrpo.common.faults import fault_pause
from mugrpo.common.progress import console, job_progress
from mugrpo.losses import training_progress
from mugrpo.losses.inputs import input_tensor
from mugrpo.trainer.batch import TokenBatch, collate
from mugrpo.trainer.checkpoint import capture_rng_state, restore_rng_state
from mugrpo.trainer.commit import write_nonfinite_report
from mugrpo.trainer.data import Rollout, split_minibatch, update_statistics
from mugrpo.trainer.health import batch_identity
from mugrpo.trainer.preemption import Preempted, StopPolicy
from mugrpo.trainer.records import train_step_row
from mugrpo.trainer.stage import StageRun
from mugrpo.trainer.step import NonFiniteError, UpdateDropped, UpdateResult, token_mean_entropy, train_update


@dataclass
class Update:
    """One update on this rank.

    Attributes:
        rows: what the algorithms see of it.
        indices: row indices (into ``data.rollouts``) of its fresh minibatch.
        num_rows: rollouts of the stage's data: an added rollout's row index is ``num_rows + j``.
        rollouts: fresh then added rollouts (every rank's).
        micro: this rank's micro-batches as row indices; added rollouts come after the stage's rows.
        batches: the collated micro-batches.
        tis: per micro-batch, the trainer's behavior log-probs [B, R] for truncated IS, or None.
    """

    rows: UpdateRows
    indices: list[int]
    num_rows: int
    rollouts: list[Rollout]
    micro: list[list[int]]
    batches: list[TokenBatch]
    tis: list[torch.Tensor] | None


def _pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    padded = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, row in enumerate(rows):
        padded[i, : row.numel()] = row
    return padded


def compose_update(run: StageRun, u: int) -> Update:
    """Stage update ``u``'s rollouts and this rank's micro-batches: the fresh minibatch of the data order plus the
    rollouts the algorithms add (each its own group, with the behavior log-probs and advantage of its own row)."""
    spec, data, plan, acc = run.spec, run.data, run.plan, run.model.accelerator
    indices = plan.order.minibatch(u - 1)
    fresh = [data.rollouts[i] for i in indices]
    rows = UpdateRows(update=spec.policy_version + u, stage_update=u, fresh=fresh)
    extra = [r for hooks in run.hooks.values() for r in hooks.compose(rows)]
    num_rows, num_groups = len(data.rollouts), len(data.groups)
    micro = split_minibatch(
        indices + list(range(num_rows, num_rows + len(extra))),
        data,
        micro_batch_size=spec.train.micro_batch_size,
        rank=acc.process_index,
        world_size=acc.num_processes,
        keep_groups=spec.train.group_minibatches,
    )
    batches = [
        collate(
            [data.rollouts[i] if i < num_rows else extra[i - num_rows] for i in mb],
            [plan.group_of[i] if i < num_rows else num_groups + i - num_rows for i in mb],
            run.model.pad_id,
            learner_temperature=spec.train.learner_temperature,
        )
        for mb in micro
    ]
    tis = None
    if plan.trainer_behavior is not None:
        tis = [
            _pad_rows([plan.trainer_behavior[i] for i in mb], b.response_ids.shape[1])
            for mb, b in zip(micro, batches, strict=True)
        ]
    entropy = functools.partial(token_mean_entropy, acc, run.model.module, batches)  # computed if an algorithm asks
    rows = UpdateRows(rows.update, u, fresh, extra, policy_entropy=entropy)
    return Update(rows, indices, num_rows, fresh + extra, micro, batches, tis)


def apply_update_inputs(hooks: Mapping[str, TrainHooks], update: Update) -> None:
    """The algorithms' per-rollout loss inputs of the update (:class:`~mugrpo.algorithms.UpdateInputs`), set by
    name on its micro-batches' ``inputs``.

    Raises:
        ValueError: two algorithms (or an algorithm and a rollout input) set the same input, or one gives a value
            count other than the update's.
    """
    values: dict[str, list] = {}
    for name, h in hooks.items():
        inputs = h.before_update(update.rows)
        for key, given in ({} if inputs is None else inputs.values).items():
            if key in values or any(key in b.inputs for b in update.batches):
                raise ValueError(f"algorithm {name} sets the loss input {key!r}, which another provider sets too")
            if len(given) != len(update.rollouts):
                raise ValueError(f"algorithm {name} gave {len(given)} {key} values for {len(update.rollouts)} rollouts")
            values[key] = list(given)
    if not values:
        return
    position = {i: p for p, i in enumerate(update.indices)}
    for mb, batch in zip(update.micro, update.batches, strict=True):
        at = [position[i] if i < update.num_rows else len(update.indices) + i - update.num_rows for i in mb]
        for key, given in values.items():
            batch.inputs[key] = input_tensor([given[p] for p in at], key)


def run_update(run: StageRun, update: Update, stops: StopPolicy | None = None) -> UpdateResult:
    """The optimizer update (:func:`mugrpo.trainer.step.train_update`); ``stops`` may drop it between micro-batches
    on a preemption notice (:meth:`mugrpo.trainer.preemption.StopPolicy.before_micro_batch`).

    Raises:
        NonFiniteError: NaN/inf loss or gradient; the main process first writes the nonfinite report
            (:func:`mugrpo.trainer.commit.write_nonfinite_report`).
        UpdateDropped: ``stops`` dropped the update (no optimizer step).
    """
    spec, u, acc = run.spec, update.rows.stage_update, run.model.accelerator
    try:
        return train_update(
            acc,
            run.model.module,
            run.optimizer.optimizer,
            update.batches,
            spec.loss,
            global_num_tokens=sum(r.num_tokens for r in update.rollouts),
            global_num_seqs=sum(1 for r in update.rollouts if r.num_tokens),
            max_grad_norm=spec.train.max_grad_norm,
            max_response_len=spec.max_response_len,
            reference=run.model.reference,
            trainer_behavior_logprobs=update.tis,
            update_statistics=update_statistics(
                [run.data.rollouts[i] for i in update.indices], [run.plan.group_of[i] for i in update.indices]
            ),
            progress=training_progress(spec.policy_version + u - 1, spec.total_updates),
            before_micro_batch=None if stops is None else stops.before_micro_batch,
        )
    except NonFiniteError as e:
        if acc.is_main_process:
            prompt_ids = sorted({r.prompt_id for r in update.rollouts})
            write_nonfinite_report(run.store, run.layout, spec, u, e, prompt_ids)
        raise


def record_update(run: StageRun, update: Update, result: UpdateResult, lr: float) -> dict:
    """The algorithms record the update (their metrics join the loss's); returns its train_steps row, with the
    health panel: the token panel of the update (:mod:`mugrpo.trainer.health`), s_eta = staleness * lr,
    t_eta = sum of the LR schedule's lr over global updates 1..update (from the schedule, so a resumed run has the
    uninterrupted run's value) and the batch identity."""
    spec, fresh = run.spec, list(update.rows.fresh)
    columns: dict = {}
    for h in run.hooks.values():
        record = h.after_update(update.rows, result.metrics)
        columns.update(record.columns)
        result.metrics.update(record.metrics)
    staleness = update.rows.update - 1 - min(r.policy_version for r in fresh)
    health = {
        **result.health,
        "s_eta": staleness * lr,
        "t_eta": run.optimizer.schedule.cumulative_lr(update.rows.update),
        "batch_id": batch_identity(update.rollouts),
    }
    return train_step_row(
        run_id=spec.run_id,
        stage=spec.stage,
        stage_update=update.rows.stage_update,
        policy_version=spec.policy_version,
        metrics=result.metrics,
        grad_norm=result.grad_norm,
        lr=lr,
        num_sequences=len(update.rollouts),
        num_tokens=result.num_tokens,
        seconds=result.seconds,
        staleness=staleness,
        mean_reward=sum(r.reward for r in fresh) / len(fresh),
        columns=columns,
        health=health,
    )


def train_updates(
    run: StageRun, checkpoint: Callable[[int, list[dict]], None], stops: StopPolicy | None = None
) -> tuple[float, float]:
    """Train: updates ``run.plan.start_step + 1 .. updates_per_stage``; ``checkpoint(step, rows)`` commits the rows
    since the last checkpoint with the checkpoint of ``step``. Reads only ``run``. Returns the loop's seconds and,
    of them, the checkpoints' seconds.

    With ``stops`` watching a preemption notice, the loop stops at the first safe point after the notice, saves
    what fits (:mod:`mugrpo.trainer.preemption`) and raises :class:`~mugrpo.trainer.preemption.Preempted`.

    Raises:
        Preempted: a preemption notice stopped the loop (after the checkpoint that fitted, if any).
        NonFiniteError: see :func:`run_update`.
    """
    spec, main, start = run.spec, run.model.accelerator.is_main_process, run.plan.start_step
    total, every = spec.train.updates_per_stage, spec.train.checkpoint_every
    optimizer, schedule = run.optimizer.optimizer, run.optimizer.schedule
    stops = stops or StopPolicy(None, run.model.accelerator, may_drop=False)
    pending: list[dict] = []
    saved = start
    t0, checkpoint_s = time.monotonic(), 0.0

    def save(u: int) -> None:
        nonlocal pending, saved, checkpoint_s
        c0 = time.monotonic()
        checkpoint(u, pending)
        checkpoint_s += time.monotonic() - c0
        stops.checkpoint_written(time.monotonic() - c0)
        pending, saved = [], u

    def stop(done: int, dropped: bool) -> Preempted:
        fit = None
        if done > saved:
            fit = stops.checkpoint_fit()
            if fit.fits:
                save(done)
        assert stops.notice is not None
        return Preempted(spec.stage, done, saved, total, dropped, fit, stops.notice.signal_name or "SIGTERM")

    fields = "loss {task.fields[loss]:+.4f}  {task.fields[tps]:.0f} tok/s"
    with job_progress(f"train stage {spec.stage}", "updates", fields, console, disable=not main) as bar:
        task = bar.add_task("train", total=total, completed=start, loss=0.0, tps=0.0)
        for u in range(start + 1, total + 1):
            if stops.stop_requested():  # a safe point: nothing of update u has started
                raise stop(u - 1, dropped=False)
            stops.update_started()
            rng = capture_rng_state() if stops.may_drop else None
            update = compose_update(run, u)
            lr = schedule.apply(optimizer, spec.policy_version + u)
            apply_update_inputs(run.hooks, update)
            fault_pause(f"train/stage={spec.stage}/update={u}")
            try:
                result = run_update(run, update, stops)
            except UpdateDropped:
                restore_rng_state(rng)
                raise stop(u - 1, dropped=True) from None
            stops.update_done()
            pending.append(record_update(run, update, result, lr))
            bar.update(task, completed=u, loss=result.metrics.get("loss", 0.0), tps=pending[-1]["tokens_per_second"])
            if u % every == 0 or u == total:
                save(u)
            elif stops.stop_requested():  # the update in flight ran to its end
                raise stop(u, dropped=False)
    return time.monotonic() - t0, checkpoint_s
