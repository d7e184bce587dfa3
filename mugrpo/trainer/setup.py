"""Setup of a stage's training: from the :data:`~mugrpo.trainer.spec.TrainSpec` to the frozen
:class:`~mugrpo.trainer.stage.StageRun` that the update loop reads, in this order (:func:`setup_stage`):

    order      the stage's minibatch order, seeded by the stage
    resume     the stage's latest committed checkpoint, or none
    model      the behavior policy (fresh LoRA adapters at stage 0, or the adapter policy on its base);
               [the trainer's behavior log-probs of the rollouts the updates draw]; the weights to train (the
               checkpoint's on resume), wrapped, and prepared by accelerate with AdamW (once per process)
    optimizer  the LR schedule; AdamW state and RNG from the checkpoint, else the stage's seed and the previous
               stage's AdamW moments (``carry_optimizer_state``) or fresh ones
    precision  fp32 master weights and moments checked; the autocast and the checkpoint dtype
    hooks      each algorithm's state, from the checkpoint or the previous stage's commit
    reference  the frozen KL reference policy (``loss.kl_coef > 0``)

What lives across stages (a warm segment trains stage after stage with one process) is a :class:`Resident`: the
accelerator, the prepared policy and AdamW, the tokenizer, and which stage's weights and which checkpoint's AdamW
state they hold. The weights and moments it carries equal, bitwise, what a cold job reads back from storage.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from accelerate import Accelerator

from mugrpo.algorithms import TrainHooks, make_train_hooks, sections_of
from mugrpo.commits.policies import local_policy_dir
from mugrpo.common.progress import console
from mugrpo.common.seeds import derive_seed
from mugrpo.losses import row_inputs
from mugrpo.policy.adapters import LoraSection, attach_lora, is_adapter_dir, is_lora_model, load_trainable
from mugrpo.policy.adapters import load_tokenizer as adapter_tokenizer
from mugrpo.policy.models import load_model, load_policy
from mugrpo.storage.store import Store
from mugrpo.trainer.checkpoint import LoadedCheckpoint
from mugrpo.trainer.data import MinibatchOrder, RolloutSet, load_rollouts, make_minibatch_order
from mugrpo.trainer.forward import PolicyTokenLogprobs, recompute_logprobs
from mugrpo.trainer.optim import build_optimizer
from mugrpo.trainer.precision import check_fp32_master, recompute_context_fn
from mugrpo.trainer.resume import resume_optimizer, resume_point, start_algorithms
from mugrpo.trainer.spec import TrainSpec
from mugrpo.trainer.stage import Precision, StageModel, StageOptimizer, StageRun, UpdatePlan


def enable_activation_checkpointing(policy) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant torch.utils.checkpoint)."""
    kwargs = {"use_reentrant": False, "context_fn": recompute_context_fn(policy)}  # same attention on recompute
    enable = getattr(policy, "activation_checkpointing_enable", None)  # transformers >= 5.x name
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class Resident:
    """What a process keeps across stages: one accelerator, policy, AdamW and tokenizer, and the algorithms' hooks.

    Attributes:
        accelerator: made with ``mixed_precision`` ("no" or "bf16").
        model, optimizer: the policy wrapper and AdamW as accelerate prepared them (None before the first stage).
        policy, tokenizer: the unwrapped HF causal LM and its tokenizer.
        weights_stage: the stage whose behavior policy the in-memory weights are (None: nothing loaded yet).
        optimizer_source: (stage, stage update) of the checkpoint whose AdamW state equals the in-memory one;
            None: fresh moments.
    """

    def __init__(self, mixed_precision: str = "no") -> None:
        self.accelerator = Accelerator(mixed_precision=mixed_precision)
        self.model: PolicyTokenLogprobs | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.policy = None
        self.tokenizer = None
        self.weights_stage: int | None = None
        self.optimizer_source: tuple[int, int] | None = None
        self._hooks: dict[str, tuple[Any, TrainHooks]] = {}

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def train_hooks(self, spec: TrainSpec) -> dict[str, TrainHooks]:
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

    def ensure_weights(self, spec: TrainSpec) -> float:
        """Make the live policy the behavior policy of ``spec.stage`` (loading the model on first use).

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
            policy, self.tokenizer = load_behavior(spec.store(), behavior_dir, spec.train.lora, stage_seeds(spec).lora)
            self.build(policy, spec)
        else:
            self.load_weights_from(behavior_dir)
        self.weights_stage = spec.stage
        return time.monotonic() - t0

    def build(self, policy, spec: TrainSpec) -> None:
        """Wrap the policy (activation checkpointing, the chunked log-prob head), build AdamW over its trainable
        parameters (LoRA: the adapters) and let accelerate prepare both."""
        train = spec.train
        if train.gradient_checkpointing:
            enable_activation_checkpointing(policy)
        policy.train()
        model = PolicyTokenLogprobs(policy, train.logprob_chunk_size, train.shared_prefix)
        optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], train)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.policy = self.accelerator.unwrap_model(self.model).policy

    def load_weights_from(self, model_dir: Path) -> None:
        """Copy the weights of the HF dir ``model_dir`` into the live policy, in place (same dtype: bitwise)."""
        fresh = load_model(model_dir)
        with torch.no_grad():
            self.policy.load_state_dict(fresh.state_dict())


def load_stage_data(spec: TrainSpec, accelerator: Accelerator) -> RolloutSet:
    """The stage's training rollouts (:func:`mugrpo.trainer.data.load_rollouts`), announced on the main process.

    Raises:
        RolloutDataError, mugrpo.commits.tables.SchemaError: bad rollouts.
    """
    data = load_rollouts(
        spec.store(),
        spec.run_id,
        spec.rollout_stages,
        skip_zero_variance_groups=spec.train.skip_zero_variance_groups,
        row_inputs=row_inputs(spec.loss),
    )
    if accelerator.is_main_process:
        n = accelerator.num_processes
        how = "not distributed" if n == 1 else f"{n} processes, {accelerator.distributed_type.value}"
        console.print(f"train stage {spec.stage}: rollouts {data.counts}; {how}, on {accelerator.device}")
    return data


def setup_stage(
    spec: TrainSpec, *, data: RolloutSet, hooks: dict[str, TrainHooks], resident: Resident, workdir: Path
) -> StageRun:
    """The stage's :class:`StageRun`: ``data`` (not empty) and ``hooks`` from :func:`load_stage_data` and
    :meth:`Resident.train_hooks`; ``resident`` is set up or moved to the stage (module docstring); ``workdir``
    receives the checkpoint resumed from.

    Raises:
        RolloutDataError: the stage's checkpoint was made for other rollouts (data fingerprint differs).
        ValueError: a checkpoint made for another LR schedule.
        RuntimeError: ``carry_optimizer_state`` and the previous stage's training has not committed.
        FileNotFoundError: a policy the stage starts from is not committed.
    """
    store, layout, train = spec.store(), spec.layout, spec.train
    seeds = stage_seeds(spec)
    order = make_minibatch_order(
        data, rollouts_per_update=train.rollouts_per_update, group_minibatches=train.group_minibatches, seed=seeds.order
    )
    start_step, ckpt = resume_point(spec, store, layout, data, workdir)
    trainer_behavior, recompute_s = setup_weights(resident, spec, store, data, order, ckpt, seeds.lora)
    schedule = resume_optimizer(resident, spec, store, layout, ckpt, seeds.rng)
    check_fp32_master(resident.model.parameters(), resident.optimizer)
    start_algorithms(hooks, spec, store, layout, data, ckpt, resident.accelerator.is_main_process)
    reference = None
    if spec.loss.kl_coef > 0:
        ref_policy = load_model(local_policy_dir(store, spec.reference_policy_dir)).requires_grad_(False)
        reference = (
            PolicyTokenLogprobs(ref_policy, train.logprob_chunk_size, train.shared_prefix)
            .to(resident.accelerator.device)
            .eval()
        )
    acc = resident.accelerator
    return StageRun(
        spec=spec,
        store=store,
        layout=layout,
        model=StageModel(acc, resident.model, resident.policy, resident.tokenizer, reference),
        lora=train.lora if is_lora_model(resident.policy) else None,
        optimizer=StageOptimizer(resident.optimizer, schedule),
        data=data,
        plan=UpdatePlan(order, {i: g for g, m in enumerate(data.groups) for i in m}, start_step, trainer_behavior),
        hooks=hooks,
        precision=Precision(acc.mixed_precision, acc.autocast, getattr(torch, train.checkpoint_dtype)),
        recompute_s=recompute_s,
    )


class StageSeeds(NamedTuple):
    """The seeds of a stage's training: its minibatch order, its RNG at the stage's start (torch, numpy, random),
    and fresh LoRA adapters' initialization (the run's, the same at every stage)."""

    order: int
    rng: int
    lora: int


def stage_seeds(spec: TrainSpec) -> StageSeeds:
    """The stage's seeds, derived from ``spec.seed`` (:func:`mugrpo.common.seeds.derive_seed`)."""
    return StageSeeds(
        order=derive_seed(spec.seed, spec.stage, "train-data-order"),
        rng=derive_seed(spec.seed, spec.stage, "train-rng") % 2**32,
        lora=derive_seed(spec.seed, "lora-init") % 2**32,
    )


