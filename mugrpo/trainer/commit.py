"""What a training job commits: the checkpoints, the published policy and the job manifest, in this order.

    per checkpoint n:  train_steps part n  ->  the algorithms' parts  ->  [last update, when the spec publishes:
                       policies/stage=k+1 (marker last)]  ->  checkpoints/stage=k/step=n (marker last)  ->  prune
                       older ones
    at the end:        jobs/stage=k/train.manifest.json (the job's commit)

The stage's weights are written once: the final checkpoint of a stage that publishes references the published
policy's files (path and sha256, :class:`mugrpo.commits.policies.PolicyRef`) instead of holding a second copy. A kill
between the policy's marker and the checkpoint's resumes from the checkpoint before, re-trains the last updates
(bitwise the same weights on CPU) and references the committed policy.

Each step's files are complete before the next one starts. The algorithms on in the stage
(:mod:`mugrpo.algorithms`) add their state to every checkpoint (:meth:`~mugrpo.algorithms.TrainHooks.checkpoint`)
and their files, counts and metrics to the job manifest (:meth:`~mugrpo.algorithms.TrainHooks.commit`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import torch
from accelerate.utils import gather_object
from rich.table import Table

from mugrpo.algorithms import CheckpointAt, CommitRecord, StageCommit, TrainHooks
from mugrpo.commits.manifest import latest_checkpoint, write_job_manifest
from mugrpo.commits.policies import committed_policy_ref
from mugrpo.common.progress import console
from mugrpo.common.scratch import scratch, scratch_dir
from mugrpo.policy.adapters import base_ref, is_lora_model, save_adapter
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import COMPLETE_MARKER, Store
from mugrpo.trainer.checkpoint import capture_rng_state, prune_checkpoints, write_checkpoint
from mugrpo.trainer.data import RolloutSet
from mugrpo.trainer.records import read_steps, write_steps_part
from mugrpo.trainer.spec import TrainSpec
from mugrpo.trainer.stage import LivePolicy, StageRun
from mugrpo.trainer.step import NonFiniteError
from schemas import FileRecord, JobManifest

_POLICY_PREFIX = "policy."
#: train_steps columns summarized (first and last update) when a stage commits.
_SUMMARY_COLUMNS = (
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
)


def full_state_options(*, trainable_only: bool = False):
    """``StateDictOptions`` of full (unsharded, CPU) state dicts: what a checkpoint and a published policy hold, also
    under FSDP; ``trainable_only``: without frozen parameters (a LoRA policy's base).

    torch.distributed.checkpoint's ``state_dict`` module is imported here, on first use (a checkpoint, a publish, a
    resume, carried AdamW moments), not with this module: a job does not need it before its first update
    (tests/unit/test_job_imports.py).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)


def set_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a full optimizer state dict (parameters named as in ``model``, as a checkpoint holds it) into
    ``optimizer`` (torch.distributed.checkpoint's ``set_optimizer_state_dict``; collective under FSDP)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=full_state_options())


def inner_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The real optimizer inside accelerate's AcceleratedOptimizer (or ``optimizer`` itself)."""
    return getattr(optimizer, "optimizer", optimizer)


def policy_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded, CPU) state dict of the wrapped policy with HF parameter names (collective under FSDP); of a
    LoRA policy, its adapters only (the base is frozen and stays at ``policies/stage=0``)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    lora = is_lora_model(model)
    state = get_model_state_dict(model, options=full_state_options(trainable_only=lora))
    return {k[len(_POLICY_PREFIX) :]: v for k, v in state.items() if k.startswith(_POLICY_PREFIX)}


def save_hf_dir(policy, state: dict[str, torch.Tensor], dest: Path, tokenizer=None) -> None:
    """Write ``state`` as an HF model dir at ``dest`` (with the tokenizer when given)."""
    policy.save_pretrained(dest, state_dict=state)
    if tokenizer is not None:
        tokenizer.save_pretrained(dest)


def save_policy(live: LivePolicy, spec: TrainSpec, state: dict[str, torch.Tensor], dest: Path) -> None:
    """Write the live policy with tensors ``state`` as a policy folder at ``dest``: an HF model dir, or for a LoRA
    policy its adapter with a reference to its base, ``policies/stage=0`` (:mod:`mugrpo.policy.adapters`)."""
    if is_lora_model(live.policy):
        ref = base_ref(spec.store(), spec.layout.policy_dir(0))
        save_adapter(live.policy, state, dest, ref, live.tokenizer)
    else:
        save_hf_dir(live.policy, state, dest, live.tokenizer)


