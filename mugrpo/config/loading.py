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


def _duplicate_key(node: yaml.Node, path: list[str], seen_nodes: set[int]) -> tuple[str, int, int] | None:
    """The first key written twice in one mapping under ``node``: (dotted key, its line, the first line), 1-based.

    Keys brought in by a merge (``<<: *anchor``) may be overridden by the mapping's own keys, as YAML specifies;
    only a key written twice in the same mapping counts.
    """
    if id(node) in seen_nodes:  # an alias of a node already checked
        return None
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            name = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
            if name is not None:
                line = key_node.start_mark.line + 1
                if (key_node.tag, name) in first:
                    return ".".join([*path, name]), line, first[key_node.tag, name]
                first[key_node.tag, name] = line
            found = _duplicate_key(value_node, [*path, name or "?"], seen_nodes)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _duplicate_key(item, [*path[:-1], f"{path[-1] if path else ''}[{i}]"], seen_nodes)
            if found:
                return found
    return None


def load_yaml_unique(path: str | Path, text: str) -> Any:
    """Parse YAML ``text`` read from ``path`` (safe: no arbitrary objects), refusing a key written twice in one
    mapping with the file, the line and the dotted key (PyYAML would keep the last one silently). Anchors, aliases
    and merge keys (``<<``) work as usual.

    Raises:
        ConfigError: a duplicate key.
        yaml.YAMLError: text that is not YAML.
    """
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if node is None:
        return None
    found = _duplicate_key(node, [], set())
    if found:
        key, line, first = found
        raise ConfigError(
            f"{path}:{line}: duplicate key {key!r} (first set at line {first}); "
            "YAML would keep only the last one silently: keep one of them"
        )
    return yaml.safe_load(text)


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
    _refuse_renamed_loss_keys(data, source)
    return config_from_dict(data, source=source, overrides=list(overrides or []))


def _refuse_renamed_loss_keys(data: dict[str, Any], source: str) -> None:
    """A YAML config or override with a loss knob's old flat key (``loss.icepop_low``) is refused, naming its section
    key; stored run.json files keep loading them (:func:`mugrpo.losses.config.compose_sections` maps them).

    Raises:
        ConfigError: naming each old key and its new one.
    """
    from mugrpo.losses.config import renamed_key

    loss = data.get("loss")
    moved = [f"loss.{k} is now loss.{renamed_key(k)}" for k in loss if renamed_key(k)] if isinstance(loss, dict) else []
    if moved:
        raise ConfigError(
            f"{source}: " + "; ".join(moved) + " (each loss's own knobs are in its section loss.<name>.*)"
        )
