"""AGPO (arXiv 2605.20722) behind the hook points: probes and adaptive temperatures in the generation worker
(:mod:`.generation`), the per-group clip-range controller in the trainer (:mod:`.trainer`, with the ``agpo`` loss
of :mod:`.loss`)."""

from __future__ import annotations

from typing import Any

from mugrpo.algorithms.agpo.config import AGPOConfig
from mugrpo.algorithms.agpo.generation import AGPOGenerationHooks
from mugrpo.algorithms.agpo.loss import CLIP_EPS
from mugrpo.algorithms.agpo.probe import COLUMNS
from mugrpo.algorithms.agpo.trainer import AGPOTrainHooks
from mugrpo.algorithms.base import Algorithm
from mugrpo.algorithms.contracts import Settings
from mugrpo.algorithms.registry import ALGORITHMS
from mugrpo.algorithms.sampling import GenerationHooks
from mugrpo.algorithms.training import TrainHooks
from mugrpo.losses.config import PolicyLossConfig

#: The policy loss whose per-group clip range AGPO's trainer controller sets (:mod:`.loss`).
LOSS_NAME = "agpo"


@ALGORITHMS.register("agpo")
class AGPO(Algorithm):
    """AGPO: off unless the ``agpo`` section is given; its trainer side runs with ``loss.name=agpo``."""

    name = "agpo"
    section = AGPOConfig
    optional = True
    jobs = frozenset({"train", "generate"})
    description = (
        "AGPO (arXiv 2605.20722): probe each prompt at tau_base and sample it at an adaptive temperature; with "
        "loss.name=agpo, clip each group at an adaptive eps. None = off."
    )
    columns = COLUMNS
    inputs = (CLIP_EPS,)

    @classmethod
    def check(cls, section: Any, settings: Settings) -> None:
        """The temperature controller steps prompt by prompt in shard order (one generation worker); the ``agpo``
        loss needs the controller's settings and, in a run, probe statistics.

        Raises:
            ValueError: naming the keys to change.
        """
        probing = section is not None and section.probe
        workers = settings.generation_workers
        if probing and workers is not None and workers > 1:
            raise ValueError(
                f"generation.workers = {workers} with agpo.probe: AGPO's temperature controller steps prompt by "
                "prompt in shard order, so its probes need generation.workers = 1"
            )
        if settings.loss is None or settings.loss.name != LOSS_NAME:
            return
        if settings.scope == "run" and not probing:
            raise ValueError(
                "loss.name=agpo clips each group at an eps computed from its probe statistics: add an agpo section "
                "with agpo.probe=true"
            )
        if section is None:
            raise ValueError("loss.name=agpo needs the agpo section (its clip-range controller settings)")

    @classmethod
    def train_hooks(cls, section: Any, loss: PolicyLossConfig) -> TrainHooks | None:
        return AGPOTrainHooks(section) if loss.name == LOSS_NAME else None

    @classmethod
    def generation_hooks(cls, section: Any) -> GenerationHooks | None:
        return AGPOGenerationHooks(section) if section is not None and section.probe else None
