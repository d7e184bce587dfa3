"""torch, imported on first use: the modules the config loads (the losses and the algorithms register their names,
needs and config sections at import) hold tensor code, yet a command line that only loads and checks a config
never runs it, and importing torch costs about 1 s of CPU (docs/architecture.md, "What the command line imports").

Usage, in place of ``import torch`` in such a module::

    from mugrpo.common.lazy import torch

    def f(x: torch.Tensor) -> torch.Tensor:   # annotations stay strings (``from __future__ import annotations``)
        return torch.exp(x)                    # the first attribute read imports torch

The module must read no torch attribute at import time: no ``@torch.no_grad()`` decorator, no ``torch.float32``
default argument, no type alias built from ``torch.Tensor`` outside a string. tests/unit/test_architecture.py
checks that loading a config imports no torch. Type checkers see the real module. Python 3.15's ``lazy import
torch`` (PEP 810) does the same in the language.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any


class LazyModule:
    """A stand-in for the module ``name`` that imports it on the first attribute read and forwards every read to it.

    The import goes through :func:`importlib.import_module`, so it is the ordinary import (``sys.modules``, the
    import lock: two threads reading at once both get the fully imported module). Reads after the first cost one
    extra Python call.

    Raises:
        ImportError: on the first attribute read, when ``name`` cannot be imported.
    """

    __slots__ = ("_lock", "_module", "_name")

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", None)
        object.__setattr__(self, "_lock", threading.Lock())

    def _load(self) -> ModuleType:
        module = self._module
        if module is None:
            with self._lock:
                module = self._module or importlib.import_module(self._name)
                object.__setattr__(self, "_module", module)
        return module

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._load(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError(f"set {attr!r} on the module {self._name} itself, not on its lazy stand-in")

    def __dir__(self) -> list[str]:
        return dir(self._load())

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r} ({state})>"


if TYPE_CHECKING:
    import torch
else:
    torch = LazyModule("torch")

__all__ = ["LazyModule", "torch"]