def nonfinite_report_path(layout: RunLayout, stage: int) -> str:
    """Where a stopped job records the update and prompt ids of a NaN/inf minibatch."""
    return layout.job_error(stage, "train", "nonfinite")


def write_nonfinite_report(
    store: Store, layout: RunLayout, spec: TrainSpec, stage_update: int, error: NonFiniteError, prompt_ids: list[str]
) -> None:
    """Record a NaN/inf update (:func:`nonfinite_report_path`): which update, what, the prompt ids of its
    minibatch and the last checkpoint a re-run resumes from."""
    store.write_json(
        nonfinite_report_path(layout, spec.stage),
        {
            "stage": spec.stage,
            "stage_update": stage_update,
            "update": spec.policy_version + stage_update,
            "what": error.what,
            "value": str(error.value),
            "prompt_ids": prompt_ids,
            "last_checkpoint": latest_checkpoint(store, layout, spec.stage),
            "created_at": datetime.now(UTC).isoformat(),
        },
    )


def file_records(store: Store, layout: RunLayout, rel_dir: str) -> list[FileRecord]:
    """FileRecords of the committed folder ``rel_dir``, from its marker."""
    marker = store.read_json(f"{rel_dir}/{COMPLETE_MARKER}")
    return [
        FileRecord(path=layout.rel(f"{rel_dir}/{name}"), sha256=digest, bytes=store.size(f"{rel_dir}/{name}"))
        for name, digest in sorted(marker["files"].items())
    ]


#: AdamW's per-parameter tensors rounded and stored in ``train.checkpoint_dtype`` (``step`` stays as it is).
MOMENT_KEYS = ("exp_avg", "exp_avg_sq")


