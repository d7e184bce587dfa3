"""The training of a stage, end to end: data, policy, resume, updates, checkpoints, publication, manifest.

:class:`Trainer` holds what lives across stages (accelerator, policy, AdamW); a cold train job runs one stage with a
fresh one (:func:`run_training`), a warm segment job (:mod:`mugrpo.jobs.segment`) runs stage after stage with the
same one. Both call the same steps, so warm and cold execution are one algorithm.

Order of commits (each step's files are complete before the next one starts)::

    per checkpoint n:  train_steps part n  ->  checkpoints/stage=k/step=n (marker last)  ->  prune older ones
    at the end:        policies/stage=k+1 (marker last; only when the spec publishes)
                       ->  jobs/stage=k/train.manifest.json (the job's commit)

A re-run with the job manifest and the published policy present does nothing; otherwise it resumes from the latest
committed checkpoint with the same data order, optimizer, LR schedule and RNG state, so on CPU its final weights
are bitwise those of an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object, set_seed
from rich.table import Table
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from mugrpo.config import TrainSection
from mugrpo.jobs.common import PROCESS_START, console, derive_seed, local_policy_dir
from mugrpo.layout import RunLayout
from mugrpo.losses import positive_labeler, training_progress
from mugrpo.manifest import read_job_manifest, write_job_manifest
from mugrpo.models import load_policy, load_tokenizer
from mugrpo.progress import job_progress
from mugrpo.replay.session import StageReplay, UpdateBatch, rollout_key
from mugrpo.replay.state import (
    CHECKPOINT_FILE,
    buffer_from_bytes,
    buffer_to_bytes,
    read_stage_buffer,
    write_stage_buffer,
)
from mugrpo.storage import COMPLETE_MARKER, Store
from mugrpo.trainer.agpo import AGPOUpdates, state_from_metrics, state_metrics
from mugrpo.trainer.batch import TokenBatch, collate
from mugrpo.trainer.checkpoint import (
    LoadedCheckpoint,
    capture_rng_state,
    latest_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    read_optimizer_state,
    restore_rng_state,
    write_checkpoint,
)
from mugrpo.trainer.data import (
    RolloutDataError,
    RolloutSet,
    load_rollouts,
    make_minibatch_order,
    split_minibatch,
    valid_groups_in,
)
from mugrpo.trainer.forward import PolicyTokenLogprobs
from mugrpo.trainer.optim import build_lr_schedule, build_optimizer
from mugrpo.trainer.precision import check_fp32_master, recompute_context_fn
from mugrpo.trainer.records import (
    delete_parts_after,
    delete_replay_parts_after,
    read_steps,
    replay_part_records,
    train_step_row,
    write_replay_part,
    write_steps_part,
)
from mugrpo.trainer.spec import TrainSpec
from mugrpo.trainer.step import NonFiniteError, train_update
from schemas import FileRecord, JobManifest

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
_POLICY_PREFIX = "policy."


def nonfinite_report_path(layout: RunLayout, stage: int) -> str:
    """Where a stopped job records the update and prompt ids of a NaN/inf minibatch."""
    return layout.job_error(stage, "train", "nonfinite")


def _policy_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded, CPU) state dict of the wrapped policy with HF parameter names (collective under FSDP)."""
    state = get_model_state_dict(model, options=_FULL)
    return {k[len(_POLICY_PREFIX) :]: v for k, v in state.items() if k.startswith(_POLICY_PREFIX)}


