"""The storage layout of a run: the one place that builds paths (docs/design.md, "Storage layout under the run root").

Every path here is relative to the store's root URL (see :class:`mugrpo.storage.store.Store`). Folders use Hive-style
``key=value`` names so DuckDB and pyarrow read ``stage`` as a column. No other module formats these paths by hand.
"""

from __future__ import annotations

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
    """Paths of one run, relative to the store root: ``{run_id}/...``."""

    run_id: str

    def __post_init__(self) -> None:
        validate_run_id(self.run_id)

    @property
    def run_dir(self) -> str:
        return self.run_id

    def _p(self, *parts: str) -> str:
        return "/".join((self.run_id, *parts))

    def rel(self, path: str) -> str:
        """Path relative to the run directory (as stored in manifests)."""
        prefix = self.run_id + "/"
        if not path.startswith(prefix):
            raise ValueError(f"{path!r} is not inside run {self.run_id!r}")
        return path[len(prefix) :]

    def abs(self, rel_path: str) -> str:
        """Inverse of :meth:`rel`."""
        return self._p(rel_path)

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
        """HF-format model dir: the behavior policy of stage ``stage`` (stage K = final policy)."""
        return self._p("policies", f"stage={stage}")

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
        return self._p(name, f"stage={stage}", file)

    def checkpoints_dir(self, stage: int) -> str:
        return self._p("checkpoints", f"stage={stage}")

    def checkpoint_dir(self, stage: int, step: int) -> str:
        """A checkpoint folder. The final one of a stage that publishes its policy holds no weights of its own: its
        :data:`POLICY_REF_FILE` references the files of ``policy_dir(stage + 1)`` (the same tensors)."""
        return self._p("checkpoints", f"stage={stage}", f"step={step:06d}")

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

    def job_manifest(self, stage: int, job: str) -> str:
        """Written last by a job: the files it committed with their sha256. The next job verifies through it."""
        return self._p("jobs", f"stage={stage}", f"{job}.manifest.json")

    def prompt_plan(self, stage: int) -> str:
        """The prompts stage ``stage`` samples (:mod:`mugrpo.provenance.prompt_plan`), written once, before its first
        shard."""
        return self._p("jobs", f"stage={stage}", "generate.plan.json")


def parse_checkpoint_step(name: str) -> int | None:
    """``'step=000012'`` -> 12; None for other names (e.g. temporary folders)."""
    m = re.fullmatch(r"step=(\d{6,})", name)
    return int(m.group(1)) if m else None


def parse_shard(name: str) -> int | None:
    """``'shard=00003.parquet'`` -> 3; None for other names (e.g. temporary files)."""
    m = re.fullmatch(r"shard=(\d{5,})\.parquet", name)
    return int(m.group(1)) if m else None
