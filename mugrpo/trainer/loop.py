"""The training of a stage, end to end: data, policy, resume, updates, checkpoints, publication, manifest.

:class:`Trainer` holds what lives across stages (accelerator, policy, AdamW, the algorithms' hooks); a cold train
job runs one stage with a fresh one (:func:`run_training`), a warm segment job (:mod:`mugrpo.execution.warm`) runs stage
after stage with the same one. Both call the same steps, so warm and cold execution are one algorithm. The update
loop is :mod:`mugrpo.trainer.updates`; checkpoints, publication and the commit are :mod:`mugrpo.trainer.commit`.

A re-run with the job manifest and the published policy present does nothing; otherwise it resumes from the latest
committed checkpoint with the same data order, optimizer, LR schedule, RNG and algorithm state, so on CPU its final
weights are bitwise those of an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from mugrpo.algorithms import ResumePoint, StageStart, TrainHooks, make_train_hooks, sections_of
from mugrpo.commits.manifest import latest_checkpoint, read_job_manifest
from mugrpo.commits.policies import local_policy_dir
from mugrpo.commits.tables import RolloutDataError
from mugrpo.common.progress import console
from mugrpo.common.seeds import derive_seed
from mugrpo.config import TrainSection
from mugrpo.coordination.start_gate import StartGate
from mugrpo.losses import row_inputs
from mugrpo.policy.adapters import attach_lora, is_adapter_dir, load_trainable
from mugrpo.policy.adapters import load_tokenizer as adapter_tokenizer
from mugrpo.policy.models import load_model, load_policy
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.checkpoint import LoadedCheckpoint, read_checkpoint, read_optimizer_state, restore_rng_state
from mugrpo.trainer.commit import (
    commit_training,
    finish_without_updates,
    inner_optimizer,
    publish_policy,
    set_full_optimizer_state,
    write_stage_checkpoint,
)
from mugrpo.trainer.data import RolloutSet, load_rollouts, make_minibatch_order
from mugrpo.trainer.forward import PolicyTokenLogprobs, recompute_logprobs
from mugrpo.trainer.optim import LRSchedule, build_lr_schedule, build_optimizer
from mugrpo.trainer.precision import check_fp32_master, recompute_context_fn
from mugrpo.trainer.records import delete_parts_after
from mugrpo.trainer.spec import TrainSpec
from mugrpo.trainer.stage import LivePolicy, StageRun
from mugrpo.trainer.updates import train_updates
from schemas import JobManifest


def enable_activation_checkpointing(policy) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant torch.utils.checkpoint)."""
    kwargs = {"use_reentrant": False, "context_fn": recompute_context_fn(policy)}  # same attention on recompute
    enable = getattr(policy, "activation_checkpointing_enable", None)  # transformers >= 5.x name
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class Trainer:
    """The training side of a run: one accelerator, policy, optimizer and tokenizer that live across stages.

    A cold train job builds one, trains one stage and exits (:func:`run_training`); a warm segment job
    (:mod:`mugrpo.execution.warm`) keeps one for many consecutive stages. Both run the same steps, in this order:

    - setup (:meth:`ensure_weights`): load the policy, wrap it, build AdamW (once per process), or reload the
      weights of another stage;
    - resume (:meth:`_prepare`): the stage's latest checkpoint (weights, AdamW, LR schedule, RNG), else the
      previous stage's AdamW moments and the stage's seed; then each algorithm's state (:meth:`_start_algorithms`);
    - train (:func:`mugrpo.trainer.updates.train_updates`): the stage's updates, with a checkpoint every
      ``checkpoint_every`` (:func:`mugrpo.trainer.commit.write_stage_checkpoint`);
    - publish: policies/stage=k+1, when ``spec.publish_policy``, written by the last update's checkpoint just
      before it (which then references the policy's weight files instead of copying them);
      :func:`mugrpo.trainer.commit.publish_policy` publishes afterwards only when no checkpoint did (a resume from
      a final checkpoint of format 1);
    - commit (:func:`mugrpo.trainer.commit.commit_training`): the job manifest jobs/stage=k/train.manifest.json.

    State carried between stages in memory equals what the cold path reads back from storage, bitwise: the
    weights are the fp32 tensors the cold job would load from the published safetensors, and the AdamW moments
    are those of the previous stage's final checkpoint (:attr:`optimizer_source` names it; when it is not the
    checkpoint the cold path would read, the moments are read from storage like in the cold path).
    """

    def __init__(self, mixed_precision: str = "no") -> None:
        self.accelerator = Accelerator(mixed_precision=mixed_precision)
        self.model: PolicyTokenLogprobs | None = None  # as prepared by accelerate (DDP/FSDP wrapper or itself)
        self.optimizer: torch.optim.Optimizer | None = None
        self.policy = None  # the unwrapped HF causal LM (what a warm rollout engine samples from)
        self.tokenizer = None
        #: Stage whose behavior policy the in-memory weights are (None: nothing loaded yet).
        self.weights_stage: int | None = None
        #: (stage, stage update) of the checkpoint whose AdamW state equals the in-memory one; None: fresh moments.
        self.optimizer_source: tuple[int, int] | None = None
        #: The algorithms' trainer hooks with the config section they were made for, by name (kept across stages).
        self._hooks: dict[str, tuple[Any, TrainHooks]] = {}
        #: Seconds of the current stage's behavior log-prob recompute pass: part of the job's "train" timing,
        #: listed apart in its manifest ("recompute").
        self._recompute_s = 0.0

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _build(self, policy, train: TrainSection) -> None:
        """Setup: wrap the policy, build AdamW and let accelerate prepare both (once per process)."""
        if train.gradient_checkpointing:
            enable_activation_checkpointing(policy)
        policy.train()
        model = PolicyTokenLogprobs(policy, train.logprob_chunk_size)
        optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], train)  # LoRA: adapters
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.policy = self.accelerator.unwrap_model(self.model).policy

    def _load_behavior(self, spec: TrainSpec, store: Store, behavior_dir: Path) -> tuple:
        """The behavior policy to train and its tokenizer: the full policy of ``behavior_dir``, with fresh LoRA
        adapters when ``train.lora`` asks for them (stage 0), or the adapter policy of ``behavior_dir`` on its
        base (:mod:`mugrpo.policy.adapters`)."""
        if is_adapter_dir(behavior_dir):
            return load_trainable(store, behavior_dir), adapter_tokenizer(behavior_dir)
        policy, tokenizer = load_policy(behavior_dir)  # the tokenizer read once (mugrpo.policy.models)
        if spec.train.lora is not None:
            policy = attach_lora(policy, spec.train.lora, derive_seed(spec.seed, "lora-init") % 2**32)
        return policy, tokenizer

    def _load_weights_from(self, model_dir: Path) -> None:
        """Copy the weights of the HF dir ``model_dir`` into the live policy, in place (same dtype: bitwise)."""
        fresh = load_model(model_dir)
        with torch.no_grad():
            self.policy.load_state_dict(fresh.state_dict())

    def ensure_weights(self, spec: TrainSpec) -> float:
        """Setup: make the live policy the behavior policy of ``spec.stage`` (loading the model on first use).

        Returns:
            Seconds spent (0 when the in-memory weights already are that policy).

        Raises:
            FileNotFoundError: the behavior policy ``spec.policy_dir`` is not committed.
        """
        if self.model is not None and self.weights_stage == spec.stage:
            return 0.0
        t0 = time.monotonic()
        behavior_dir = local_policy_dir(spec.store(), spec.policy_dir)
        if self.model is None:
            policy, self.tokenizer = self._load_behavior(spec, spec.store(), behavior_dir)
            self._build(policy, spec.train)
        else:
            self._load_weights_from(behavior_dir)
        self.weights_stage = spec.stage
        return time.monotonic() - t0

    def run_stage(self, spec: TrainSpec, *, origin: float | None = None) -> JobManifest:
        """Run (or resume, or skip when already committed) the training job of ``spec.stage``.

        Args:
            spec: the stage's training spec.
            origin: ``time.monotonic()`` value the job's switch time counts from: the process start for a cold
                job (the job module passes it), the call for a warm stage (default).

        Returns:
            The job manifest (``jobs/stage=k/train.manifest.json``).

        Raises:
            NonFiniteError: NaN/inf loss or gradient; the prompt ids are also written to
                :func:`mugrpo.trainer.commit.nonfinite_report_path` and no checkpoint is written for the update.
            RolloutDataError, mugrpo.commits.tables.SchemaError, mugrpo.storage.store.ChecksumError: bad rollouts, or a
                checkpoint made for other rollouts (data fingerprint differs).
            ValueError: a checkpoint made for another LR schedule.
        """
        origin = time.monotonic() if origin is None else origin
        store, layout = spec.store(), RunLayout(spec.run_id)
        done = read_job_manifest(store, spec.run_id, spec.stage, "train")
        if done is not None and (not spec.publish_policy or store.is_complete_dir(spec.output_policy_dir)):
            console.print(f"train stage {spec.stage}: already committed ({done.counts.get('updates', 0)} updates)")
            return done
        data = self._load_data(spec, store)
        hooks = self._algorithm_hooks(spec)
        if not data.rollouts:
            manifest = finish_without_updates(spec, data, hooks, origin)
            if self.weights_stage == spec.stage:  # unchanged weights: the next stage's behavior policy
                self.weights_stage = spec.stage + 1
            return manifest
        run = StageRun(spec=spec, store=store, layout=layout, data=data, hooks=hooks)
        workdir = Path(tempfile.mkdtemp(prefix=f"mugrpo-train-{spec.stage}-"))
        try:
            self._prepare(run, workdir)
            # The behavior log-prob recompute pass is a forward over this stage's rollouts: training work, so it
            # counts as T_train, not as switch (the Mu-GRPO paper's Table 1 splits T_roll/T_train/T_switch).
            t_switch = time.monotonic() - origin - self._recompute_s
            if self.accelerator.is_main_process:
                delete_parts_after(store, layout, spec.stage, run.start_step)
            t_train = self._recompute_s + train_updates(
                self._live(), run, lambda step, rows: self._checkpoint(run, step, rows)
            )
            publish_policy(self._live(), spec)
            manifest = None
            if self.accelerator.is_main_process:
                timings = {"switch": t_switch, "train": t_train, "recompute": self._recompute_s}
                timings["checkpoint"] = run.checkpoint_s
                manifest = commit_training(spec, data, hooks, start_step=run.start_step, timings=timings, origin=origin)
            self.accelerator.wait_for_everyone()
            self.weights_stage = spec.stage + 1
            return manifest
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _load_data(self, spec: TrainSpec, store: Store) -> RolloutSet:
        """The stage's training rollouts (:func:`mugrpo.trainer.data.load_rollouts`)."""
        data = load_rollouts(
            store,
            spec.run_id,
            spec.rollout_stages,
            skip_zero_variance_groups=spec.train.skip_zero_variance_groups,
            row_inputs=row_inputs(spec.loss),
        )
        acc = self.accelerator
        if acc.is_main_process:
            console.print(
                f"train stage {spec.stage}: rollouts {data.counts}; {acc.num_processes} process(es) "
                f"({acc.distributed_type.value}) on {acc.device}"
            )
        return data

    def _algorithm_hooks(self, spec: TrainSpec) -> dict[str, TrainHooks]:
        """The trainer hooks of the algorithms on in ``spec``; one made for an earlier stage with the same section
        is kept (it may cache what later stages reuse)."""
        sections = sections_of(spec, "train")
        hooks = {}
        for name, made in make_train_hooks(sections, spec.loss).items():
            kept = self._hooks.get(name)
            if kept is None or kept[0] != sections[name]:
                kept = self._hooks[name] = (sections[name], made)
            hooks[name] = kept[1]
        return hooks

    def _live(self) -> LivePolicy:
        return LivePolicy(self.accelerator, self.model, self.optimizer, self.policy, self.tokenizer)

    def _prepare(self, run: StageRun, workdir: Path) -> None:
        """Setup and resume of a stage with rollouts to train on: resume point, weights, AdamW, LR schedule and
        RNG, the algorithms' state, the reference policy."""
        spec, train = run.spec, run.spec.train
        run.order = make_minibatch_order(
            run.data,
            rollouts_per_update=train.rollouts_per_update,
            group_minibatches=train.group_minibatches,
            seed=derive_seed(spec.seed, spec.stage, "train-data-order"),
        )
        run.start_step, ckpt = self._latest_checkpoint(run, workdir)
        run.trainer_behavior = self._setup_weights(spec, run.store, run.data, run.order, ckpt)
        run.schedule = self._resume(spec, run.store, run.layout, ckpt)
        check_fp32_master(self.model.parameters(), self.optimizer)
        self._start_algorithms(run, ckpt)
        if spec.loss.kl_coef > 0:
            ref_policy = load_model(local_policy_dir(run.store, spec.reference_policy_dir))
            reference = PolicyTokenLogprobs(ref_policy.requires_grad_(False), train.logprob_chunk_size)
            run.reference = reference.to(self.accelerator.device).eval()

    def _latest_checkpoint(self, run: StageRun, workdir: Path) -> tuple[int, LoadedCheckpoint | None]:
        """Resume point: (latest committed stage update, its checkpoint) or (0, None).

        Raises:
            RolloutDataError: the checkpoint was made for other rollouts (data fingerprint differs).
        """
        spec, store, layout = run.spec, run.store, run.layout
        start_step = latest_checkpoint(store, layout, spec.stage)
        if start_step is None:
            return 0, None
        ckpt = read_checkpoint(store, layout.checkpoint_dir(spec.stage, start_step), workdir / "resume")
        if ckpt.trainer_state["data_fingerprint"] != run.data.fingerprint:
            raise RolloutDataError(
                f"checkpoint {store.uri(layout.checkpoint_dir(spec.stage, start_step))} was made for other "
                "rollouts (data fingerprint differs); delete the stage's checkpoints to start over"
            )
        return start_step, ckpt

    def _start_algorithms(self, run: StageRun, ckpt: LoadedCheckpoint | None) -> None:
        """Resume of the algorithms on in the stage: each restores its state from the checkpoint, else from the
        previous stage's commit (:meth:`mugrpo.algorithms.TrainHooks.start`)."""
        spec, store, layout = run.spec, run.store, run.layout
        resume = None
        if ckpt is not None:
            folder = layout.checkpoint_dir(spec.stage, ckpt.step)
            resume = ResumePoint(
                ckpt.step, ckpt.trainer_state, ckpt.extra_file, lambda name: store.uri(f"{folder}/{name}")
            )
        ctx = StageStart(
            store=store,
            layout=layout,
            stage=spec.stage,
            seed=spec.seed,
            rollout_stages=spec.rollout_stages,
            rollouts=run.data.rollouts,
            load_rollouts=lambda k: load_rollouts(store, spec.run_id, [k], skip_zero_variance_groups=False).rollouts,
            resume=resume,
            is_main=self.accelerator.is_main_process,
        )
        for hooks in run.hooks.values():
            hooks.start(ctx)

    def _setup_weights(
        self, spec: TrainSpec, store: Store, data: RolloutSet, order, ckpt: LoadedCheckpoint | None
    ) -> list[torch.Tensor] | None:
        """Setup and resume of the weights: the behavior policy first (the trainer's behavior log-probs come
        from it, also on resume), then the checkpoint's weights when resuming. Returns the trainer's behavior
        log-probs for truncated IS (``loss.tis_cap``), or None; the recompute pass's seconds go to
        ``self._recompute_s`` (training time in the job manifest's timings, not switch)."""
        train, device = spec.train, self.accelerator.device
        cold = self.model is None
        if cold:
            behavior_dir = local_policy_dir(store, spec.policy_dir)
            behavior, self.tokenizer = self._load_behavior(spec, store, behavior_dir)
        else:
            self.ensure_weights(spec)
            behavior = self.policy
        trainer_behavior: list[torch.Tensor] | None = None
        self._recompute_s = 0.0
        if train.recompute_behavior_logprobs or spec.loss.tis_cap is not None:
            t0 = time.monotonic()
            trainer_behavior = self._recompute_behavior(spec, data, order, behavior, device)
            self._recompute_s = time.monotonic() - t0
        if cold:
            if ckpt is None:
                policy = behavior
            elif is_adapter_dir(ckpt.model_dir):  # LoRA: the checkpoint's adapter on the same base
                policy = load_trainable(store, ckpt.model_dir)
            else:
                policy = load_model(ckpt.model_dir)
            self._build(policy, train)
        else:
            if ckpt is not None:
                self._load_weights_from(ckpt.model_dir)
            self.policy.train()
        self.weights_stage = spec.stage
        return trainer_behavior

    def _recompute_behavior(self, spec: TrainSpec, data: RolloutSet, order, behavior, device) -> list | None:
        """The trainer's behavior log-probs of the rollouts the stage's updates draw (the others keep the
        engine's, never read): written into the rollouts with ``recompute_behavior_logprobs`` (returns None),
        else returned for truncated IS."""
        train = spec.train
        behavior_policy = PolicyTokenLogprobs(behavior.to(device).eval(), train.logprob_chunk_size)
        # Under the training forward's autocast, so the update-1 ratio is exactly 1 (mugrpo.trainer.precision).
        needed = sorted({i for u in range(train.updates_per_stage) for i in order.minibatch(u)})
        subset = dataclasses.replace(data, rollouts=[data.rollouts[i] for i in needed])
        with self.accelerator.autocast():
            recomputed = recompute_logprobs(behavior_policy, subset, train.micro_batch_size, self.pad_id, device)
        trainer_behavior = [torch.tensor(r.behavior_logprobs, dtype=torch.float32) for r in data.rollouts]
        for i, logprobs in zip(needed, recomputed, strict=True):
            trainer_behavior[i] = logprobs
        if not train.recompute_behavior_logprobs:
            return trainer_behavior
        data.rollouts = [  # the engine's log-probs stay alongside: the health panel measures against the sampler
            dataclasses.replace(r, behavior_logprobs=lp.tolist(), sampler_logprobs=r.behavior_logprobs)
            for r, lp in zip(data.rollouts, trainer_behavior, strict=True)
        ]
        return None

    def _resume(self, spec: TrainSpec, store: Store, layout: RunLayout, ckpt: LoadedCheckpoint | None) -> LRSchedule:
        """Resume: AdamW state, LR schedule and RNG from the stage's checkpoint; at a stage's start instead the
        stage's seed and the previous stage's final AdamW moments (``carry_optimizer_state``) or fresh ones.
        Returns the LR schedule."""
        accelerator, inner = self.accelerator, inner_optimizer(self.optimizer)
        schedule = build_lr_schedule(spec.train, spec.total_updates)
        if ckpt is not None:
            set_full_optimizer_state(self.model, inner, ckpt.optimizer_state)
            schedule.load_state_dict(ckpt.trainer_state["lr_schedule"])
            restore_rng_state(ckpt.rng_states[accelerator.process_index])
            self.optimizer_source = (spec.stage, ckpt.step)
            console.print(
                f"train stage {spec.stage}: resuming after update {ckpt.step} of {spec.train.updates_per_stage}"
            )
            return schedule
        set_seed(derive_seed(spec.seed, spec.stage, "train-rng") % 2**32)
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
            if self.optimizer_source != (spec.stage - 1, previous):
                prev_rel = layout.checkpoint_dir(spec.stage - 1, previous)
                set_full_optimizer_state(self.model, inner, read_optimizer_state(store, prev_rel))
                console.print(f"train stage {spec.stage}: AdamW moments carried over from {store.uri(prev_rel)}")
            else:
                console.print(f"train stage {spec.stage}: AdamW moments carried over in memory")
            self.optimizer_source = (spec.stage - 1, previous)
        else:
            inner.state.clear()  # what a freshly built AdamW holds: moments are created at the first step
            self.optimizer_source = None
        return schedule

    def _checkpoint(self, run: StageRun, step: int, rows: list[dict]) -> None:
        """Checkpoint of ``step`` (:func:`mugrpo.trainer.commit.write_stage_checkpoint`); the in-memory AdamW
        state is then that checkpoint's."""
        write_stage_checkpoint(self._live(), run, step, rows)
        self.optimizer_source = (run.spec.stage, step)


def run_training(spec: TrainSpec, *, origin: float | None = None, gate: StartGate | None = None) -> JobManifest:
    """The cold train job: a fresh :class:`Trainer` runs (or resumes, or skips) stage ``spec.stage``. ``origin``: as
    in :meth:`Trainer.run_stage` (the job passes its process start). With a ``gate`` not yet open (a pre-started
    job: its imports and the accelerator are ready), the trainer waits at it first; the switch time counts from
    its opening.

    Raises:
        See :meth:`Trainer.run_stage`; mugrpo.coordination.start_gate.StartTimeout and
        mugrpo.coordination.lease.LeaseFenced from the gate.
    """
    trainer = Trainer(spec.train.mixed_precision)
    if gate is not None and gate.pending:
        origin = gate.wait(console.print)
    return trainer.run_stage(spec, origin=origin)