def enable_activation_checkpointing(policy) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant torch.utils.checkpoint)."""
    kwargs = {"use_reentrant": False, "context_fn": recompute_context_fn(policy)}  # same attention on recompute
    enable = getattr(policy, "activation_checkpointing_enable", None)  # transformers >= 5.x name
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _inner(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the real one


def _save_hf_dir(policy, state: dict[str, torch.Tensor], dest: Path, tokenizer=None) -> None:
    policy.save_pretrained(dest, state_dict=state)
    if tokenizer is not None:
        tokenizer.save_pretrained(dest)


def _copy_committed_dir(store: Store, src_rel: str, dest_rel: str, meta: dict) -> dict[str, str]:
    """Re-commit the committed folder ``src_rel`` at ``dest_rel`` (files verified, marker last)."""
    tmp = Path(tempfile.mkdtemp(prefix="mugrpo-copy-"))
    try:
        store.download_dir(src_rel, tmp)
        return store.upload_dir(tmp, dest_rel, meta=meta)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _file_records(store: Store, layout: RunLayout, rel_dir: str) -> list[FileRecord]:
    marker = store.read_json(f"{rel_dir}/{COMPLETE_MARKER}")
    return [
        FileRecord(path=layout.rel(f"{rel_dir}/{name}"), sha256=digest, bytes=store.size(f"{rel_dir}/{name}"))
        for name, digest in sorted(marker["files"].items())
    ]


@torch.no_grad()
def recompute_logprobs(
    model: PolicyTokenLogprobs, data: RolloutSet, batch_size: int, pad_token_id: int, device: torch.device
) -> list[torch.Tensor]:
    """Teacher-forced log-probs of every rollout's response under ``model`` (one [num_tokens] fp32 CPU tensor each):
    the trainer's own behavior log-probs, for ``recompute_behavior_logprobs`` and truncated IS (``loss.tis_cap``)."""
    out: list[torch.Tensor] = []
    for start in range(0, len(data.rollouts), batch_size):
        chunk = data.rollouts[start : start + batch_size]
        batch = collate(chunk, [0] * len(chunk), pad_token_id).to(device)
        logprobs, _ = model(batch, return_entropy=False)
        out.extend(logprobs[i, : r.num_tokens].float().cpu() for i, r in enumerate(chunk))
    return out


def _pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    padded = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, row in enumerate(rows):
        padded[i, : row.numel()] = row
    return padded


def _print_summary(spec: TrainSpec, steps, t_switch: float, t_train: float, t_total: float) -> None:
    table = Table(title=f"train stage {spec.stage}: {steps.num_rows} updates")
    table.add_column("metric")
    table.add_column("first", justify="right")
    table.add_column("last", justify="right")
    if steps.num_rows:
        cols = steps.to_pydict()
        for name in (
            "loss",
            "ratio_mean",
            "ratio_max",
            "clip_frac_high",
            "veto_token_frac",
            "approx_kl_behavior",
            "entropy",
            "grad_norm",
            "lr",
            "tokens_per_second",
        ):
            first, last = cols[name][0], cols[name][-1]
            table.add_row(name, "-" if first is None else f"{first:.4g}", "-" if last is None else f"{last:.4g}")
    console.print(table)
    console.print(f"timings: switch {t_switch:.1f}s, train {t_train:.1f}s, total {t_total:.1f}s")


