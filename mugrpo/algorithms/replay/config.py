"""Configuration of the rollout-level replay buffer (arXiv 2606.04560; defaults of a third-party re-implementation,
docs/papers.md, since the paper's code is not public). docs/algorithms/replay.md explains each choice."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ReplayConfig(BaseModel):
    """The ``replay`` section: off unless ``enabled``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        False,
        description="Train on fresh-anchored batches: every update's fresh rollouts plus k = round(ratio x fresh) "
        "replayed ones (rollout-level replay-buffer GRPO, arXiv 2606.04560).",
    )
    ratio: float = Field(
        0.5,
        ge=0,
        description="Replay ratio r: k = round(r x fresh) replayed rollouts per update, rounded half up "
        "(re-implementation default 0.5; arXiv 2606.04560).",
    )
    alpha: float = Field(
        0.5,
        ge=0,
        description="Priority exponent: P(i) proportional to (|A_i| + priority_eps)^alpha, drawn without "
        "replacement (re-implementation default 0.5; alpha = 0 is uniform; arXiv 2606.04560).",
    )
    priority_eps: float = Field(
        1e-6, gt=0, description="Added to |A_i| so that every entry has a non-zero priority (arXiv 2606.04560)."
    )
    tau_max: int = Field(
        10,
        ge=0,
        description="Age eviction: an entry whose age (optimizer updates since its behavior policy was frozen) "
        "exceeds tau_max is evicted before every draw; age == tau_max is still eligible (re-implementation "
        "default 10; arXiv 2606.04560).",
    )
    warmup_updates: int = Field(
        20,
        ge=0,
        description="Global updates 1..W draw no replay (the buffer still fills); re-implementation default 20 "
        "(arXiv 2606.04560).",
    )
    capacity: int = Field(
        30000,
        ge=1,
        description="Most entries kept; beyond it the oldest inserted are evicted first (FIFO backstop; "
        "re-implementation default 30000; arXiv 2606.04560).",
    )
