"""Algorithms from outside this package: modules imported when :mod:`mugrpo.algorithms` is, so that what they
register (an :class:`~mugrpo.algorithms.base.Algorithm`, a loss, a rollout input) exists in every process of a run,
the job processes included, before a config is validated.

Two ways to name them, both read in every process:

- an installed package's entry points in the group ``mugrpo.plugins`` (``[project.entry-points."mugrpo.plugins"]``
  ``my_algo = "my_package.algorithm"``), the way a distributed package plugs in;
- the environment variable ``MUGRPO_PLUGINS``: comma-separated module names (on ``PYTHONPATH``), for a module that
  is not installed; job processes inherit it.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points

#: Entry-point group of installed plugins.
ENTRY_POINT_GROUP = "mugrpo.plugins"
#: Environment variable of comma-separated plugin module names.
ENV_VAR = "MUGRPO_PLUGINS"


def plugin_modules() -> list[str]:
    """The plugin modules to import: the entry points' modules, then ``MUGRPO_PLUGINS``'s, each once."""
    names = [ep.value.split(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)]
    names += [n.strip() for n in os.environ.get(ENV_VAR, "").split(",") if n.strip()]
    return list(dict.fromkeys(names))


def load_plugins() -> list[str]:
    """Import every plugin module (:func:`plugin_modules`); returns their names.

    Raises:
        ImportError: a plugin cannot be imported (the message names it and where it was named).
    """
    loaded = []
    for name in plugin_modules():
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ImportError(
                f"mugrpo plugin {name!r} (named by the {ENTRY_POINT_GROUP!r} entry points or {ENV_VAR}) cannot be "
                f"imported: {e}"
            ) from e
        loaded.append(name)
    return loaded