class Trainer:
    """The training side of a run: one accelerator, policy, optimizer and tokenizer that live across stages.

    A cold train job builds one, trains one stage and exits (:func:`run_training`); a warm segment job
    (:mod:`mugrpo.jobs.segment`) keeps one for many consecutive stages. Both run the same steps, in this order:

    ==========  ==========================  ==================================================================
    step        method                      what
    ==========  ==========================  ==================================================================
    setup       :meth:`ensure_weights`      load the policy, wrap it, build AdamW (once per process), or
                                            reload weights whose stage differs from the one asked for
    resume      :meth:`_resume`             the stage's latest checkpoint (weights, AdamW, LR schedule, RNG),
                                            else the previous stage's AdamW moments and the stage's seed
    train       :meth:`_train_updates`      the stage's updates (:func:`mugrpo.trainer.step.train_update`)
    checkpoint  :meth:`_checkpoint`         train_steps part, then the checkpoint (every checkpoint_every)
    publish     :meth:`_publish`            policies/stage=k+1, when ``spec.publish_policy``
    commit      :meth:`_commit`             the job manifest jobs/stage=k/train.manifest.json
    ==========  ==========================  ==================================================================

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
        #: Rollouts the replay buffer may reference, by stage (kept across warm stages; re-read when missing).
        self._replay_rows: dict[int, dict] = {}
        #: AGPO's clip-range controller of the stage being trained (loss.name=agpo), else None.
        self._agpo: AGPOUpdates | None = None
        #: Seconds of the current stage's behavior log-prob recompute pass and of its checkpoint writes: both are
        #: parts of the job's "train" timing, listed apart in its manifest ("recompute", "checkpoint").
        self._recompute_s = 0.0
        self._checkpoint_s = 0.0

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _build(self, policy, train: TrainSection) -> None:
        """Setup: wrap the policy, build AdamW and let accelerate prepare both (once per process)."""
        if train.gradient_checkpointing:
            enable_activation_checkpointing(policy)
        policy.train()
        model = PolicyTokenLogprobs(policy, train.logprob_chunk_size)
        optimizer = build_optimizer(model.parameters(), train)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.policy = self.accelerator.unwrap_model(self.model).policy

    def _load_weights_from(self, model_dir: Path) -> None:
        """Copy the weights of the HF dir ``model_dir`` into the live policy, in place (same dtype: bitwise)."""
        fresh, _ = load_policy(model_dir)
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
        store = spec.store()
        behavior_dir = local_policy_dir(store, spec.policy_dir)
        if self.model is None:
            self.tokenizer = load_tokenizer(behavior_dir)
            policy, _ = load_policy(behavior_dir)
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
                job (:data:`mugrpo.jobs.common.PROCESS_START`), the call for a warm stage (default).

        Returns:
            The job manifest (``jobs/stage=k/train.manifest.json``).

        Raises:
            NonFiniteError: NaN/inf loss or gradient; the prompt ids are also written to
                :func:`nonfinite_report_path` and no checkpoint is written for the failed update.
            mugrpo.trainer.data.RolloutDataError, mugrpo.tables.SchemaError, mugrpo.storage.ChecksumError: bad
                rollouts.
            RolloutDataError: the stage's checkpoint was made for other rollouts (data fingerprint differs).
            ValueError: a checkpoint made for another LR schedule.
        """
        origin = time.monotonic() if origin is None else origin
        store, layout = spec.store(), RunLayout(spec.run_id)
        train = spec.train
        done = read_job_manifest(store, spec.run_id, spec.stage, "train")
        if done is not None and (not spec.publish_policy or store.is_complete_dir(spec.output_policy_dir)):
            console.print(f"train stage {spec.stage}: already committed ({done.counts.get('updates', 0)} updates)")
            return done

        accelerator = self.accelerator
        data = load_rollouts(
            store,
            spec.run_id,
            spec.rollout_stages,
            skip_zero_variance_groups=train.skip_zero_variance_groups,
            positive_label=positive_labeler(spec.loss),
        )
        if accelerator.is_main_process:
            console.print(
                f"train stage {spec.stage}: rollouts {data.counts}; {accelerator.num_processes} process(es) "
                f"({accelerator.distributed_type.value}) on {accelerator.device}"
            )
        if not data.rollouts:
            manifest = _finish_without_updates(spec, store, layout, data, origin, _previous_agpo_metrics(spec, store))
            self._replay_rows.clear()
            if self.weights_stage == spec.stage:  # unchanged weights: the next stage's behavior policy
                self.weights_stage = spec.stage + 1
            return manifest
        order = make_minibatch_order(
            data,
            rollouts_per_update=train.rollouts_per_update,
            group_minibatches=train.group_minibatches,
            seed=derive_seed(spec.seed, spec.stage, "train-data-order"),
        )
        workdir = Path(tempfile.mkdtemp(prefix=f"mugrpo-train-{spec.stage}-"))
        try:
            start_step, ckpt = self._latest_checkpoint(spec, store, layout, data, workdir)
            trainer_behavior = self._setup_weights(spec, store, data, order, ckpt)
            schedule = self._resume(spec, store, layout, ckpt)
            check_fp32_master(self.model.parameters(), self.optimizer)
            replay = self._replay_setup(spec, store, layout, data, ckpt)
            self._agpo = _agpo_updates(spec, store, ckpt)
            reference = None
            if spec.loss.kl_coef > 0:
                ref_policy, _ = load_policy(local_policy_dir(store, spec.reference_policy_dir))
                reference = PolicyTokenLogprobs(ref_policy.requires_grad_(False), train.logprob_chunk_size)
                reference = reference.to(accelerator.device).eval()
            # The behavior log-prob recompute pass is a forward over this stage's rollouts: training work, so it
            # counts as T_train, not as switch (the Mu-GRPO paper's Table 1 splits T_roll/T_train/T_switch).
            t_switch = time.monotonic() - origin - self._recompute_s

            if accelerator.is_main_process:
                delete_parts_after(store, layout, spec.stage, start_step)
                delete_replay_parts_after(store, layout, spec.stage, start_step)
            t_train = self._recompute_s + self._train_updates(
                spec, store, layout, data, order, schedule, start_step, reference, trainer_behavior, replay
            )
            self._publish(spec, store, workdir)
            manifest = self._commit(spec, store, layout, data, start_step, t_switch, t_train, origin, replay)
            self.weights_stage = spec.stage + 1
            return manifest
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _latest_checkpoint(
        self, spec: TrainSpec, store: Store, layout: RunLayout, data: RolloutSet, workdir: Path
    ) -> tuple[int, LoadedCheckpoint | None]:
        """Resume point: (latest committed stage update, its checkpoint) or (0, None)."""
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

    def _replay_setup(
        self, spec: TrainSpec, store: Store, layout: RunLayout, data: RolloutSet, ckpt: LoadedCheckpoint | None
    ) -> StageReplay | None:
        """Resume of the replay buffer (``replay.enabled``): the state of the stage's checkpoint, else the one the
        previous stage committed (empty before stage 0), with the rollouts its entries reference: this stage's,
        and those of earlier stages read by reference from their committed Parquet (cached across warm stages).

        Raises:
            ValueError: a checkpoint without a replay buffer state.
            FileNotFoundError: the previous stage committed without one.
        """
        if not spec.replay.enabled:
            return None
        if ckpt is not None:
            raw = ckpt.extra_file(CHECKPOINT_FILE)
            where = store.uri(f"{layout.checkpoint_dir(spec.stage, ckpt.step)}/{CHECKPOINT_FILE}")
            if raw is None:
                raise ValueError(f"{where} is missing: the checkpoint was written without replay.enabled")
            buffer = buffer_from_bytes(raw, spec.replay, where)
        else:
            buffer = read_stage_buffer(store, layout, spec.stage - 1, spec.replay)
        for stage in spec.rollout_stages:
            self._replay_rows[stage] = {rollout_key(r): r for r in data.rollouts if r.stage == stage}
        needed = {e.stage for e in buffer.entries} | set(spec.rollout_stages)
        for stage in sorted(needed - set(self._replay_rows)):
            older = load_rollouts(store, spec.run_id, [stage], skip_zero_variance_groups=False)
            self._replay_rows[stage] = {rollout_key(r): r for r in older.rollouts}
        for stage in set(self._replay_rows) - needed:
            del self._replay_rows[stage]
        rows = {key: r for by_key in self._replay_rows.values() for key, r in by_key.items()}
        return StageReplay(buffer, rows, derive_seed(spec.seed, "replay-draw"))

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
            self.tokenizer = load_tokenizer(behavior_dir)
            behavior, _ = load_policy(behavior_dir)
        else:
            self.ensure_weights(spec)
            behavior = self.policy
        trainer_behavior: list[torch.Tensor] | None = None
        self._recompute_s = 0.0
        if train.recompute_behavior_logprobs or spec.loss.tis_cap is not None:
            t0 = time.monotonic()
            probe = PolicyTokenLogprobs(behavior.to(device).eval(), train.logprob_chunk_size)
            # Only the rollouts this stage's updates draw; the others keep the engine's (never read). Under the
            # training forward's autocast, so the update-1 ratio is exactly 1 (mugrpo.trainer.precision).
            needed = sorted({i for u in range(train.updates_per_stage) for i in order.minibatch(u)})
            subset = dataclasses.replace(data, rollouts=[data.rollouts[i] for i in needed])
            with self.accelerator.autocast():
                recomputed = recompute_logprobs(probe, subset, train.micro_batch_size, self.pad_id, device)
            trainer_behavior = [torch.tensor(r.behavior_logprobs, dtype=torch.float32) for r in data.rollouts]
            for i, logprobs in zip(needed, recomputed, strict=True):
                trainer_behavior[i] = logprobs
            if train.recompute_behavior_logprobs:
                data.rollouts = [
                    dataclasses.replace(r, behavior_logprobs=lp.tolist())
                    for r, lp in zip(data.rollouts, trainer_behavior, strict=True)
                ]
                trainer_behavior = None
            self._recompute_s = time.monotonic() - t0
        if cold:
            policy = behavior if ckpt is None else load_policy(ckpt.model_dir)[0]
            self._build(policy, train)
        else:
            if ckpt is not None:
                self._load_weights_from(ckpt.model_dir)
            self.policy.train()
        self.weights_stage = spec.stage
        return trainer_behavior

    def _resume(self, spec: TrainSpec, store: Store, layout: RunLayout, ckpt: LoadedCheckpoint | None):
        """Resume: AdamW state, LR schedule and RNG from the stage's checkpoint; at a stage's start instead the
        stage's seed and the previous stage's final AdamW moments (``carry_optimizer_state``) or fresh ones.
        Returns the LR schedule."""
        accelerator, inner = self.accelerator, _inner(self.optimizer)
        schedule = build_lr_schedule(spec.train, spec.total_updates)
        if ckpt is not None:
            set_optimizer_state_dict(self.model, inner, ckpt.optimizer_state, options=_FULL)
            schedule.load_state_dict(ckpt.trainer_state["lr_schedule"])
            restore_rng_state(ckpt.rng_states[accelerator.process_index])
            self.optimizer_source = (spec.stage, ckpt.step)
            console.print(
                f"train stage {spec.stage}: resuming after update {ckpt.step} of {spec.train.updates_per_stage}"
            )
            return schedule
        set_seed(derive_seed(spec.seed, spec.stage, "train-rng") % 2**32)
        previous = latest_checkpoint(store, layout, spec.stage - 1) if spec.stage > 0 else None
        if spec.carry_optimizer_state and previous is not None:
            if self.optimizer_source != (spec.stage - 1, previous):
                prev_rel = layout.checkpoint_dir(spec.stage - 1, previous)
                set_optimizer_state_dict(self.model, inner, read_optimizer_state(store, prev_rel), options=_FULL)
                console.print(f"train stage {spec.stage}: AdamW moments carried over from {store.uri(prev_rel)}")
            else:
                console.print(f"train stage {spec.stage}: AdamW moments carried over in memory")
            self.optimizer_source = (spec.stage - 1, previous)
        else:
            inner.state.clear()  # what a freshly built AdamW holds: moments are created at the first step
            self.optimizer_source = None
        return schedule

    def _train_updates(
        self,
        spec: TrainSpec,
        store: Store,
        layout: RunLayout,
        data: RolloutSet,
        order,
        schedule,
        start_step: int,
        reference,
        trainer_behavior: list[torch.Tensor] | None,
        replay: StageReplay | None = None,
    ) -> float:
        """Train: updates ``start_step + 1 .. updates_per_stage`` with checkpoints; returns their seconds.

        With ``replay``, each update is fresh-anchored (:mod:`mugrpo.replay.session`): its fresh minibatch plus
        the replayed rollouts drawn for it, each with the behavior log-probs and advantage of its own row."""
        accelerator, model, optimizer = self.accelerator, self.model, self.optimizer
        train, main, pad_id = spec.train, accelerator.is_main_process, self.pad_id
        total = train.updates_per_stage
        self._checkpoint_s = 0.0
        group_of = {i: g for g, members in enumerate(data.groups) for i in members}
        num_rows, num_groups = len(data.rollouts), len(data.groups)
        pending: list[dict] = []
        pending_audit: list[dict] = []
        t0 = time.monotonic()
        with job_progress(
            f"train stage {spec.stage}",
            "updates",
            "loss {task.fields[loss]:+.4f}  {task.fields[tps]:.0f} tok/s",
            console,
            disable=not main,
        ) as bar:
            task = bar.add_task("train", total=total, completed=start_step, loss=0.0, tps=0.0)
            for u in range(start_step + 1, total + 1):
                indices = order.minibatch(u - 1)
                fresh = [data.rollouts[i] for i in indices]
                batch: UpdateBatch | None = None
                if replay is not None:
                    batch = replay.compose(spec.policy_version + u, fresh)
                extra = batch.replayed if batch is not None else []
                # replayed rollouts get row indices after the stage's rows, each its own group (the unit is a rollout)
                micro = split_minibatch(
                    indices + list(range(num_rows, num_rows + len(extra))),
                    data,
                    micro_batch_size=train.micro_batch_size,
                    rank=accelerator.process_index,
                    world_size=accelerator.num_processes,
                    keep_groups=train.group_minibatches,
                )
                batches: list[TokenBatch] = [
                    collate(
                        [data.rollouts[i] if i < num_rows else extra[i - num_rows] for i in mb],
                        [group_of[i] if i < num_rows else num_groups + i - num_rows for i in mb],
                        pad_id,
                    )
                    for mb in micro
                ]
                tis = None
                if trainer_behavior is not None:
                    tis = [
                        _pad_rows([trainer_behavior[i] for i in mb], b.response_ids.shape[1])
                        for mb, b in zip(micro, batches, strict=True)
                    ]
                rollouts = fresh + extra
                lr = schedule.apply(optimizer, spec.policy_version + u)
                if self._agpo is not None:
                    self._agpo.before_update(accelerator, model, batches, micro, data, indices)
                try:
                    result = train_update(
                        accelerator,
                        model,
                        optimizer,
                        batches,
                        spec.loss,
                        global_num_tokens=sum(r.num_tokens for r in rollouts),
                        global_num_seqs=sum(1 for r in rollouts if r.num_tokens),
                        max_grad_norm=train.max_grad_norm,
                        max_response_len=spec.max_response_len,
                        reference=reference,
                        trainer_behavior_logprobs=tis,
                        global_num_valid_groups=valid_groups_in(indices, data),
                        progress=training_progress(spec.policy_version + u - 1, spec.total_updates),
                    )
                except NonFiniteError as e:
                    if main:
                        store.write_json(
                            nonfinite_report_path(layout, spec.stage),
                            {
                                "stage": spec.stage,
                                "stage_update": u,
                                "update": spec.policy_version + u,
                                "what": e.what,
                                "value": str(e.value),
                                "prompt_ids": sorted({r.prompt_id for r in rollouts}),
                                "last_checkpoint": latest_checkpoint(store, layout, spec.stage),
                                "created_at": datetime.now(UTC).isoformat(),
                            },
                        )
                    raise
                replay_columns = None
                if batch is not None:
                    replay_columns, _ = replay.record(spec.policy_version + u, batch)
                    pending_audit.extend(
                        StageReplay.audit_rows(spec.run_id, spec.stage, u, spec.policy_version + u, batch)
                    )
                if self._agpo is not None:
                    self._agpo.after_update(result.metrics)
                pending.append(
                    train_step_row(
                        run_id=spec.run_id,
                        stage=spec.stage,
                        stage_update=u,
                        policy_version=spec.policy_version,
                        metrics=result.metrics,
                        grad_norm=result.grad_norm,
                        lr=lr,
                        num_sequences=len(rollouts),
                        num_tokens=result.num_tokens,
                        seconds=result.seconds,
                        staleness=spec.policy_version + u - 1 - min(r.policy_version for r in fresh),
                        mean_reward=sum(r.reward for r in fresh) / len(fresh),
                        replay=replay_columns,
                    )
                )
                bar.update(
                    task, completed=u, loss=result.metrics.get("loss", 0.0), tps=pending[-1]["tokens_per_second"]
                )
                if u % train.checkpoint_every == 0 or u == total:
                    c0 = time.monotonic()
                    self._checkpoint(spec, store, layout, schedule, data, u, pending, replay, pending_audit)
                    self._checkpoint_s += time.monotonic() - c0
                    pending, pending_audit = [], []
        return time.monotonic() - t0

    def _checkpoint(self, spec, store, layout, schedule, data, step, rows, replay=None, audit=()) -> None:
        """Checkpoint: commit the train_steps part (and with replay the ``replay`` audit part) of updates since the
        last checkpoint, then the checkpoint of ``step`` with the replay buffer's state inside (collective under
        FSDP: every rank calls it)."""
        accelerator, model = self.accelerator, self.model
        model_state = _policy_state_dict(model)
        optimizer_state = get_optimizer_state_dict(model, _inner(self.optimizer), options=_FULL)
        rng = capture_rng_state()
        rng_states = gather_object([rng]) if accelerator.num_processes > 1 else [rng]
        if accelerator.is_main_process:
            write_steps_part(store, layout, spec.stage, step, rows)
            extra_files = {}
            if replay is not None:
                write_replay_part(store, layout, spec.stage, step, list(audit))
                extra_files[CHECKPOINT_FILE] = buffer_to_bytes(replay.buffer)
            write_checkpoint(
                store,
                layout.checkpoint_dir(spec.stage, step),
                save_model=lambda dest: _save_hf_dir(self.policy, model_state, dest, self.tokenizer),
                optimizer_state=optimizer_state,
                trainer_state={
                    "stage": spec.stage,
                    "stage_update": step,
                    "global_update": spec.policy_version + step,
                    "data_fingerprint": data.fingerprint,
                    "data_cursor": {"next_update": step + 1, "rollouts": len(data.rollouts)},
                    "lr_schedule": schedule.state_dict(),
                    **({"agpo": self._agpo.controller.state_dict()} if self._agpo is not None else {}),
                },
                rng_states=rng_states,
                extra_files=extra_files,
            )
            prune_checkpoints(store, layout, spec.stage, spec.keep_checkpoints)
        accelerator.wait_for_everyone()
        self.optimizer_source = (spec.stage, step)

    def _publish(self, spec: TrainSpec, store: Store, workdir: Path) -> None:
        """Publish: the trained policy at ``spec.output_policy_dir`` (marker last), when the spec asks for it.
        Otherwise the stage's final checkpoint is the next stage's behavior policy
        (:func:`mugrpo.runs.behavior_policy_dir`)."""
        if not spec.publish_policy:
            return
        state = _policy_state_dict(self.model)  # collective under FSDP
        if self.accelerator.is_main_process and not store.is_complete_dir(spec.output_policy_dir):
            out = workdir / "policy"
            _save_hf_dir(self.policy, state, out, self.tokenizer)
            meta = {"stage": spec.stage + 1, "policy_version": spec.policy_version + spec.train.updates_per_stage}
            store.upload_dir(out, spec.output_policy_dir, meta=meta)
        self.accelerator.wait_for_everyone()

    def _commit(
        self, spec, store, layout, data, start_step, t_switch, t_train, origin, replay=None
    ) -> JobManifest | None:
        """Commit: check that train_steps hold updates 1..N exactly once, then (with replay) write the buffer's
        state after the stage, then the job manifest listing both."""
        accelerator, total = self.accelerator, spec.train.updates_per_stage
        manifest = None
        if accelerator.is_main_process:
            steps, part_records = read_steps(store, layout, spec.stage)
            if steps.num_rows != total or steps.column("stage_update").to_pylist() != list(range(1, total + 1)):
                raise RuntimeError(
                    f"train_steps of stage {spec.stage} hold updates {steps.column('stage_update').to_pylist()}, "
                    f"expected 1..{total}"
                )
            cols = steps.to_pydict()
            policy_files = _file_records(store, layout, spec.output_policy_dir) if spec.publish_policy else []
            replay_counts = {}
            if replay is not None:
                policy_files += replay_part_records(store, layout, spec.stage)
                policy_files.append(write_stage_buffer(store, layout, spec.stage, replay.buffer))
                replay_counts = {"replayed": int(sum(cols["num_replayed"])), "replay_buffer_size": len(replay.buffer)}
            t_total = time.monotonic() - origin
            manifest = JobManifest(
                run_id=spec.run_id,
                stage=spec.stage,
                job="train",
                created_at=datetime.now(UTC),
                files=part_records + policy_files,
                counts={
                    "updates": total,
                    "policy_version": spec.policy_version + total,
                    "tokens": int(sum(cols["num_tokens"])),
                    "resumed_from": start_step,
                    **data.counts,
                    **replay_counts,
                },
                metrics={
                    "final_loss": float(cols["loss"][-1]),
                    "mean_ratio_mean": float(sum(cols["ratio_mean"]) / total),
                    "max_ratio_max": float(max(cols["ratio_max"])),
                    "mean_veto_token_frac": float(sum(cols["veto_token_frac"]) / total),
                    "mean_tokens_per_second": float(sum(cols["num_tokens"]) / max(sum(cols["seconds"]), 1e-9)),
                    **(state_metrics(self._agpo.controller) if self._agpo is not None else {}),
                },
                # "recompute" (the behavior log-prob pass) and "checkpoint" (train_steps parts and checkpoint
                # writes) are parts of "train", listed apart for the audit and for bench/speedup.py's T_ckpt.
                timings={
                    "switch": t_switch,
                    "train": t_train,
                    "recompute": self._recompute_s,
                    "checkpoint": self._checkpoint_s,
                    "total": t_total,
                },
            )
            write_job_manifest(store, manifest)
            _print_summary(spec, steps, t_switch, t_train, t_total)
        accelerator.wait_for_everyone()
        return manifest


