"""The lab: a small policy that learns a reasoning-gym task in minutes on a CPU, so accuracy is measurable here.

``mugrpo lab init`` (or ``model.source: lab`` in a config) builds, once per recipe, a Llama-architecture model with
its own character-level tokenizer, warm-started by SFT on the task's gold answers until its sampled held-out accuracy
reaches a target (:mod:`mugrpo.lab.build`). It is an ordinary HF model dir with a chat template, so every path of the
product runs on it unchanged. ``configs/lab/`` trains it with each algorithm on one budget.
"""

from importlib import import_module
from typing import Any

#: Where each public name lives. Imported on first use (PEP 562): ``mugrpo.lab.build`` imports torch and the
#: tokenizers (seconds), and every ``mugrpo`` command imports this package for its ``lab`` subcommand.
_HOME = {
    "DEFAULT_PARAMS": "mugrpo.lab.recipe",
    "LAB_INFO": "mugrpo.lab.build",
    "LabRecipe": "mugrpo.lab.recipe",
    "ensure_lab_policy": "mugrpo.lab.build",
    "heldout_accuracy": "mugrpo.lab.build",
    "lab_cache_root": "mugrpo.lab.recipe",
    "lab_policy_dir": "mugrpo.lab.build",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'mugrpo.lab' has no attribute {name!r}")
    value = getattr(import_module(_HOME[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_PARAMS",
    "LAB_INFO",
    "LabRecipe",
    "ensure_lab_policy",
    "heldout_accuracy",
    "lab_cache_root",
    "lab_policy_dir",
]
