"""The transformers engine's KV cache: preallocated per batch, and the memory bound that sizes a batch.

transformers' ``DynamicCache`` grows each layer's keys and values by ``torch.cat`` at every decoding step, so a
step copies the whole cache (O(L) per step, O(L^2) per response): 16% of the CPU time of a SmolLM2-135M decoding
loop here (docs/benchmarks.md, "The CPU engine at the machine's width"). :class:`GrowingLayer` allocates each layer's
[B, H_kv, capacity, D] buffers once, at the prefill, and writes each new position in place; attention reads a view
of the filled prefix. Dropping finished rows (``batch_select_indices``) still copies the surviving rows, as before.

Memory bound (``batch_size: auto``): a row (one prompt x one sample) holds ``kv_bytes_per_token`` bytes per position
(keys and values of every layer, :func:`kv_bytes_per_token`) for ``prompt + max_new_tokens`` positions; a batch of R
rows holds R times that, and the prefill's repeat of each prompt's cache into its G rows holds at most that again for
a moment. :func:`rows_within_budget` is the largest R whose cache fits ``budget_bytes``.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in buffers of ``capacity`` positions, written in place.

    ``keys`` / ``values`` are views [B, H_kv, n, D] of the buffers' first n positions (what ``DynamicLayer``
    exposes, so masks and attention see the same shapes and values as with the growing cache).

    Raises:
        RuntimeError: (from :meth:`update`) more than ``capacity`` positions are written.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, dim = key_states.shape
        self.device = key_states.device
        shape = (batch, heads, self.capacity, dim)
        self._keys = torch.empty(shape, dtype=key_states.dtype, device=self.device)
        self._values = torch.empty((*shape[:3], value_states.shape[-1]), dtype=value_states.dtype, device=self.device)
        self._length = 0
        self._expose()
        self.is_initialized = True

    def _expose(self) -> None:
        self.keys = self._keys[:, :, : self._length]
        self.values = self._values[:, :, : self._length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache layer holds {self.capacity} positions; {end} were written")
        self._keys[:, :, self._length : end] = key_states
        self._values[:, :, self._length : end] = value_states
        self._length = end
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length if self.is_initialized else 0

    def get_max_length(self) -> int:
        return self.capacity

    def reset(self) -> None:
        self._length = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("GrowingLayer is a sampling cache: it is never cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self.batch_select_indices(torch.arange(self._keys.shape[0]).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` ([R'] int64; repeats allowed: a prompt's row becomes its G sample rows)."""
        if self.is_initialized:
            indices = indices.to(self.device)
            self._keys = self._keys.index_select(0, indices)
            self._values = self._values.index_select(0, indices)
            self._expose()


def growing_cache(config, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose full-attention layers are :class:`GrowingLayer` of ``capacity``
    positions (prompt width + max new tokens). Layers of another kind (sliding windows, linear attention) keep
    transformers' own class."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes of KV cache one row holds per position: 2 (keys, values) x layers x KV heads x head dim x element size.

    Args:
        config: the model's transformers config (``num_hidden_layers``, ``num_key_value_heads`` or
            ``num_attention_heads``, ``head_dim`` or ``hidden_size / num_attention_heads``).
        dtype: the cache's dtype (the model's).
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * text.num_hidden_layers * heads * head_dim * element


def rows_within_budget(bytes_per_token: int, positions: int, budget_bytes: float) -> int:
    """The most rows whose KV cache of ``positions`` positions each fits ``budget_bytes`` (at least 1).

    The bound of ``batch_size: auto`` (module docstring): rows x positions x bytes_per_token <= budget.
    """
    per_row = max(bytes_per_token * positions, 1)
    return max(1, int(budget_bytes // per_row))