def run_training(spec: TrainSpec) -> JobManifest:
    """The cold train job: a fresh :class:`Trainer` runs (or resumes, or skips) stage ``spec.stage``.

    Raises:
        See :meth:`Trainer.run_stage`.
    """
    return Trainer(spec.train.mixed_precision).run_stage(spec, origin=PROCESS_START)


def _previous_agpo_metrics(spec: TrainSpec, store: Store) -> dict[str, float]:
    """AGPO's controller state at the previous stage's commit, as manifest metrics ({} without AGPO or at stage 0)."""
    if spec.loss.name != "agpo" or spec.stage == 0:
        return {}
    previous = read_job_manifest(store, spec.run_id, spec.stage - 1, "train")
    return {} if previous is None else {k: v for k, v in previous.metrics.items() if k.startswith("agpo_")}


def _agpo_updates(spec: TrainSpec, store: Store, ckpt: LoadedCheckpoint | None) -> AGPOUpdates | None:
    """AGPO's clip-range controller for this stage (loss.name=agpo): from the checkpoint being resumed, else from the
    previous stage's train manifest (its state at commit), else fresh. None for other losses."""
    if spec.loss.name != "agpo":
        return None
    if ckpt is not None:
        return AGPOUpdates(spec.agpo, ckpt.trainer_state["agpo"])
    previous = _previous_agpo_metrics(spec, store)
    return AGPOUpdates(spec.agpo, state_from_metrics(previous) if previous else None)


