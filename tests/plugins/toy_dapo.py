"""A sixth algorithm, kept entirely outside mugrpo (loaded as a plugin: ``MUGRPO_PLUGINS=toy_dapo``), to show that
an algorithm with its own per-rollout input and a dynamic-sampling hook needs no edit of a shared file
(tests/e2e/test_toy_algorithm.py; docs/algorithms/adding.md, "When the hooks don't fit").

- DAPO-style dynamic sampling (arXiv 2503.14476, Sec. 3.2): a stage over-samples its prompts
  (``Algorithm.stage_prompts``: ceil(oversample x prompts)); once a shard is scored, its groups with no reward
  variance are filtered out, and so is every group beyond the stage's first ``groups_per_stage`` kept ones, in
  plan order (``GenerationHooks.scored`` sets the declared column ``toy_filtered``, an ``excludes`` column: the
  rows stay in the table, never trained on). The count of kept groups is rebuilt from the committed shards when a
  worker resumes, so a resumed stage filters exactly as an uninterrupted one.
- its own per-rollout loss input: each kept group's rows carry ``toy_weight`` = 1 + the group's reward standard
  deviation (a declared extension column of the rollouts table); the trainer hooks hand it to the loss as the input
  ``toy_scale``, and the ``toy_scaled_grpo`` loss is GRPO's clipped surrogate with each advantage scaled by it.
- a reward component of its own, ``toy_parity`` (the parity of the response's length in characters), so that even a
  random policy's groups have reward variance to filter on.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import torch
from pydantic import BaseModel, Field

from mugrpo.algorithms import (
    ALGORITHMS,
    Algorithm,
    GenerationHooks,
    GenerationStart,
    RolloutColumn,
    ScoredShard,
    TrainHooks,
    UpdateInputs,
    UpdateRows,
)
from mugrpo.commits.tables import read_table
from mugrpo.losses import POLICY_LOSSES, LossContext, LossOutput, MetricStat, PolicyLossConfig, requires
from mugrpo.rewards import REWARD_FUNCTIONS, RewardInput

FILTERED = "toy_filtered"
WEIGHT = "toy_weight"
SCALE = "toy_scale"


@REWARD_FUNCTIONS.register("toy_parity")
def toy_parity(item: RewardInput, answer: str | None) -> float:
    """1.0 when the response has an odd number of characters, else 0.0."""
    return float(len(item.response_text) % 2)


class ToyDAPOConfig(BaseModel):
    oversample: float = Field(1.5, ge=1.0, description="Prompts sampled per prompt the stage schedule asks for.")
    groups_per_stage: int = Field(2, ge=1, description="Groups kept per stage, the first ones with reward variance.")


class ToyGenerationHooks(GenerationHooks):
    def __init__(self, config: ToyDAPOConfig) -> None:
        self.config = config
        self.kept = 0

    def start(self, ctx: GenerationStart) -> None:
        """Kept groups of the stage's committed shards before the first shard still to sample."""
        self.kept = 0
        first = min(ctx.todo, default=ctx.num_shards)
        for shard in range(first):
            rows = read_table(ctx.store, ctx.layout.rollout_shard(ctx.stage, shard), "rollouts", extra=FIELDS)
            rows = rows.select(["sample_idx", FILTERED]).to_pylist()
            self.kept += sum(1 for r in rows if r["sample_idx"] == 0 and not r[FILTERED])

    def scored(self, shard: ScoredShard) -> list[dict[str, Any]]:
        columns = []
        for rewards, flat in zip(shard.rewards, shard.zero_variance, strict=True):
            keep = not flat and self.kept < self.config.groups_per_stage
            self.kept += keep
            mean = sum(rewards) / len(rewards)
            std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
            columns.append({FILTERED: not keep, WEIGHT: 1.0 + std})
        return columns


class ToyTrainHooks(TrainHooks):
    def before_update(self, rows: UpdateRows) -> UpdateInputs:
        return UpdateInputs(values={SCALE: [r.columns[WEIGHT] for r in [*rows.fresh, *rows.extra]]})


COLUMNS = (
    RolloutColumn(pa.field(FILTERED, pa.bool_()), default=False, excludes=True),
    RolloutColumn(pa.field(WEIGHT, pa.float64())),
)
FIELDS = [c.field for c in COLUMNS]


@ALGORITHMS.register("toy_dapo")
class ToyDAPO(Algorithm):
    name = "toy_dapo"
    section = ToyDAPOConfig
    optional = True
    jobs = frozenset({"train", "generate"})
    description = "A toy DAPO-style dynamic sampling with a per-rollout loss input (tests only). None = off."
    columns = COLUMNS
    inputs = (SCALE,)

    @classmethod
    def stage_prompts(cls, section: Any, prompts: int) -> int:
        return prompts if section is None else math.ceil(section.oversample * prompts)

    @classmethod
    def train_hooks(cls, section: Any, loss: PolicyLossConfig) -> TrainHooks | None:
        return None if section is None else ToyTrainHooks()

    @classmethod
    def generation_hooks(cls, section: Any) -> GenerationHooks | None:
        return None if section is None else ToyGenerationHooks(section)


@POLICY_LOSSES.register("toy_scaled_grpo")
@requires(inputs=(SCALE,))
def toy_scaled_grpo(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    *,
    context: LossContext | None = None,
) -> LossOutput:
    """GRPO's clipped surrogate with each response's advantage scaled by its ``toy_scale`` input [B]."""
    scale = context.input(SCALE, "loss.name=toy_scaled_grpo").to(advantages.device)
    out = POLICY_LOSSES["grpo"](logprobs, behavior_logprobs, advantages * scale, response_mask, config, context=context)
    out.stats["toy_scale_mean"] = MetricStat.masked_mean(scale.double(), response_mask.any(-1))
    return out
