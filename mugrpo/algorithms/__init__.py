"""Algorithms that are more than a loss: each one is a package here with its config section, its state and its code,
behind the hook points of :mod:`mugrpo.algorithms.base` that the trainer and the generation worker call.

Built in: ``replay`` (rollout-level replay-buffer GRPO, :mod:`.replay`) and ``agpo`` (AGPO, :mod:`.agpo`).
Importing this package registers them in :data:`ALGORITHMS` (with the losses and advantage estimators they bring),
then imports the plugins (:mod:`.plugins`: entry points ``mugrpo.plugins``, ``MUGRPO_PLUGINS``), algorithms kept
outside this package. docs/algorithms/adding.md walks through adding one.
"""

from mugrpo.algorithms import agpo, replay  # noqa: F401  (importing registers the built-in algorithms)
from mugrpo.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    AuditFindings,
    CheckpointAt,
    CommitRecord,
    GenerationHooks,
    GenerationStart,
    ResumePoint,
    RolloutColumn,
    RolloutRef,
    RunQuery,
    SavedState,
    ScoredShard,
    Settings,
    ShardPlan,
    ShardToSample,
    StageCommit,
    StageStart,
    StepRecord,
    TrainHooks,
    UpdateInputs,
    UpdateRows,
    check_sections,
    declared_columns,
    excluded,
    longest_repeat,
    make_generation_hooks,
    make_train_hooks,
    provided_inputs,
    section_fields,
    sections_of,
    stage_prompts,
)
from mugrpo.algorithms.plugins import load_plugins

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
    "load_plugins",
    "longest_repeat",
    "make_generation_hooks",
    "make_train_hooks",
    "provided_inputs",
    "section_fields",
    "sections_of",
    "stage_prompts",
]

load_plugins()
