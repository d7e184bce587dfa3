"""The trainer's minibatch plan of a committed stage, rebuilt with the trainer's own data-order functions.

Update ``u`` of a stage trains on a minibatch that is a pure function of the run seed, the stage and the committed
rollouts (:mod:`mugrpo.trainer.data`): the same :func:`~mugrpo.trainer.data.load_rollouts` and
:func:`~mugrpo.trainer.data.make_minibatch_order` the trainer calls, with the stage's
:class:`~mugrpo.trainer.spec.TrainSpec` built from the stored config. This is the order the seed plans; rollouts an
algorithm adds to an update (replay) are not in it (the ``replay`` table records those).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mugrpo.audit.result import AuditRun
from schemas.tables import rollout_key


@dataclass
class StagePlan:
    """A stage's rebuilt plan: ``spec`` its TrainSpec, ``data`` its RolloutSet, ``order`` its MinibatchOrder."""

    spec: Any
    data: Any
    order: Any

    def rollouts(self, stage_update: int) -> list[Any]:
        """The fresh rollouts of 1-based stage update ``stage_update``, in drawn order."""
        return [self.data.rollouts[i] for i in self.order.minibatch(stage_update - 1)]

    def keys(self, stage_update: int) -> list[str]:
        return [rollout_key(r.stage, r.prompt_id, r.sample_idx) for r in self.rollouts(stage_update)]


def stage_plan(run: AuditRun, stage: int) -> StagePlan:
    """The rebuilt minibatch plan of committed stage ``stage`` of ``run``.

    Raises:
        mugrpo.commits.tables.RolloutDataError: the stage's rollouts are not committed or invalid.
        mugrpo.storage.store.ChecksumError: a rollout file changed after its manifest was written.
    """
    from mugrpo.common.seeds import derive_seed
    from mugrpo.losses import row_inputs
    from mugrpo.orchestration.runs import policy_version
    from mugrpo.trainer.data import load_rollouts, make_minibatch_order
    from mugrpo.trainer.spec import TrainSpec

    spec = TrainSpec.from_config(run.cfg, stage, policy_version(run.cfg, stage))
    data = load_rollouts(
        run.store,
        run.run_id,
        spec.rollout_stages,
        skip_zero_variance_groups=spec.train.skip_zero_variance_groups,
        row_inputs=row_inputs(spec.loss),
    )
    order = make_minibatch_order(
        data,
        rollouts_per_update=spec.train.rollouts_per_update,
        group_minibatches=spec.train.group_minibatches,
        seed=derive_seed(spec.seed, spec.stage, "train-data-order"),
    )
    return StagePlan(spec, data, order)
