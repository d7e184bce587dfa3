"""The storage layout of a run: the one place that builds paths (docs/design.md, "Storage layout under the run root").

Every path here is relative to the store's root URL (see :class:`mugrpo.storage.store.Store`). Folders use Hive-style
``key=value`` names so DuckDB and pyarrow read ``stage`` as a column. No other module formats these paths by hand.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

#: File of a checkpoint folder that references the published policy holding its weights, instead of a ``model/``
#: copy (:mod:`mugrpo.commits.policies`, "weights written once"): ``{"policy": run-relative policy dir, "files": {name:
#: sha256}}``.
POLICY_REF_FILE = "policy.ref.json"

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def validate_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is a safe single path component, else raise ValueError naming it."""
    if not _RUN_ID.match(run_id or ""):
        raise ValueError(
            f"run_id {run_id!r} is not allowed: use 1-128 characters from letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return run_id


@dataclass(frozen=True)
class RunLayout:
    """Paths of one run, relative to the store root: ``{run_id}/...``.

    A run forked from another (``mugrpo fork``, docs/branching.md) names its parent in ``parent`` and the stage it
    was forked at in ``fork_stage`` (K): the folders of what it builds on are the parent's, referenced, never copied:
    the behavior policies of stages 0..K (``policies/stage=k``), the checkpoints of stages below K and the algorithm
    state files of stages below K. Everything the fork writes (stage K on) lives under its own ``run_id``.
    """

    run_id: str
    parent: str | None = None
    fork_stage: int = 0

    def __post_init__(self) -> None:
        validate_run_id(self.run_id)
        if self.parent is not None:
            validate_run_id(self.parent)
            if self.parent == self.run_id or self.fork_stage < 1:
                raise ValueError(f"run {self.run_id!r}: a fork needs another parent run and a fork stage >= 1")

    @property
    def run_dir(self) -> str:
        return self.run_id

    def _p(self, *parts: str) -> str:
        return "/".join((self.run_id, *parts))

    def _owner(self, stage: int, *, through: bool = False) -> str:
        """The run id whose folder holds stage ``stage``'s data: the parent's below the fork stage (``through``: up
        to and including it, for the behavior policy of the fork stage)."""
        if self.parent is not None and (stage < self.fork_stage or (through and stage == self.fork_stage)):
            return self.parent
        return self.run_id

    def rel(self, path: str) -> str:
        """Path relative to the run directory (as stored in manifests); a path in another run of the same root (a
        fork's parent) is ``../{other run id}/...``."""
        prefix = self.run_id + "/"
        if path.startswith(prefix):
            return path[len(prefix) :]
        other = path.split("/", 1)
        if len(other) == 2 and _RUN_ID.match(other[0]) and not path.startswith("../"):
            return f"../{path}"
        raise ValueError(f"{path!r} is not inside run {self.run_id!r} nor a run of its root")

    def abs(self, rel_path: str) -> str:
        """Inverse of :meth:`rel`: a store path (``../other/...`` resolves to a run beside this one).

        Raises:
            ValueError: the path leaves the store root.
        """
        path = posixpath.normpath(self._p(rel_path))
        if path.startswith("../") or path in ("..", ".") or path.startswith("/"):
            raise ValueError(f"{rel_path!r} (in run {self.run_id!r}) leaves the store root")
        return path

    # run-level
    @property
    def run_json(self) -> str:
        return self._p("run.json")

    @property
    def lease(self) -> str:
        """The run lease (:mod:`mugrpo.coordination.lease`): who may write the run now."""
        return self._p("_lease.json")

    # per stage
    def policy_dir(self, stage: int) -> str:
        """HF-format model dir: the behavior policy of stage ``stage`` (stage K = final policy); a fork's policies
        up to its fork stage are its parent's."""
        return "/".join((self._owner(stage, through=True), "policies", f"stage={stage}"))

    def rollouts_dir(self, stage: int) -> str:
        return self._p("rollouts", f"stage={stage}")

    def rollout_shard(self, stage: int, shard: int) -> str:
        return self._p("rollouts", f"stage={stage}", f"shard={shard:05d}.parquet")

    def train_steps_dir(self, stage: int) -> str:
        return self.table_dir("train_steps", stage)

    def train_steps_part(self, stage: int, part: int) -> str:
        return self.table_part("train_steps", stage, part)

    def table_dir(self, table: str, stage: int) -> str:
        """The folder of a table the trainer writes in parts per stage: ``train_steps``, or an algorithm's audit
        table (e.g. ``replay``: which rollout each update used)."""
        return self._p(table, f"stage={stage}")

    def table_part(self, table: str, stage: int, part: int) -> str:
        """Rows of the updates up to stage update ``part``, written with that update's checkpoint."""
        return self._p(table, f"stage={stage}", f"part-{part:05d}.parquet")

    def stage_state(self, name: str, stage: int, file: str) -> str:
        """State file ``file`` of algorithm ``name`` after the last update of ``stage`` (written at the stage's
        train commit, listed in its job manifest), e.g. ``replay_buffer/stage=k/buffer.parquet``."""
        return "/".join((self._owner(stage), name, f"stage={stage}", file))

    def checkpoints_dir(self, stage: int) -> str:
        """The checkpoints of a stage (a fork's stages below its fork stage: the parent's)."""
        return "/".join((self._owner(stage), "checkpoints", f"stage={stage}"))

    def checkpoint_dir(self, stage: int, step: int) -> str:
        """A checkpoint folder. The final one of a stage that publishes its policy holds no weights of its own: its
        :data:`POLICY_REF_FILE` references the files of ``policy_dir(stage + 1)`` (the same tensors)."""
        return f"{self.checkpoints_dir(stage)}/step={step:06d}"

    def evals_dir(self, stage: int) -> str:
        return self._p("evals", f"stage={stage}")

    def eval_file(self, stage: int, benchmark: str) -> str:
        return self._p("evals", f"stage={stage}", f"{benchmark}.parquet")

    @property
    def stages_dir(self) -> str:
        return self._p("stages")

    def stage_manifest(self, stage: int) -> str:
        """The commit point of a stage: written last."""
        return self._p("stages", f"stage={stage}.json")

    def jobs_dir(self, stage: int) -> str:
        """Job specs and job manifests of a stage."""
        return self._p("jobs", f"stage={stage}")

    def job_spec(self, stage: int, job: str) -> str:
        """The spec a job was launched with (``job`` is generate, train or eval)."""
        return self._p("jobs", f"stage={stage}", f"{job}.spec.json")

    def job_error(self, stage: int, job: str, kind: str) -> str:
        """A job's failure report, e.g. ``train.nonfinite.json`` (the prompt ids of a NaN/inf update)."""
        return self._p("jobs", f"stage={stage}", f"{job}.{kind}.json")

    def preemption_record(self, stage: int) -> str:
        """What a train job stopped on a preemption notice saved (``jobs/stage=k/train.preempted.json``; written by
        :func:`mugrpo.trainer.preemption.write_preemption_record`, read by
        :func:`mugrpo.commits.manifest.read_preemption_record`)."""
        return self.job_error(stage, "train", "preempted")

    def job_manifest(self, stage: int, job: str) -> str:
        """Written last by a job: the files it committed with their sha256. The next job verifies through it."""
        return self._p("jobs", f"stage={stage}", f"{job}.manifest.json")

    def prompt_plan(self, stage: int) -> str:
        """The prompts stage ``stage`` samples (:mod:`mugrpo.provenance.prompt_plan`), written once, before its first
        shard."""
        return self._p("jobs", f"stage={stage}", "generate.plan.json")

    # re-scored rewards (mugrpo.orchestration.rescore): written beside the rollouts, never over them
    def rescore_dir(self, name: str, stage: int) -> str:
        """The shards of re-scoring ``name`` of stage ``stage``'s rollouts."""
        return self._p("rescores", name, f"stage={stage}")

    def rescore_shard(self, name: str, stage: int, shard: int) -> str:
        """Re-scored rows of rollout shard ``shard`` (one output file per input shard, same number)."""
        return self._p("rescores", name, f"stage={stage}", f"shard={shard:05d}.parquet")

    def rescore_manifest(self, name: str, stage: int) -> str:
        """The commit point of a re-scoring: written last, lists its shards with their sha256."""
        return self._p("rescores", name, f"stage={stage}.json")


def parse_checkpoint_step(name: str) -> int | None:
    """``'step=000012'`` -> 12; None for other names (e.g. temporary folders)."""
    m = re.fullmatch(r"step=(\d{6,})", name)
    return int(m.group(1)) if m else None


def parse_shard(name: str) -> int | None:
    """``'shard=00003.parquet'`` -> 3; None for other names (e.g. temporary files)."""
    m = re.fullmatch(r"shard=(\d{5,})\.parquet", name)
    return int(m.group(1)) if m else None
