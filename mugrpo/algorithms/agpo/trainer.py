"""AGPO's clip-range controller inside the trainer (arXiv 2605.20722; released code wandugu/paper_agpo).

One :class:`AGPOUpdates` per stage run by :class:`mugrpo.trainer.loop.Trainer` when ``loss.name == "agpo"``.
Around each optimizer update:

1. :meth:`AGPOUpdates.before_update`: H = token-mean entropy of the current policy over the update's response
   tokens (a no-grad forward pass over its micro-batches, all ranks), the entropy ratio H / H_ref (H_ref = H on
   the very first update), and each response's clip range eps_g from its group's probe (sigma, E, k3) and
   KLbar; written into each micro-batch's ``clip_eps`` (the loss reads it through ``LossContext.clip_eps``).
2. the update (the ``agpo`` loss also reports ``agpo_kl_step``: mean over responses of
   max(0, mean_t(logp_old - logp_new)), logp_new being this update's forward pass);
3. :meth:`AGPOUpdates.after_update`: H_ref <- 0.01 H + 0.99 H_ref, KLbar <- 0.1 KL_step + 0.9 KLbar, and the
   update's ``agpo_*`` metrics (eps mean/min/max over groups, H, H_ref and KLbar as used for eps) are added
   to the train_steps row's ``loss_metrics``.

The released code runs one "step" per rollout collection (H before its 4 epochs, KL_step after them); here a step
is one optimizer update on its minibatch (docs/algorithms/agpo.md). State (H_ref, KLbar) is saved in every
checkpoint (``trainer_state["agpo"]``) and in the train job manifest at the stage commit (:func:`state_metrics`),
from which the next stage starts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from accelerate import Accelerator

from mugrpo.adaptive.config import AGPOConfig
from mugrpo.adaptive.controllers import ClipRangeController
from mugrpo.trainer.batch import TokenBatch
from mugrpo.trainer.data import RolloutDataError, RolloutSet

#: Keys of the controller state in the train job manifest's metrics (absent: unset).
MANIFEST_KEYS = {"h_ref": "agpo_h_ref", "kl_bar": "agpo_kl_bar"}


def state_metrics(controller: ClipRangeController) -> dict[str, float]:
    """The controller state as manifest metrics (H_ref left out while unset)."""
    state = controller.state_dict()
    return {MANIFEST_KEYS[k]: float(v) for k, v in state.items() if v is not None}


def state_from_metrics(metrics: dict[str, float]) -> dict[str, Any]:
    """Inverse of :func:`state_metrics` (a missing key: the initial value)."""
    return {"h_ref": metrics.get(MANIFEST_KEYS["h_ref"]), "kl_bar": metrics.get(MANIFEST_KEYS["kl_bar"], 0.0)}


@torch.no_grad()
def token_mean_entropy(accelerator: Accelerator, model: torch.nn.Module, batches: list[TokenBatch]) -> float:
    """Token-mean entropy (nats) of ``model`` over the response tokens of ``batches`` on every rank."""
    total = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    count = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    for cpu_batch in batches:
        batch = cpu_batch.to(accelerator.device)
        with accelerator.autocast():
            _, entropy = model(batch)
        total += torch.where(batch.response_mask, entropy.double(), 0.0).sum()
        count += batch.response_mask.sum()
    if accelerator.num_processes > 1:
        total = accelerator.reduce(total, reduction="sum")
        count = accelerator.reduce(count, reduction="sum")
    return float(total / count.clamp_min(1))


class AGPOUpdates:
    """The clip-range controller of a stage and its per-update steps (see the module docstring).

    Args:
        config: the run's ``agpo`` section.
        state: a saved :meth:`ClipRangeController.state_dict`, or None for a fresh controller.
    """

    def __init__(self, config: AGPOConfig, state: dict[str, Any] | None = None) -> None:
        self.controller = config.clip_controller()
        if state is not None:
            self.controller.load_state_dict(state)
        self._pending: dict[str, float] | None = None

    def before_update(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        batches: list[TokenBatch],
        micro: list[list[int]],
        data: RolloutSet,
        indices: list[int],
    ) -> None:
        """Measure H and set every micro-batch's ``clip_eps`` (this rank's ``micro`` of the update ``indices``).

        Raises:
            RolloutDataError: a rollout without probe statistics (generated without ``agpo.probe``).
        """
        ctl = self.controller
        entropy = token_mean_entropy(accelerator, model, batches)
        h_ref = entropy if ctl.h_ref is None else ctl.h_ref
        ratio = ctl.entropy_ratio(entropy)
        eps: dict[int, float] = {}
        for i in indices:
            rollout = data.rollouts[i]
            if rollout.probe is None:
                raise RolloutDataError(
                    f"rollout prompt_id={rollout.prompt_id!r} stage={rollout.stage} has no AGPO probe statistics: "
                    "loss.name=agpo needs rollouts generated with agpo.probe=true"
                )
            eps[i] = ctl.eps(ratio, *rollout.probe)
        for mb, batch in zip(micro, batches, strict=True):
            batch.clip_eps = torch.tensor([eps[i] for i in mb], dtype=torch.float32)
        values = np.array(list(eps.values()))
        self._pending = {
            "agpo_entropy": entropy,
            "agpo_h_ref": h_ref,
            "agpo_kl_bar": ctl.kl_bar,
            "agpo_eps_mean": float(values.mean()),
            "agpo_eps_min": float(values.min()),
            "agpo_eps_max": float(values.max()),
        }

    def after_update(self, metrics: dict[str, float]) -> None:
        """Update H_ref and KLbar from this update and add its ``agpo_*`` metrics to ``metrics`` (in place).

        Raises:
            RuntimeError: no :meth:`before_update` for this update, or the loss reported no ``agpo_kl_step``.
        """
        if self._pending is None:
            raise RuntimeError("AGPOUpdates.after_update without before_update")
        if "agpo_kl_step" not in metrics:
            raise RuntimeError("the loss reported no agpo_kl_step: AGPO's controller needs loss.name=agpo")
        self.controller.update_entropy(self._pending["agpo_entropy"])
        self.controller.update_kl(metrics["agpo_kl_step"])
        metrics.update(self._pending)
        self._pending = None