def _finish_without_updates(
    spec: TrainSpec, store: Store, layout: RunLayout, data: RolloutSet, origin: float, metrics: dict[str, float]
):
    """No trainable rollout (every group zero-variance): publish the behavior policy unchanged, commit 0 updates
    (``metrics``: AGPO's controller state, carried over unchanged)."""
    console.print(
        f"[yellow]train stage {spec.stage}: no trainable rollouts ({data.counts}); the policy is published "
        "unchanged[/yellow]"
    )
    if spec.publish_policy and not store.is_complete_dir(spec.output_policy_dir):
        _copy_committed_dir(
            store,
            spec.policy_dir,
            spec.output_policy_dir,
            meta={"stage": spec.stage + 1, "policy_version": spec.policy_version},
        )
    files = _file_records(store, layout, spec.output_policy_dir) if spec.publish_policy else []
    if spec.replay.enabled:  # no update, no eviction: the buffer is carried over unchanged
        buffer = read_stage_buffer(store, layout, spec.stage - 1, spec.replay)
        files.append(write_stage_buffer(store, layout, spec.stage, buffer))
    manifest = JobManifest(
        run_id=spec.run_id,
        stage=spec.stage,
        job="train",
        created_at=datetime.now(UTC),
        files=files,
        counts={"updates": 0, "policy_version": spec.policy_version, **data.counts},
        metrics=metrics,
        timings={"switch": 0.0, "train": 0.0, "total": time.monotonic() - origin},
    )
    write_job_manifest(store, manifest)
    return manifest
