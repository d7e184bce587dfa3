"""Algorithms that are more than a loss: each one is a package here with its config section, its state and its code,
behind the hook points of :mod:`mugrpo.algorithms.base` that the trainer and the generation worker call.

Built in: ``replay`` (rollout-level replay-buffer GRPO, :mod:`.replay`) and ``agpo`` (AGPO, :mod:`.agpo`).
Importing this package registers them in :data:`ALGORITHMS` (with the losses and advantage estimators they bring),
then imports the plugins (:mod:`.plugins`: entry points ``mugrpo.plugins``, ``MUGRPO_PLUGINS``), algorithms kept
outside this package. docs/algorithms/adding.md walks through adding one.
"""

from mugrpo.algorithms import a3po, agpo, replay  # noqa: F401  (importing registers the built-in algorithms)
from mugrpo.algorithms.auditing import AuditFindings, RunQuery, longest_repeat
from mugrpo.algorithms.base import Algorithm
from mugrpo.algorithms.contracts import RolloutColumn, RolloutRef, Settings
from mugrpo.algorithms.plugins import load_plugins
from mugrpo.algorithms.registry import (
    ALGORITHMS,
    check_sections,
    declared_columns,
    excluding_columns,
    make_generation_hooks,
    make_train_hooks,
    provided_inputs,
    sampled_prompts,
    section_fields,
    sections_of,
)
from mugrpo.algorithms.sampling import GenerationHooks, GenerationStart, ScoredShard, ShardPlan, ShardToSample
from mugrpo.algorithms.training import (
    CheckpointAt,
    CommitRecord,
    ResumePoint,
    SavedState,
    StageCommit,
    StageStart,
    StepRecord,
    TrainHooks,
    UpdateInputs,
    UpdateRows,
)
from mugrpo.commits.exclusion import excluded

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AuditFindings",
    "CheckpointAt",
    "CommitRecord",
    "GenerationHooks",
    "GenerationStart",
    "ResumePoint",
    "RolloutColumn",
    "RolloutRef",
    "RunQuery",
    "SavedState",
    "Settings",
    "ScoredShard",
    "ShardPlan",
    "ShardToSample",
    "StageCommit",
    "StageStart",
    "StepRecord",
    "TrainHooks",
    "UpdateInputs",
    "UpdateRows",
    "check_sections",
    "declared_columns",
    "excluded",
    "excluding_columns",
    "load_plugins",
    "longest_repeat",
    "make_generation_hooks",
    "make_train_hooks",
    "provided_inputs",
    "section_fields",
    "sections_of",
    "sampled_prompts",
]

load_plugins()