def load_behavior(store: Store, behavior_dir: Path, lora: LoraSection | None, seed: int) -> tuple:
    """The behavior policy to train and its tokenizer: the full policy of ``behavior_dir``, with fresh LoRA adapters
    (initialized from ``seed``) when ``lora`` asks for them (stage 0), or the adapter policy of ``behavior_dir`` on
    its base."""
    if is_adapter_dir(behavior_dir):
        return load_trainable(store, behavior_dir), adapter_tokenizer(behavior_dir)
    policy, tokenizer = load_policy(behavior_dir)  # the tokenizer read once (mugrpo.policy.models)
    if lora is not None:
        policy = attach_lora(policy, lora, seed)
    return policy, tokenizer


def setup_weights(
    resident: Resident,
    spec: TrainSpec,
    store: Store,
    data: RolloutSet,
    order: MinibatchOrder,
    ckpt: LoadedCheckpoint | None,
    seed: int,
) -> tuple[list[torch.Tensor] | None, float]:
    """The behavior policy first (the trainer's behavior log-probs come from it, also on resume), then the
    checkpoint's weights when resuming, prepared once per process (fresh LoRA adapters from ``seed``). Returns the
    trainer's behavior log-probs for truncated IS (``loss.tis_cap``) or None, and the recompute pass's seconds."""
    cold = resident.model is None
    if cold:
        behavior_dir = local_policy_dir(store, spec.policy_dir)
        behavior, resident.tokenizer = load_behavior(store, behavior_dir, spec.train.lora, seed)
    else:
        if resident.weights_stage != spec.stage:  # a warm process: the weights of another stage in memory
            resident.load_weights_from(local_policy_dir(store, spec.policy_dir))
        behavior = resident.policy
    trainer_behavior, recompute_s = None, 0.0
    if spec.train.recompute_behavior_logprobs or spec.loss.tis_cap is not None:
        t0 = time.monotonic()
        trainer_behavior = recompute_behavior(resident, spec, data, order, behavior)
        recompute_s = time.monotonic() - t0
    if cold:
        if ckpt is None:
            policy = behavior
        elif is_adapter_dir(ckpt.model_dir):  # LoRA: the checkpoint's adapter on the same base
            policy = load_trainable(store, ckpt.model_dir)
        else:
            policy = load_model(ckpt.model_dir)
        resident.build(policy, spec)
    else:
        if ckpt is not None:
            resident.load_weights_from(ckpt.model_dir)
        resident.policy.train()
    resident.weights_stage = spec.stage
    return trainer_behavior, recompute_s


def recompute_behavior(resident: Resident, spec: TrainSpec, data: RolloutSet, order: MinibatchOrder, behavior):
    """The trainer's behavior log-probs of the rollouts the stage's updates draw (the others keep the engine's,
    never read), under the training autocast so the update-1 ratio is exactly 1: written into ``data``'s rollouts
    with ``recompute_behavior_logprobs`` (returns None; the engine's stay as ``sampler_logprobs``), else returned
    for truncated IS (one [R_i] tensor per rollout)."""
    train, device = spec.train, resident.accelerator.device
    behavior_policy = PolicyTokenLogprobs(behavior.to(device).eval(), train.logprob_chunk_size, train.shared_prefix)
    needed = sorted({i for u in range(train.updates_per_stage) for i in order.minibatch(u)})
    subset = dataclasses.replace(data, rollouts=[data.rollouts[i] for i in needed])
    with resident.accelerator.autocast():
        recomputed = recompute_logprobs(behavior_policy, subset, train.micro_batch_size, resident.pad_id, device)
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
