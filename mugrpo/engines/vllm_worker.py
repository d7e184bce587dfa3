"""Methods mixed into vLLM's worker class (``LLM(worker_extension_cls=...)``), called by name through
``LLM.collective_rpc``: the in-place weight load of warm execution and the engine core's reseed.

Why a worker extension and not a callable: vLLM's engine core runs in a process of its own, and its RPC channel
(msgspec) refuses to serialize a Python function unless ``VLLM_ALLOW_INSECURE_SERIALIZATION`` is set; a method name
and tensor arguments need no such switch. This module imports nothing from vLLM (the worker does), so it imports in
any environment.
"""

from __future__ import annotations

from typing import Any


def pack_weights(named_tensors) -> list[tuple[str, str, list[int], bytes]]:
    """(HF parameter name, tensor) pairs as (name, torch dtype name, shape, raw bytes): what vLLM's RPC channel
    carries intact (its msgpack encoder turns a bare tensor inside a list into a plain list on the way)."""
    import torch

    packed = []
    for name, tensor in named_tensors:
        t = tensor.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        packed.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), raw))
    return packed


def unpack_weights(packed) -> list[tuple[str, Any]]:
    """Inverse of :func:`pack_weights`: (name, tensor) pairs (new CPU tensors)."""
    import torch

    return [
        (name, torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape))
        for name, dtype, shape, raw in packed
    ]


#: What :class:`mugrpo.engines.vllm_engine.VLLMEngine` passes as ``worker_extension_cls``.
WORKER_EXTENSION = f"{__name__}.MugrpoWorkerExtension"


class MugrpoWorkerExtension:
    """Mixed into vLLM's worker (``self`` is the worker: ``self.model_runner.model`` is the loaded model)."""

    def mugrpo_load_weights(self, packed: list[tuple[str, str, list[int], bytes]]) -> int:
        """Copy the weights of :func:`pack_weights` into the running model in place; returns the number of tensors
        received. Through the model runner's ``reload_weights`` (vLLM's layerwise in-place reload): the model's own
        checkpoint loader maps HF names to vLLM's fused layers and casts, then each layer's post-load processing
        runs again (on a CPU the loaded parameters lose their ``weight_loader`` to that processing, so calling the
        model's ``load_weights`` a second time fails)."""
        self.model_runner.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=unpack_weights(packed), is_checkpoint_format=True
        )
        return len(packed)

    def mugrpo_seed(self, seed: int) -> None:
        """Seed the worker process's RNGs (python, numpy, torch): the sampler draws from torch's default generator."""
        import random

        import numpy as np
        import torch

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
