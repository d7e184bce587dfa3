"""Loading a run config: YAML files, dotted command-line overrides, and validation errors that name each bad key."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from mugrpo.config.tree import Config


class ConfigError(ValueError):
    """A config key or value is invalid; the message names the dotted key, the value, and what is allowed."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key repeated in one mapping (PyYAML keeps the last one silently).

    Merge keys (``<<: *anchor``) still work: keys brought in by a merge may be overridden by the mapping's own keys,
    as YAML specifies; only a key written twice in the same mapping is refused.
    """

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    earlier = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the base class reports it
                if earlier is not None:
                    raise DuplicateKeyError(key, earlier.start_mark.line + 1, key_node.start_mark.line + 1)
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


class DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: Any, first_line: int, line: int) -> None:
        super().__init__(f"duplicate key {key!r} at line {line} (first set at line {first_line})")
        self.key, self.first_line, self.line = key, first_line, line


def _section_of(text: str, line: int) -> str:
    """The dotted path of the mapping that holds the key at 1-based ``line`` (from the indentation above it)."""
    lines = text.splitlines()
    indent = len(lines[line - 1]) - len(lines[line - 1].lstrip())
    path: list[str] = []
    for prev in reversed(lines[: line - 1]):
        stripped = prev.strip()
        if not stripped or stripped.startswith("#"):
            continue
        ind = len(prev) - len(prev.lstrip())
        if ind < indent and stripped.endswith(":"):
            path.insert(0, stripped[:-1].strip().strip("'\""))
            indent = ind
            if ind == 0:
                break
    return ".".join(path)


def load_yaml_unique(path: str | Path, text: str) -> Any:
    """Parse YAML ``text`` read from ``path``, refusing duplicate keys with the file, line and dotted key."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except DuplicateKeyError as e:
        section = _section_of(text, e.line)
        dotted = f"{section}.{e.key}" if section else str(e.key)
        raise ConfigError(
            f"{path}:{e.line}: duplicate key {dotted!r} (first set at line {e.first_line}); "
            "YAML would keep only the last one silently: keep one of them"
        ) from None


def _parse_value(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides to a nested dict; values are parsed as YAML (``1e-6``, ``[1, 2]``, ``true``).

    Raises:
        ConfigError: an override without '=' or one that descends into a non-mapping.
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value, e.g. train.lr=1e-6")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[: i + 1])} is not a section")
            node = child
        node[parts[-1]] = _parse_value(raw)
    return data


def _known_keys(loc: tuple) -> list[str]:
    """Field names of the model that holds the last key of ``loc`` (for "did you mean" hints)."""
    model: Any = Config
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None or not isinstance(field.annotation, type):
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))


def format_validation_error(e: ValidationError, source: str, overrides: list[str] | None = None) -> str:
    """One line per problem: ``where: key.path = value: message``; ``where`` is the override that set the key, if
    one did, else ``source`` (the file)."""
    from_cli = {o.split("=", 1)[0].strip(): o for o in overrides or [] if "=" in o}
    lines = []
    for err in e.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(root)"
        origin = next(
            (
                f"override {o!r}"
                for k, o in from_cli.items()
                if k == key or k.startswith(key + ".") or key.startswith(k + ".")
            ),
            source,
        )
        value = err.get("input")
        shown = "(missing)" if err["type"] == "missing" else repr(value)
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(err["loc"][-1]), _known_keys(err["loc"]), n=1)
            hint = (
                f"did you mean {'.'.join([*map(str, err['loc'][:-1]), close[0]])!r}?"
                if close
                else ("check the spelling against `mugrpo config reference`")
            )
            lines.append(f"{origin}: unknown key {key!r}; {hint}")
        elif err["type"] == "value_error" and isinstance(value, dict):
            lines.append(f"{origin}: {err['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"{origin}: {key} = {shown}: {err['msg']}")
    return "invalid config:\n  " + "\n  ".join(lines)


def config_from_dict(data: dict[str, Any], *, source: str = "config", overrides: list[str] | None = None) -> Config:
    """Validate a nested dict into a Config. Raises ConfigError naming each bad key and value."""
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source, overrides)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (or defaults when ``path`` is None) and apply dotted overrides.

    Raises:
        ConfigError: unreadable YAML, a non-mapping document, or invalid keys/values (each named).
    """
    data: dict[str, Any] = {}
    source = str(path) if path else "defaults"
    if path is not None:
        try:
            loaded = load_yaml_unique(path, Path(path).read_text())
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is not valid YAML: {e}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections (run, model, train, ...)")
        data = loaded
    data = apply_overrides(data, list(overrides or []))
    return config_from_dict(data, source=source, overrides=list(overrides or []))
