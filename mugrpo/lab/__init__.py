"""The lab: a small policy that learns a reasoning-gym task in minutes on a CPU, so accuracy is measurable here.

``mugrpo lab init`` (or ``model.source: lab`` in a config) builds, once per recipe, a Llama-architecture model with
its own character-level tokenizer, warm-started by SFT on the task's gold answers until its sampled held-out accuracy
reaches a target (:mod:`mugrpo.lab.build`). It is an ordinary HF model dir with a chat template, so every path of the
product runs on it unchanged. ``configs/lab/`` trains it with each algorithm on one budget.
"""

from mugrpo.lab.build import LAB_INFO, ensure_lab_policy, heldout_accuracy, lab_policy_dir
from mugrpo.lab.recipe import DEFAULT_PARAMS, LabRecipe, lab_cache_root

__all__ = [
    "DEFAULT_PARAMS",
    "LAB_INFO",
    "LabRecipe",
    "ensure_lab_policy",
    "heldout_accuracy",
    "lab_cache_root",
    "lab_policy_dir",
]
