"""A batch's shared prompt prefix, computed once: the rows' common leading tokens run as a batch of one, and every
row attends to that one copy of their keys and values.

Used by the CPU sampler (its prefill, :mod:`mugrpo.engines.transformers_engine`) and by the trainer (forward and
backward of each micro-batch, :mod:`mugrpo.trainer.forward`). A main-job prompt is ~90 tokens of system prompt and
worked examples before a ~13-token question, and a group's G responses share their whole prompt, so most of a
micro-batch's positions are the same tokens at the same positions. Prefix Grouper (Liu et al., 2025,
arXiv:2506.05433, "Shared-Prefix Forward") shows the split is training-equivalent: attention of a suffix token over
``[prefix keys; own keys]`` is the attention of the full sequence, and the gradient reaching the prefix is the sum
of the rows' gradients (what the expand's backward computes).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

#: Tokens a batch's rows must share for the prefix to be computed once (below it, batching them is cheaper).
MIN_SHARED_PREFIX = 16


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt of ``prompts`` starts with, leaving each at least one token of its own (the position
    whose output predicts the first response token).

    Args:
        prompts: B >= 1 token-id sequences, each non-empty.

    Returns:
        an int in [0, min length - 1].
    """
    first = prompts[0]
    limit = min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def expand_cache(cache, rows: int) -> None:
    """Make a KV cache filled by a batch of one (the shared prefix) serve ``rows`` rows, in place.

    Each layer's keys and values [1, H_kv, P, D] become views [rows, H_kv, P, D] (``expand``: no copy); the next
    forward's ``cache.update`` concatenates each row's own keys after them. Under autograd, the backward of the
    expand sums the rows' gradients into the one prefix.

    Raises:
        ValueError: a layer holds more than one row.
    """
    for layer in cache.layers:
        if layer.keys is None:
            continue
        if layer.keys.shape[0] != 1:
            raise ValueError(f"expand_cache needs a cache of one row, got {layer.keys.shape[0]}")
        layer.keys = layer.keys.expand(rows, -1, -1, -1)
        layer.values = layer.values.expand(rows, -1, -1, -1)


def cache_kwarg(model: torch.nn.Module) -> str:
    """Name of the KV-cache argument of ``model.forward``: ``cache`` (transformers >= 5.2x) or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