def round_state_to(dtype: torch.dtype, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Round the live weights and AdamW moments to ``dtype``'s values, in place, keeping their own dtype (fp32).

    Each value becomes the nearest ``dtype`` value (``Tensor.to``: round to nearest even), so casting the tensors
    to ``dtype`` afterwards loses nothing and loading them back gives the same fp32 values: a run continuing
    after a checkpoint and a run resumed from it hold the same state (``train.checkpoint_dtype``). Works on local
    shards (FSDP): rounding is elementwise.

    Args:
        dtype: the storage dtype (torch.bfloat16).
        model: the wrapped policy (its parameters).
        optimizer: the inner optimizer (its per-parameter state).
    """
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad and p.is_floating_point() and p.dtype != dtype:  # not a LoRA policy's frozen base
                p.copy_(p.to(dtype).to(p.dtype))
        for state in optimizer.state.values():
            for key in MOMENT_KEYS:
                t = state.get(key)
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dtype:
                    t.copy_(t.to(dtype).to(t.dtype))


def cast_for_storage(
    dtype: torch.dtype, policy, model_state: dict[str, torch.Tensor], optimizer_state: dict
) -> tuple[dict[str, torch.Tensor], dict]:
    """The state dicts of a checkpoint in storage dtype ``dtype``: the policy's parameters and AdamW's moments
    cast (buffers, such as RoPE's ``inv_freq``, and AdamW's ``step`` keep theirs). Call after
    :func:`round_state_to`, so the cast is exact."""
    params = {name for name, _ in policy.named_parameters(remove_duplicate=False)}
    model_state = {k: v.to(dtype) if k in params and v.is_floating_point() else v for k, v in model_state.items()}
    states = {
        name: {k: v.to(dtype) if k in MOMENT_KEYS and isinstance(v, torch.Tensor) else v for k, v in st.items()}
        for name, st in optimizer_state.get("state", {}).items()
    }
    return model_state, {**optimizer_state, "state": states}


def write_stage_checkpoint(run: StageRun, step: int, rows: list[dict]) -> None:
    """Checkpoint: commit the train_steps part of the updates since the last checkpoint, then each algorithm's
    part, then the checkpoint of ``step`` (weights, AdamW, LR schedule, RNG, the algorithms' state), then prune
    older checkpoints; with ``train.checkpoint_dtype`` bfloat16 the live weights and moments are first rounded to
    bf16 values and stored as bf16 (:func:`round_state_to`). Collective under FSDP: every rank calls it."""
    spec, store, layout, live = run.spec, run.store, run.layout, run.live
    accelerator = live.accelerator
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    optimizer = inner_optimizer(live.optimizer)
    storage = run.precision.checkpoint_dtype
    if storage != torch.float32:
        round_state_to(storage, live.model, optimizer)
    model_state = policy_state_dict(live.model)
    optimizer_state = get_optimizer_state_dict(live.model, optimizer, options=full_state_options())
    if storage != torch.float32:
        model_state, optimizer_state = cast_for_storage(storage, live.policy, model_state, optimizer_state)
    rng = capture_rng_state()
    rng_states = gather_object([rng]) if accelerator.num_processes > 1 else [rng]
    main = accelerator.is_main_process
    if main:
        write_steps_part(store, layout, spec.stage, step, rows)
    at = CheckpointAt(store=store, layout=layout, stage=spec.stage, stage_update=step, is_main=main)
    saved = {name: h.checkpoint(at) for name, h in run.hooks.items()}
    shared = spec.publish_policy and step == spec.train.updates_per_stage
    if shared:  # the weights go to the published policy only; the checkpoint references it
        _publish(live, spec, model_state)
    if main:
        save_model = None if shared else (lambda dest: save_policy(live, spec, model_state, dest))
        write_checkpoint(
            store,
            layout.checkpoint_dir(spec.stage, step),
            save_model=save_model,
            policy_ref=committed_policy_ref(store, spec.output_policy_dir) if shared else None,
            optimizer_state=optimizer_state,
            trainer_state={
                "stage": spec.stage,
                "stage_update": step,
                "global_update": spec.policy_version + step,
                "data_fingerprint": run.data.fingerprint,
                "data_cursor": {"next_update": step + 1, "rollouts": len(run.data.rollouts)},
                "lr_schedule": run.optimizer.schedule.state_dict(),
                **{name: s.state for name, s in saved.items() if s.state is not None},
            },
            rng_states=rng_states,
            extra_files={file: raw for s in saved.values() for file, raw in s.files.items()},
        )
        prune_checkpoints(store, layout, spec.stage, spec.keep_checkpoints)
    accelerator.wait_for_everyone()


def publish_policy(live: LivePolicy, spec: TrainSpec) -> None:
    """Publish: the trained policy at ``spec.output_policy_dir`` (marker last), when the spec asks for it and the
    stage's final checkpoint has not already (:func:`write_stage_checkpoint` publishes before it; this covers a
    resume from a final checkpoint of format 1). Otherwise the stage's final checkpoint is the next stage's
    behavior policy (:func:`mugrpo.orchestration.runs.behavior_policy_dir`)."""
    if not spec.publish_policy or spec.store().is_complete_dir(spec.output_policy_dir):
        return  # every rank decides alike: the checkpoint's barrier came after the policy's marker
    _publish(live, spec, policy_state_dict(live.model))  # collective under FSDP


def _publish(live: LivePolicy, spec: TrainSpec, state: dict[str, torch.Tensor]) -> None:
    """Write ``state`` (full, CPU) as the policy at ``spec.output_policy_dir`` unless it is committed already (a
    re-run after a kill between the policy's marker and the checkpoint's); every rank calls it."""
    store = spec.store()
    if live.accelerator.is_main_process and not store.is_complete_dir(spec.output_policy_dir):
        with scratch(f"publish-{spec.stage}") as tmp:
            out = tmp / "policy"
            save_policy(live, spec, state, out)
            meta = {"stage": spec.stage + 1, "policy_version": spec.policy_version + spec.train.updates_per_stage}
            store.upload_dir(out, spec.output_policy_dir, meta=meta)
    live.accelerator.wait_for_everyone()


def _merge(records: list[CommitRecord]) -> CommitRecord:
    return CommitRecord(
        files=[f for r in records for f in r.files],
        counts={k: v for r in records for k, v in r.counts.items()},
        metrics={k: v for r in records for k, v in r.metrics.items()},
    )


def commit_training(
    spec: TrainSpec,
    data: RolloutSet,
    hooks: Mapping[str, TrainHooks],
    *,
    start_step: int,
    timings: dict[str, float],
    origin: float,
) -> JobManifest:
    """Commit (main process): check that train_steps hold updates 1..N exactly once, let each algorithm commit its
    part, then write the job manifest listing everything. ``timings``: switch, train, recompute and checkpoint
    seconds (recompute and checkpoint are parts of train, listed apart for the audit and bench/speedup.py's
    T_ckpt); the total counts from ``origin`` (``time.monotonic()``).

    Raises:
        RuntimeError: train_steps do not hold updates 1..N exactly once.
    """
    store, layout, total = spec.store(), spec.layout, spec.train.updates_per_stage
    steps, part_records = read_steps(store, layout, spec.stage)
    if steps.num_rows != total or steps.column("stage_update").to_pylist() != list(range(1, total + 1)):
        raise RuntimeError(
            f"train_steps of stage {spec.stage} hold updates {steps.column('stage_update').to_pylist()}, "
            f"expected 1..{total}"
        )
    cols = steps.to_pydict()
    policy_files = file_records(store, layout, spec.output_policy_dir) if spec.publish_policy else []
    ctx = StageCommit(store=store, layout=layout, stage=spec.stage, steps=cols)
    extra = _merge([h.commit(ctx) for h in hooks.values()])
    timings = {**timings, "total": time.monotonic() - origin}
    manifest = JobManifest(
        run_id=spec.run_id,
        stage=spec.stage,
        job="train",
        created_at=datetime.now(UTC),
        files=part_records + policy_files + list(extra.files),
        counts={
            "updates": total,
            "policy_version": spec.policy_version + total,
            "tokens": int(sum(cols["num_tokens"])),
            "resumed_from": start_step,
            **data.counts,
            **extra.counts,
        },
        metrics={
            "final_loss": float(cols["loss"][-1]),
            "mean_ratio_mean": float(sum(cols["ratio_mean"]) / total),
            "max_ratio_max": float(max(cols["ratio_max"])),
            "mean_veto_token_frac": float(sum(cols["veto_token_frac"]) / total),
            "mean_tokens_per_second": float(sum(cols["num_tokens"]) / max(sum(cols["seconds"]), 1e-9)),
            **extra.metrics,
        },
        timings=timings,
    )
    write_job_manifest(store, manifest)
    print_summary(spec, steps, timings)
    return manifest


def finish_without_updates(
    spec: TrainSpec, data: RolloutSet, hooks: Mapping[str, TrainHooks], origin: float
) -> JobManifest:
    """No trainable rollout (every group zero-variance): publish the behavior policy unchanged, let each algorithm
    carry its state over unchanged, commit 0 updates."""
    store, layout = spec.store(), spec.layout
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
    files = file_records(store, layout, spec.output_policy_dir) if spec.publish_policy else []
    carried = _merge([h.carry_over(StageCommit(store=store, layout=layout, stage=spec.stage)) for h in hooks.values()])
    manifest = JobManifest(
        run_id=spec.run_id,
        stage=spec.stage,
        job="train",
        created_at=datetime.now(UTC),
        files=files + list(carried.files),
        counts={"updates": 0, "policy_version": spec.policy_version, **data.counts, **carried.counts},
        metrics=dict(carried.metrics),
        timings={"switch": 0.0, "train": 0.0, "total": time.monotonic() - origin},
    )
    write_job_manifest(store, manifest)
    return manifest


def _copy_committed_dir(store: Store, src_rel: str, dest_rel: str, meta: dict) -> dict[str, str]:
    """Re-commit the committed folder ``src_rel`` at ``dest_rel`` (files verified, marker last)."""
    tmp = scratch_dir("copy")
    try:
        store.download_dir(src_rel, tmp)
        return store.upload_dir(tmp, dest_rel, meta=meta)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def print_summary(spec: TrainSpec, steps, timings: Mapping[str, float]) -> None:
    """First and last value of the main train_steps columns, and the stage's timings."""
    table = Table(title=f"train stage {spec.stage}: {steps.num_rows} updates")
    table.add_column("metric")
    table.add_column("first", justify="right")
    table.add_column("last", justify="right")
    if steps.num_rows:
        cols = steps.to_pydict()
        for name in _SUMMARY_COLUMNS:
            first, last = cols[name][0], cols[name][-1]
            table.add_row(name, "-" if first is None else f"{first:.4g}", "-" if last is None else f"{last:.4g}")
    console.print(table)
    console.print(
        f"timings: switch {timings['switch']:.1f}s, train {timings['train']:.1f}s, total {timings['total']:.1f}s"
    )
