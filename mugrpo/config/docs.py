"""Render the config reference (every key, type, default and description) as Markdown from the pydantic tree."""

from __future__ import annotations

import json
import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from mugrpo.config.tree import Config
from mugrpo.config_keys import SEMANTIC_CLASS, declared_class, fields_of, section_model


def _type_name(annotation) -> str:
    text = getattr(annotation, "__name__", None) if not typing.get_args(annotation) else None
    return text or str(annotation).replace("typing.", "")


def _default(field) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def config_reference(model: type[BaseModel] = Config, prefix: str = "", inherited: str = SEMANTIC_CLASS) -> str:
    """Markdown tables, one per section, listing ``key | class | type | default | description``; the whole
    reference (``model`` = Config) starts with what the classes mean (:mod:`mugrpo.config_keys`)."""
    sections: list[str] = []
    rows: list[str] = []
    for name, field in fields_of(model).items():
        key = f"{prefix}{name}"
        cls = declared_class(field) or inherited
        sub = section_model(field.annotation)
        if sub is not None and not _optional(field.annotation):
            sections.append(config_reference(sub, key + ".", cls))
            continue
        desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
        typ = _type_name(field.annotation).replace("|", "\\|")
        rows.append(f"| `{key}` | {cls} | `{typ}` | `{_default(field)}` | {desc} |")
    out = [CLASS_LEGEND] if model is Config and not prefix else []
    if rows:
        title = prefix.rstrip(".") or "(top level)"
        doc = (model.__doc__ or "").strip().splitlines()[0] if model.__doc__ else ""
        out.append(
            f"### `{title}`\n\n{doc}\n\n| key | class | type | default | description |\n|---|---|---|---|---|\n"
            + "\n".join(rows)
            + "\n"
        )
    return "\n".join(out + sections)


def _optional(annotation) -> bool:
    """``Section | None``: documented as one key (None = off), not section by section."""
    return not (isinstance(annotation, type) and issubclass(annotation, BaseModel))


CLASS_LEGEND = (
    "Each key is **semantic** or **operational** (`mugrpo.config_keys`). Semantic keys change what a run computes "
    "(model, data, seeds, algorithm, sizes): they are fixed for the life of a run, and a resume that changes one is "
    "refused. Operational keys change where and how it runs, never its results (worker counts whose equivalence is "
    "tested, interpreters, timeouts, retries, the launcher, storage options, the run lease, tracking): "
    "`mugrpo resume RUN key=value ...` accepts them and records each change in run.json's `history` with the stage "
    "it took effect. A key inherits the class of its section unless it declares its own.\n"
)
