"""The hook points through which the trainer and the generation worker run an algorithm that is more than a loss.

An algorithm that is only a loss (GRPO, Mu-GRPO, GSPO, ConSPO) is a function registered in
:data:`mugrpo.losses.POLICY_LOSSES`. An algorithm that also keeps state, changes what an update trains on or what a
shard samples (the replay buffer, AGPO) is a package under ``mugrpo/algorithms/`` holding three things:

- its **config section**, a pydantic model composed into the run config (and into the job specs named in
  :attr:`Algorithm.jobs`) under the algorithm's name, so ``replay.ratio=0.25`` works like any other key;
- its **state**, plain objects with ``state_dict()`` / ``load_state_dict()``, carried through every checkpoint
  (:class:`SavedState`) and every stage commit (:class:`CommitRecord`);
- a subclass of :class:`Algorithm` registered in :data:`ALGORITHMS`, whose hook objects the trainer and the
  generation worker call at the fixed places below. Neither of them names an algorithm.

The trainer (:mod:`mugrpo.trainer`), per stage, in this order::

    TrainHooks.start(StageStart)                  resume state: from the checkpoint, else the previous stage's commit
    per update u:
        TrainHooks.compose(UpdateRows)            -> rollouts added to the update's fresh minibatch
        TrainHooks.before_update(UpdateRows)      -> UpdateInputs: per-rollout loss inputs (Algorithm.inputs)
        (the optimizer update)
        TrainHooks.after_update(UpdateRows, m)    -> StepRecord: train_steps columns and loss metrics of the update
    per checkpoint:
        TrainHooks.checkpoint(CheckpointAt)       -> SavedState: JSON state and files stored in the checkpoint
    at the commit:
        TrainHooks.commit(StageCommit)            -> CommitRecord: files, counts and metrics of the job manifest
    (a stage with nothing to train on: TrainHooks.carry_over(StageCommit) -> CommitRecord, state unchanged)

The generation worker (:mod:`mugrpo.generation`), per stage, in this order::

    GenerationHooks.start(GenerationStart)        state as of the first shard still to sample
    per shard to sample:
        GenerationHooks.plan_shard(ShardToSample) -> ShardPlan: per-prompt temperatures, columns, extra groups
        GenerationHooks.scored(ScoredShard)       -> per-prompt columns set once the shard's groups are scored
    GenerationHooks.worker_metrics()              -> metrics of the worker manifest (the state at its commit)

What travels per rollout is declared, never implied (docs/algorithms/adding.md):

- :attr:`Algorithm.columns`: the rollout columns the algorithm writes (:class:`RolloutColumn`, through
  ``ShardPlan.columns`` / ``GenerationHooks.scored``) and reads back in the trainer (``RolloutRef.columns``); a
  column may mark rows the trainer never trains on (``RolloutColumn.excludes``);
- :attr:`Algorithm.inputs`: the per-rollout loss inputs it provides from ``TrainHooks.before_update``
  (``LossContext.inputs``; a loss declares what it reads with ``mugrpo.losses.requires(inputs=...)``);
- :meth:`Algorithm.stage_prompts`: the prompts a stage samples, e.g. over-sampled for dynamic sampling.

Hooks receive these small frozen contexts, never a job spec or the run config: what an algorithm reads is what its
context declares. Every hook has a no-op default, so an algorithm overrides only the points it uses.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from mugrpo.algorithms.auditing import AuditFindings, RunQuery
from mugrpo.algorithms.contracts import RolloutColumn, Settings
from mugrpo.algorithms.sampling import GenerationHooks
from mugrpo.algorithms.training import TrainHooks
from mugrpo.losses.config import PolicyLossConfig

# ------------------------------------------------------------------------------------------------------- algorithm


class Algorithm:
    """An algorithm package's entry point, registered in :data:`ALGORITHMS` under :attr:`name`.

    Class attributes:
        name: the config section's key, the registry name and the key of its state in checkpoints.
        section: the config section's pydantic model.
        optional: True: the section defaults to None (the algorithm is off unless the section is given); False:
            to ``section()`` (the section has its own switch, e.g. ``enabled``).
        jobs: the job specs that carry the section besides the run config ("train", "generate").
        description: the section's one-line description in the config reference.
        columns: the rollout columns it declares (:class:`RolloutColumn`), written on every rollout row.
        inputs: the per-rollout loss inputs its trainer hooks provide (``UpdateInputs.values`` keys).
    """

    name: ClassVar[str]
    section: ClassVar[type[BaseModel]]
    optional: ClassVar[bool] = True
    jobs: ClassVar[frozenset[str]] = frozenset({"train"})
    description: ClassVar[str] = ""
    columns: ClassVar[tuple[RolloutColumn, ...]] = ()
    inputs: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def stage_prompts(cls, section: Any, prompts: int) -> int:
        """The prompts a stage samples when the stage schedule asks for ``prompts`` (e.g. more, for dynamic
        sampling to filter down to ``prompts`` groups); the section is None or off: ``prompts``."""
        return prompts

    @classmethod
    def check(cls, section: Any, settings: Settings) -> None:
        """Refuse settings the algorithm cannot run with.

        Raises:
            ValueError: naming the config keys in conflict.
        """

    @classmethod
    def train_hooks(cls, section: Any, loss: PolicyLossConfig) -> TrainHooks | None:
        """The algorithm's trainer hooks for a run with this section and loss, or None when it is off there."""
        return None

    @classmethod
    def generation_hooks(cls, section: Any) -> GenerationHooks | None:
        """The algorithm's hooks for one stage of a generation worker, or None when it is off there."""
        return None

    @classmethod
    def audit_batches(cls, section: Any, rows: RunQuery, max_repeat: int) -> AuditFindings | None:
        """The algorithm's own batch evidence for the harness audit (no batch served more than ``max_repeat``
        times in a row), or None when it has none or is off in the run."""
        return None

    @classmethod
    def audit_order(cls, section: Any, rows: RunQuery) -> list[str]:
        """Lines of the run's data order that the algorithm decides (e.g. each update's replay draw), added to the
        audit's data-order fingerprint (:mod:`mugrpo.audit.data_order`); [] when none or off."""
        return []
