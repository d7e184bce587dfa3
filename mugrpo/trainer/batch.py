"""Collation of rollouts into right-padded token tensors for one forward pass.

Masks come from lengths, never from token values: SmolLM2's pad token is its EOS (id 2), and the EOS that ends a
response is a real response token with a behavior log-prob and a loss (docs/design.md, "Implementation notes").
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from mugrpo.losses.inputs import input_tensor
from mugrpo.policy.prefix import shared_prefix_length
from mugrpo.policy.truncation import Truncation
from mugrpo.trainer.data import Rollout


@dataclass
class TokenBatch:
    """B rollouts as ``prompt + response`` sequences, right-padded to length L; R = longest response.

    Attributes:
        input_ids: [B, L] int64, padded with ``pad_token_id`` after each sequence.
        position_ids: [B, L] int64, 0..L-1 (right padding: real tokens keep positions 0..len-1).
        shared_prefix: tokens every row's prompt starts with, leaving each row the last token of its prompt
            (:func:`mugrpo.policy.prefix.shared_prefix_length`); what the forward may run once for all rows.
        response_index: [B, R] int64, position of the hidden state that predicts response token j of row i
            (``len(prompt_i) - 1 + j``); 0 on padding.
        response_ids: [B, R] int64 response tokens, 0 on padding.
        response_mask: [B, R] bool, True on the first ``num_tokens`` entries of each row.
        behavior_logprobs: [B, R] float32 log pi_behav of the response tokens, 0 on padding.
        advantages: [B] float32 sequence-level advantages.
        temperatures: [B] float32 temperature of each row's behavior distribution.
        sampler_logprobs: [B, R] float32 log q of the response tokens as the engine reported them (the sampler's
            tempered, truncated distribution), 0 on padding: equal to ``behavior_logprobs`` unless the stage-start
            recompute replaced those (the health panel's reference distribution).
        learner_temperatures: [B] float32 temperature of the learner's pi_theta for each row when
            ``train.learner_temperature`` is set (greedy rows keep theirs), or None: ``temperatures``.
        truncations: B min-p / top-k / top-p settings of each row's behavior distribution.
        group_index: [B] int64 index of each row's group in the rollout set.
        prompt_ids: B prompt ids (for error reports).
        inputs: the per-rollout loss inputs by name, each [B] (:mod:`mugrpo.losses.inputs`): the rollout inputs
            every row carries (``Rollout.inputs``), then those set before the update from the algorithms'
            :class:`~mugrpo.algorithms.UpdateInputs`.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    shared_prefix: int
    response_index: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    behavior_logprobs: torch.Tensor
    advantages: torch.Tensor
    temperatures: torch.Tensor
    sampler_logprobs: torch.Tensor
    truncations: list[Truncation]
    group_index: torch.Tensor
    prompt_ids: list[str]
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    learner_temperatures: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Response tokens in the batch."""
        return int(self.response_mask.sum())

    def to(self, device: torch.device | str) -> TokenBatch:
        """A copy with every tensor on ``device``."""
        moved = {
            f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v) for f in fields(self)
        }
        moved["inputs"] = {name: v.to(device) for name, v in self.inputs.items()}
        return TokenBatch(**moved)


def collate(
    rollouts: list[Rollout], group_index: list[int], pad_token_id: int, *, learner_temperature: float | None = None
) -> TokenBatch:
    """Right-pad ``rollouts`` into a :class:`TokenBatch`.

    Args:
        rollouts: B >= 1 rollouts, each with a non-empty prompt.
        group_index: B group indices (carried for group-wise losses).
        pad_token_id: filler id for padding positions (any valid id: padding is masked by length).
        learner_temperature: temperature of the learner's pi_theta for every sampled (non-greedy) row
            (``train.learner_temperature``); None: each row's own temperature (the sampler's).

    Raises:
        ValueError: empty batch or mismatched ``group_index``.
    """
    if not rollouts or len(group_index) != len(rollouts):
        raise ValueError(f"collate needs B >= 1 rollouts and B group indices, got {len(rollouts)}, {len(group_index)}")
    batch = len(rollouts)
    seq_len = max(len(r.prompt_token_ids) + r.num_tokens for r in rollouts)
    resp_len = max(1, max(r.num_tokens for r in rollouts))
    input_ids = torch.full((batch, seq_len), pad_token_id, dtype=torch.long)
    response_index = torch.zeros(batch, resp_len, dtype=torch.long)
    response_ids = torch.zeros(batch, resp_len, dtype=torch.long)
    response_mask = torch.zeros(batch, resp_len, dtype=torch.bool)
    behavior = torch.zeros(batch, resp_len, dtype=torch.float32)
    sampler = torch.zeros(batch, resp_len, dtype=torch.float32)
    for i, r in enumerate(rollouts):
        p, n = len(r.prompt_token_ids), r.num_tokens
        input_ids[i, : p + n] = torch.tensor(r.prompt_token_ids + r.response_token_ids, dtype=torch.long)
        if n:
            response_index[i, :n] = torch.arange(p - 1, p - 1 + n)
            response_ids[i, :n] = torch.tensor(r.response_token_ids, dtype=torch.long)
            response_mask[i, :n] = True
            behavior[i, :n] = torch.tensor(r.behavior_logprobs, dtype=torch.float32)
            engine = r.sampler_logprobs if r.sampler_logprobs is not None else r.behavior_logprobs
            sampler[i, :n] = torch.tensor(engine, dtype=torch.float32)
    return TokenBatch(
        input_ids=input_ids,
        position_ids=torch.arange(seq_len).expand(batch, seq_len).contiguous(),
        shared_prefix=shared_prefix_length([r.prompt_token_ids for r in rollouts]),
        response_index=response_index,
        response_ids=response_ids,
        response_mask=response_mask,
        behavior_logprobs=behavior,
        advantages=torch.tensor([r.advantage for r in rollouts], dtype=torch.float32),
        temperatures=torch.tensor([r.temperature for r in rollouts], dtype=torch.float32),
        sampler_logprobs=sampler,
        learner_temperatures=(
            None
            if learner_temperature is None
            else torch.tensor(
                [r.temperature if r.greedy else learner_temperature for r in rollouts], dtype=torch.float32
            )
        ),
        truncations=[r.truncation for r in rollouts],
        group_index=torch.tensor(group_index, dtype=torch.long),
        prompt_ids=[r.prompt_id for r in rollouts],
        inputs={
            name: input_tensor([r.inputs[name] for r in rollouts], name)
            for name in rollouts[0].inputs
            if all(name in r.inputs for r in rollouts)
        },
    )
