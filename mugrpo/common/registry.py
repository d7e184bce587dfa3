"""One name -> implementation table per kind of plug-in: policy losses, advantage estimators, reward components,
rollout engines, LR schedules and job launchers all register here the same way.

    POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")

    @POLICY_LOSSES.register("mu_grpo")
    def mu_grpo_loss(...): ...

    POLICY_LOSSES["mu_grpo"]          # UnknownNameError (a KeyError and a ValueError) naming the choices if absent

Configs name implementations by these keys, so a registry is read-mostly: it is filled at import time and looked up
by the code that turns a config into objects. There is no if/elif on names anywhere else.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name is not registered. The message names the kind, lists the registered names and the closest one.

    It is a KeyError (a registry is a Mapping) and a ValueError (a bad config value), so callers that validate a
    config can catch either.
    """

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0])


class Registry(Mapping[str, T], Generic[T]):
    """A read-mostly mapping ``name -> implementation`` for one kind of plug-in.

    Iterating yields names in sorted order. Lookups of an unknown name raise :class:`UnknownNameError`.

    Args:
        kind: what the entries are, for messages ("policy loss", "rollout engine"...).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator adding ``obj`` under ``name``; returns ``obj`` unchanged.

        Registering the same object again, or the same definition loaded twice (same qualified name, e.g. its module
        run once as ``__main__``), replaces the entry; anything else under a taken name
        is a bug that would make a config ambiguous.

        Raises:
            ValueError: ``name`` is empty, or already registered to a different object.
        """
        if not name:
            raise ValueError(f"a {self.kind} needs a non-empty name")

        def add(obj: T) -> T:
            existing = self._entries.get(name)
            if existing is not None and not _same_definition(existing, obj):
                raise ValueError(f"{self.kind} {name!r} is already registered to {_qualified(existing)}")
            self._entries[name] = obj
            return obj

        return add

    def unregister(self, name: str) -> T:
        """Remove and return the entry ``name`` (plug-in reloads, tests). Raises UnknownNameError if absent."""
        obj = self[name]
        del self._entries[name]
        return obj

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self._unknown(name)) from None

    def _unknown(self, name: object) -> str:
        names = sorted(self._entries)
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown {self.kind} {name!r}{hint}; registered: {', '.join(names) or 'none'}"

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"


def _qualified(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _same_definition(a: object, b: object) -> bool:
    """The same object, or the same definition loaded twice (same qualified name; one copy may be ``__main__``)."""
    if a is b:
        return True
    qa, qb = getattr(a, "__qualname__", None), getattr(b, "__qualname__", None)
    ma, mb = getattr(a, "__module__", None), getattr(b, "__module__", None)
    return qa is not None and qa == qb and (ma == mb or "__main__" in (ma, mb))
