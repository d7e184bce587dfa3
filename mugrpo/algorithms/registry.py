"""The algorithm registry and what the trainer, the generation worker and the config read from every registered
algorithm at once: config sections, hooks, declared columns and loss inputs, and the prompts a stage samples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from mugrpo.algorithms.base import Algorithm
from mugrpo.algorithms.contracts import RolloutColumn, Settings
from mugrpo.algorithms.sampling import GenerationHooks
from mugrpo.algorithms.training import TrainHooks
from mugrpo.common.registry import Registry
from mugrpo.losses.config import PolicyLossConfig

#: Algorithms by config section name; add one with ``@ALGORITHMS.register("name")`` on its :class:`Algorithm`.
ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")


# --------------------------------------------------------------------------------------------- sections and hooks


def section_fields(job: str | None = None) -> dict[str, tuple[Any, Any]]:
    """Field definitions (``pydantic.create_model`` style) of the registered algorithms' config sections: every
    one (``job`` None: the run config) or those ``job``'s spec carries ("train", "generate")."""
    fields: dict[str, tuple[Any, Any]] = {}
    for name in ALGORITHMS:
        algorithm = ALGORITHMS[name]
        if job is not None and job not in algorithm.jobs:
            continue
        if algorithm.optional:
            fields[name] = (algorithm.section | None, Field(None, description=algorithm.description))
        else:
            fields[name] = (
                algorithm.section,
                Field(default_factory=algorithm.section, description=algorithm.description),
            )
    return fields


def sections_of(settings: Any, job: str | None = None) -> dict[str, Any]:
    """The algorithm sections of a run config or job spec ``settings`` (read by name), those ``job`` carries."""
    return {name: getattr(settings, name) for name in ALGORITHMS if job is None or job in ALGORITHMS[name].jobs}


def check_sections(sections: Mapping[str, Any], settings: Settings) -> None:
    """Every algorithm's :meth:`Algorithm.check` of its section against ``settings``.

    Raises:
        ValueError: from the first algorithm that refuses them.
    """
    for name, section in sections.items():
        ALGORITHMS[name].check(section, settings)


def make_train_hooks(sections: Mapping[str, Any], loss: PolicyLossConfig) -> dict[str, TrainHooks]:
    """The trainer hooks of the algorithms on in a run with these sections and loss, by name."""
    hooks = {}
    for name, section in sections.items():
        made = ALGORITHMS[name].train_hooks(section, loss)
        if made is not None:
            hooks[name] = made
    return hooks


def make_generation_hooks(sections: Mapping[str, Any]) -> list[GenerationHooks]:
    """The generation hooks of the algorithms on in a stage with these sections."""
    made = (ALGORITHMS[name].generation_hooks(section) for name, section in sections.items())
    return [hooks for hooks in made if hooks is not None]


def declared_columns() -> list[RolloutColumn]:
    """Every registered algorithm's declared rollout columns, in registry order.

    Raises:
        ValueError: two algorithms declare one column name with different types.
    """
    seen: dict[str, RolloutColumn] = {}
    for name in ALGORITHMS:
        for column in ALGORITHMS[name].columns:
            other = seen.get(column.name)
            if other is not None and other.field.type != column.field.type:
                raise ValueError(f"algorithm {name} declares rollout column {column.name!r} with another type")
            seen.setdefault(column.name, column)
    return list(seen.values())


def excluding_columns() -> list[str]:
    """The declared columns with ``excludes`` set: a row where one is true is never trained on."""
    return [c.name for c in declared_columns() if c.excludes]


def provided_inputs(sections: Mapping[str, Any], loss: PolicyLossConfig) -> set[str]:
    """The loss inputs the algorithms on in a run (those whose :meth:`Algorithm.train_hooks` are not None)
    provide."""
    return {
        i
        for name, section in sections.items()
        if ALGORITHMS[name].train_hooks(section, loss) is not None
        for i in ALGORITHMS[name].inputs
    }


def sampled_prompts(sections: Mapping[str, Any], prompts: int) -> int:
    """The prompts a stage samples for a schedule's ``prompts``, after every algorithm's
    :meth:`Algorithm.stage_prompts`."""
    for name, section in sections.items():
        prompts = ALGORITHMS[name].stage_prompts(section, prompts)
    return prompts
