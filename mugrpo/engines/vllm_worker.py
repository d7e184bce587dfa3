"""Methods mixed into vLLM's worker class (``LLM(worker_extension_cls=...)``), called by name through
``LLM.collective_rpc``: the in-place weight load of warm execution and the engine core's reseed.

Why a worker extension and not a callable: vLLM's engine core runs in a process of its own, and its RPC channel
(msgspec) refuses to serialize a Python function unless ``VLLM_ALLOW_INSECURE_SERIALIZATION`` is set; a method name
and tensor arguments need no such switch. This module imports nothing from vLLM (the worker does), so it imports in
any environment.
"""

from __future__ import annotations

from typing import Any

#: What :class:`mugrpo.engines.vllm_engine.VLLMEngine` passes as ``worker_extension_cls``.
WORKER_EXTENSION = f"{__name__}.MugrpoWorkerExtension"


class MugrpoWorkerExtension:
    """Mixed into vLLM's worker (``self`` is the worker: ``self.model_runner.model`` is the loaded model)."""

    def mugrpo_load_weights(self, weights: list[tuple[str, Any]]) -> int:
        """Copy ``weights`` ((HF parameter name, tensor) pairs, any dtype) into the running model in place, with the
        model's own checkpoint loader (it maps HF names to vLLM's fused layers and casts); returns the number of
        tensors received."""
        self.model_runner.model.load_weights(weights=weights)  # type: ignore[attr-defined]
        return len(weights)

    def mugrpo_seed(self, seed: int) -> None:
        """Seed the worker process's RNGs (python, numpy, torch): the sampler draws from torch's default generator."""
        import random

        import numpy as np
        import torch

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
