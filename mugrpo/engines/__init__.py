"""Rollout engines: sample groups of responses (with behavior log-probs) from a frozen policy.

``make_engine(name, model_dir, **kwargs)`` builds one by registry name:

- ``"transformers"``: :class:`~mugrpo.engines.transformers_engine.TransformersEngine`, our own KV-cached sampling
  loop on a transformers model (CPU default; also runs in-process on a live policy for short on-policy cycles).
- ``"vllm"``: :class:`~mugrpo.engines.vllm_engine.VLLMEngine`, wraps ``vllm.LLM`` (its own virtualenv).

Importing this package is cheap (no torch); the built-in engines register when first needed.
"""

from __future__ import annotations

import importlib

from mugrpo.engines.base import (
    ROLLOUT_ENGINES,
    RolloutEngine,
    Sample,
    SamplingParams,
    make_engine,
)

BUILTIN_ENGINE_MODULES = ("mugrpo.engines.transformers_engine", "mugrpo.engines.vllm_engine")


def load_builtin_engines() -> None:
    """Import the built-in engine modules so their ``@ROLLOUT_ENGINES.register`` decorators run (idempotent)."""
    for module in BUILTIN_ENGINE_MODULES:
        importlib.import_module(module)


__all__ = [
    "ROLLOUT_ENGINES",
    "RolloutEngine",
    "Sample",
    "SamplingParams",
    "load_builtin_engines",
    "make_engine",
]
