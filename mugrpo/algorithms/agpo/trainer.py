"""AGPO's clip-range controller inside the trainer (arXiv 2605.20722; released code wandugu/paper_agpo).

:class:`AGPOTrainHooks` is AGPO's side of the trainer (``loss.name == "agpo"``). Around each optimizer update:

1. :meth:`AGPOTrainHooks.before_update`: H = token-mean entropy of the current policy over the update's response
   tokens (``UpdateRows.policy_entropy``: a no-grad forward pass over its micro-batches, all ranks), the entropy
   ratio H / H_ref (H_ref = H on the very first update), and each response's clip range eps_g from its group's
   probe (sigma, E, k3) (its declared columns ``probe_*``) and KLbar; returned as the update's loss input
   ``clip_eps`` (the ``agpo`` loss reads it from ``LossContext.inputs``).
2. the update (the ``agpo`` loss also reports ``agpo_kl_step``: mean over responses of
   max(0, mean_t(logp_old - logp_new)), logp_new being this update's forward pass);
3. :meth:`AGPOTrainHooks.after_update`: H_ref <- 0.01 H + 0.99 H_ref, KLbar <- 0.1 KL_step + 0.9 KLbar, and the
   update's ``agpo_*`` metrics (eps mean/min/max over the update's responses, H, H_ref and KLbar as used for eps)
   go to the train_steps row's ``loss_metrics``.

The released code runs one "step" per rollout collection (H before its 4 epochs, KL_step after them); here a step
is one optimizer update on its minibatch (docs/algorithms/agpo.md). State (H_ref, KLbar) is saved in every
checkpoint (``trainer_state["agpo"]``) and in the train job manifest at the stage commit (:func:`state_metrics`),
from which the next stage starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mugrpo.algorithms.agpo.config import AGPOConfig
from mugrpo.algorithms.agpo.controllers import ClipRangeController
from mugrpo.algorithms.agpo.loss import CLIP_EPS
from mugrpo.algorithms.agpo.probe import PROBE_STATS
from mugrpo.algorithms.training import (
    CheckpointAt,
    CommitRecord,
    SavedState,
    StageCommit,
    StageStart,
    StepRecord,
    TrainHooks,
    UpdateInputs,
    UpdateRows,
)
from mugrpo.commits.manifest import read_job_manifest
from mugrpo.commits.tables import RolloutDataError

#: Key of the controller state in checkpoints' ``trainer_state``.
STATE_KEY = "agpo"
#: Keys of the controller state in the train job manifest's metrics (absent: unset).
MANIFEST_KEYS = {"h_ref": "agpo_h_ref", "kl_bar": "agpo_kl_bar"}


def state_metrics(controller: ClipRangeController) -> dict[str, float]:
    """The controller state as manifest metrics (H_ref left out while unset)."""
    state = controller.state_dict()
    return {MANIFEST_KEYS[k]: float(v) for k, v in state.items() if v is not None}


def state_from_metrics(metrics: Mapping[str, float]) -> dict[str, Any]:
    """Inverse of :func:`state_metrics` (a missing key: the initial value)."""
    return {"h_ref": metrics.get(MANIFEST_KEYS["h_ref"]), "kl_bar": metrics.get(MANIFEST_KEYS["kl_bar"], 0.0)}


def previous_stage_metrics(ctx: StageStart | StageCommit) -> dict[str, float]:
    """The controller's state at the previous stage's train commit, as manifest metrics ({} at stage 0 or when
    that stage has not committed)."""
    if ctx.stage == 0:
        return {}
    previous = read_job_manifest(ctx.store, ctx.layout.run_id, ctx.stage - 1, "train")
    return {} if previous is None else {k: v for k, v in previous.metrics.items() if k.startswith("agpo_")}


class AGPOTrainHooks(TrainHooks):
    """The clip-range controller of the stage being trained and its per-update steps (see the module docstring).

    Args:
        config: the run's ``agpo`` section.
    """

    def __init__(self, config: AGPOConfig) -> None:
        self.config = config
        self.controller = config.clip_controller()
        self._pending: dict[str, float] | None = None

    def start(self, ctx: StageStart) -> None:
        """The controller of the checkpoint being resumed, else the previous stage's state at its commit (from its
        train manifest), else a fresh one."""
        self.controller = self.config.clip_controller()
        self._pending = None
        if ctx.resume is not None:
            self.controller.load_state_dict(ctx.resume.trainer_state[STATE_KEY])
            return
        previous = previous_stage_metrics(ctx)
        if previous:
            self.controller.load_state_dict(state_from_metrics(previous))

    def before_update(self, rows: UpdateRows) -> UpdateInputs:
        """Measure H and give every rollout of the update its group's clip range.

        Raises:
            RolloutDataError: a rollout without probe statistics (generated without ``agpo.probe``).
        """
        ctl = self.controller
        entropy = rows.policy_entropy()
        h_ref = entropy if ctl.h_ref is None else ctl.h_ref
        ratio = ctl.entropy_ratio(entropy)
        eps = []
        for rollout in [*rows.fresh, *rows.extra]:
            stats = [rollout.columns.get(name) for name in PROBE_STATS]
            if any(v is None for v in stats):
                raise RolloutDataError(
                    f"rollout prompt_id={rollout.prompt_id!r} stage={rollout.stage} has no AGPO probe statistics: "
                    "loss.name=agpo needs rollouts generated with agpo.probe=true"
                )
            eps.append(ctl.eps(ratio, *stats))
        values = np.array(eps)
        self._pending = {
            "agpo_entropy": entropy,
            "agpo_h_ref": h_ref,
            "agpo_kl_bar": ctl.kl_bar,
            "agpo_eps_mean": float(values.mean()),
            "agpo_eps_min": float(values.min()),
            "agpo_eps_max": float(values.max()),
        }
        return UpdateInputs(values={CLIP_EPS: eps})

    def after_update(self, rows: UpdateRows, metrics: Mapping[str, float]) -> StepRecord:
        """Update H_ref and KLbar from this update; its ``agpo_*`` metrics go to the row.

        Raises:
            RuntimeError: no :meth:`before_update` for this update, or the loss reported no ``agpo_kl_step``.
        """
        if self._pending is None:
            raise RuntimeError("AGPO: after_update without before_update")
        if "agpo_kl_step" not in metrics:
            raise RuntimeError("the loss reported no agpo_kl_step: AGPO's controller needs loss.name=agpo")
        self.controller.update_entropy(self._pending["agpo_entropy"])
        self.controller.update_kl(metrics["agpo_kl_step"])
        pending, self._pending = self._pending, None
        return StepRecord(metrics=pending)

    def checkpoint(self, ctx: CheckpointAt) -> SavedState:
        """The controller's state, saved as ``trainer_state["agpo"]``."""
        return SavedState(state=self.controller.state_dict())

    def commit(self, ctx: StageCommit) -> CommitRecord:
        """The controller's state at the commit, as manifest metrics (the next stage starts from them)."""
        return CommitRecord(metrics=state_metrics(self.controller))

    def carry_over(self, ctx: StageCommit) -> CommitRecord:
        """No update: the previous stage's state, unchanged."""
        return CommitRecord(metrics=previous_stage_metrics(ctx))
