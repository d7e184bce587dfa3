"""Semantic and operational config keys: which settings may change when a run is resumed.

- **semantic** keys change what a run computes or commits: the model, the data, seeds, the algorithm, sizes,
  sampling, the policy loss. They are fixed for the life of a run; a resume that changes one is refused.
- **operational** keys change where and how the run executes, never its results: worker and process counts whose
  equivalence is tested (``generation.workers``: identical rollouts and bitwise-equal weights), interpreters,
  timeouts, retries, the launcher, storage options, the run lease, tracking. ``mugrpo resume RUN key=value`` accepts
  them and records each change in run.json's history with the stage it took effect.

A key's class is declared where the key is defined, in its pydantic ``Field``::

    workers: int = Field(1, ge=1, json_schema_extra=OPERATIONAL, description=...)

A section field marked ``OPERATIONAL`` makes every key below it operational unless a key says ``SEMANTIC``; an
unmarked key inherits the class of its section, and the top level is semantic. Semantic is the safe default: a key
is operational only where a change is known not to alter the run's results. ``mugrpo config reference`` prints each
key's class (docs/config.md).

This module imports nothing from mugrpo at import time, so the modules that define config sections can import the
markers. It stays outside the :mod:`mugrpo.config` package: importing one of that package's modules runs the package,
which imports those modules (``mugrpo.rewards`` among them) before they have defined their sections.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

SEMANTIC_CLASS = "semantic"
OPERATIONAL_CLASS = "operational"
#: The ``json_schema_extra`` key that carries a config key's class (it shows in ``Config.model_json_schema()``).
KEY_CLASS = "key_class"
#: ``Field(json_schema_extra=OPERATIONAL)``: the key (or every key of the section) is operational.
OPERATIONAL: dict[str, str] = {KEY_CLASS: OPERATIONAL_CLASS}
#: ``Field(json_schema_extra=SEMANTIC)``: a semantic key inside an operational section.
SEMANTIC: dict[str, str] = {KEY_CLASS: SEMANTIC_CLASS}


def declared_class(field: Any) -> str | None:
    """The class a pydantic ``FieldInfo`` declares, or None when it inherits its section's."""
    extra = field.json_schema_extra
    return extra.get(KEY_CLASS) if isinstance(extra, dict) else None


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model of a section field (``Section`` or ``Section | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) == 1:
            return models[0]
    return None


def fields_of(model: type[BaseModel]) -> dict[str, Any]:
    """The keys of a config model: its ``model_fields``, then the sections it composes from a registry at
    validation time (a ``section_fields()`` classmethod, e.g. the loss sections ``loss.<name>.*``)."""
    composed = getattr(model, "section_fields", None)
    return {**model.model_fields, **(composed() if callable(composed) else {})}


def key_class(key: str, model: type[BaseModel]) -> str:
    """The class of dotted ``key`` (e.g. ``generation.workers``): the nearest class declared on it or a section
    above it, else semantic. A key below a field that is not a section (``run.storage_options.endpoint_url``) takes
    that field's class.

    Raises:
        KeyError: ``key`` names no config key.
    """
    current: type[BaseModel] | None = model
    cls = SEMANTIC_CLASS
    for i, part in enumerate(key.split(".")):
        if current is None:  # inside a dict-valued field: its entries share its class
            return cls
        field = fields_of(current).get(part)
        if field is None:
            raise KeyError(f"{'.'.join(key.split('.')[: i + 1])!r} is not a config key")
        cls = declared_class(field) or cls
        current = section_model(field.annotation)
    return cls


@dataclass(frozen=True)
class ConfigChange:
    """One config key whose value differs between a run's stored config and the config it is resumed with."""

    key: str
    old: Any
    new: Any
    key_class: str

    @property
    def semantic(self) -> bool:
        return self.key_class == SEMANTIC_CLASS

    def line(self) -> str:
        """``key: old -> new`` with values as JSON."""
        return f"{self.key}: {_show(self.old)} -> {_show(self.new)}"

    def record(self) -> dict[str, Any]:
        """The change as run.json's history stores it."""
        return {"key": self.key, "from": self.old, "to": self.new, "class": self.key_class}


_MISSING = object()


def _show(value: Any) -> str:
    if value is _MISSING:
        return "(absent)"
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def config_changes(old: dict[str, Any], new: dict[str, Any], model: type[BaseModel]) -> list[ConfigChange]:
    """Every key whose value differs between two JSON config dicts (``Config.to_json_dict()``), with its class, in
    the order of the config tree. Sections are compared key by key (also an optional section such as ``agpo`` when
    both sides have it); any other value (a list, a dict such as ``run.storage_options``) as a whole."""
    return list(_changes(old, new, model, "", SEMANTIC_CLASS))


def _changes(old: Any, new: Any, model: type[BaseModel], prefix: str, inherited: str):
    for name, field in fields_of(model).items():
        key, cls = f"{prefix}{name}", declared_class(field) or inherited
        a = old.get(name, _MISSING) if isinstance(old, dict) else _MISSING
        b = new.get(name, _MISSING) if isinstance(new, dict) else _MISSING
        sub = section_model(field.annotation)
        if sub is not None and isinstance(a, dict) and isinstance(b, dict):
            yield from _changes(a, b, sub, key + ".", cls)
        elif a != b:
            yield ConfigChange(key, None if a is _MISSING else a, None if b is _MISSING else b, cls)


def format_changes(changes: list[ConfigChange], indent: str = "  ") -> list[str]:
    """The changes grouped by class, one line each, under a heading per class that says what it means."""
    lines = []
    semantic = [c for c in changes if c.semantic]
    operational = [c for c in changes if not c.semantic]
    if semantic:
        lines.append(f"{indent}semantic (they change what the run computes; fixed for the life of a run):")
        lines += [f"{indent}  {c.line()}" for c in semantic]
    if operational:
        lines.append(f"{indent}operational (where and how it runs; accepted on resume, recorded in run.json):")
        lines += [f"{indent}  {c.line()}" for c in operational]
    return lines
