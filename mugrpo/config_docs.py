"""Render the config reference (every key, type, default and description) as Markdown from the pydantic tree."""

from __future__ import annotations

import json
import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from mugrpo.config import Config


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


def _model_of(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def config_reference(model: type[BaseModel] = Config, prefix: str = "") -> str:
    """Markdown tables, one per section, listing ``key | type | default | description``."""
    sections: list[str] = []
    rows: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = _model_of(field.annotation)
        if sub is not None:
            sections.append(config_reference(sub, key + "."))
            continue
        desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
        typ = _type_name(field.annotation).replace("|", "\\|")
        rows.append(f"| `{key}` | `{typ}` | `{_default(field)}` | {desc} |")
    out = []
    if rows:
        title = prefix.rstrip(".") or "(top level)"
        doc = (model.__doc__ or "").strip().splitlines()[0] if model.__doc__ else ""
        out.append(
            f"### `{title}`\n\n{doc}\n\n| key | type | default | description |\n|---|---|---|---|\n"
            + "\n".join(rows)
            + "\n"
        )
    return "\n".join(out + sections)
