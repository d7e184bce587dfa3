"""Concrete dtypes for the code below the config: job specs and engines take a named dtype, never ``auto``.

``auto`` precision exists in the config layer alone: a run resolves it once at its start
(:func:`mugrpo.config.precision.resolve_precision`), and a spec's ``from_config`` builds from the resolved config
(:func:`mugrpo.config.precision.concrete`). Below that, :func:`torch_dtype` turns a dtype's name into the torch dtype
and :func:`refuse_auto` is the specs' check, so that ``auto`` reaching a spec or an engine fails loudly, naming the
field, instead of being resolved a second time, on whatever machine the job lands on.
"""

from __future__ import annotations

from typing import Any

from mugrpo.common.lazy import torch

AUTO = "auto"
#: Where ``auto`` is resolved, for the errors below.
RESOLVED_BY = "mugrpo.config.precision.resolve_precision (a run) or concrete(cfg) (a config outside a run)"


def refuse_auto(field: str, value: Any) -> Any:
    """``value``, unless it is ``"auto"``: then a ValueError naming ``field`` (a job spec's precision field)."""
    if isinstance(value, str) and value == AUTO:
        raise ValueError(
            f"{field}='auto': a job spec takes a concrete precision (e.g. 'float32', 'bfloat16'); auto is resolved "
            f"once, in the config layer, by {RESOLVED_BY}"
        )
    return value


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """The torch dtype named ``name`` ("float32", "bfloat16", "float16", ...); a torch dtype is returned as is.

    Raises:
        ValueError: ``name`` is ``"auto"`` (resolve it in the config layer first) or names no torch dtype.
    """
    if isinstance(name, torch.dtype):
        return name
    refuse_auto("dtype", name)
    value = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(value, torch.dtype):
        raise ValueError(f"dtype must name a torch dtype such as 'float32' or 'bfloat16', got {name!r}")
    return value
