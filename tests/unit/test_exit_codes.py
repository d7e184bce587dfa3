"""The exit-code table (mugrpo/common/exit_codes.py): each code's number, each refusal and failure class's code for
the command line and for a job, a subclass inheriting its parent's, the jobs' exits, and one real refusal through
`mugrpo run` (typer's runner) exiting with the table's code. docs/reliability.md ("Exit codes") lists the same."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mugrpo.common.exit_codes import TABLE, ExitCode, exit_code_for, exit_code_of

ROOT = Path(__file__).resolve().parents[2]
OK, FAILED, ASKED, STATE, PREEMPTED = ExitCode


def _cls(name: str) -> type[BaseException]:
    module, _, qualname = name.rpartition(".")
    return getattr(importlib.import_module(module), qualname)


def test_each_code_has_its_number():
    assert {c.name: int(c) for c in ExitCode} == {
        "OK": 0,
        "FAILED": 1,
        "ASKED_WRONG": 2,
        "STATE_REFUSES": 3,
        "PREEMPTED": 75,
    }
    from mugrpo.common.preemption import PREEMPTED_EXIT_CODE

    assert PREEMPTED_EXIT_CODE is ExitCode.PREEMPTED


def test_every_row_names_an_exception_class_where_it_is_defined():
    for name in TABLE:
        cls = _cls(name)
        assert isinstance(cls, type) and issubclass(cls, BaseException), name
        assert f"{cls.__module__}.{cls.__qualname__}" == name, f"{name} is defined elsewhere: a rename?"


# (class, code of `mugrpo`, code of a job): the documented code of each refusal and failure
CODES = [
    ("mugrpo.config.loading.ConfigError", ASKED, ASKED),
    ("mugrpo.provenance.refusals.RunRefused", ASKED, ASKED),
    ("mugrpo.provenance.refusals.InputChangedError", ASKED, ASKED),  # a ChecksumError too: RunRefused decides
    ("mugrpo.provenance.prompt_plan.PlanError", ASKED, ASKED),  # no row: InputChangedError's
    ("mugrpo.data.datasets.DatasetError", ASKED, ASKED),  # no row: ValueError's
    ("mugrpo.sql.discover.TargetError", ASKED, ASKED),
    ("mugrpo.storage.errors.StorageUnavailable", ASKED, ASKED),
    ("mugrpo.commits.tables.RolloutDataError", ASKED, ASKED),
    ("mugrpo.commits.tables.SchemaError", ASKED, ASKED),
    ("mugrpo.orchestration.preflight.Refusal", ASKED, ASKED),  # its default; an instance carries its own
    ("mugrpo.orchestration.fork.ForkRefused", ASKED, ASKED),
    ("mugrpo.orchestration.resume.MomentsPrunedError", STATE, STATE),
    ("mugrpo.coordination.lease.RunLeaseHeld", STATE, STATE),
    ("mugrpo.coordination.lease.LeaseFenced", STATE, ASKED),
    ("mugrpo.storage.locks.LocalLockTimeout", STATE, STATE),
    ("mugrpo.commits.verify.CorruptedRunError", STATE, STATE),
    ("mugrpo.commits.retention.OptimizerStatePruned", STATE, ASKED),
    ("mugrpo.storage.exceptions.ChecksumError", STATE, ASKED),
    ("mugrpo.trainer.step.NonFiniteError", STATE, STATE),
    ("mugrpo.trainer.preemption.Preempted", PREEMPTED, PREEMPTED),
    ("mugrpo.common.preemption.PreemptionInterrupt", PREEMPTED, PREEMPTED),
    ("mugrpo.coordination.start_gate.StartTimeout", FAILED, FAILED),
    ("mugrpo.generation.spec.GenerationError", FAILED, FAILED),
    ("mugrpo.storage.exceptions.StorageError", FAILED, FAILED),
    ("tasks.launchers.errors.JobError", FAILED, FAILED),
    ("tasks.launchers.errors.JobFailedError", FAILED, FAILED),
    ("builtins.RuntimeError", FAILED, FAILED),  # not in the table: an unexpected error
]


@pytest.mark.parametrize(("name", "cli", "job"), CODES, ids=[n.rpartition(".")[2] for n, _, _ in CODES])
def test_each_class_has_its_documented_code(name, cli, job):
    cls = _cls(name)
    assert exit_code_for(cls) is cli
    assert exit_code_for(cls, job=True) is job


def test_a_subclass_has_its_parents_code():
    from mugrpo.commits.verify import CorruptedRunError
    from mugrpo.coordination.lease import LeaseFenced
    from mugrpo.provenance.refusals import RunRefused
    from mugrpo.storage.exceptions import StorageError

    class NewRefusal(RunRefused):
        pass

    class Deeper(NewRefusal):
        pass

    class NewCorruption(CorruptedRunError):
        pass

    class NewFence(LeaseFenced):
        pass

    class NewStorageFault(StorageError):
        pass

    assert exit_code_of(Deeper("x")) is exit_code_of(NewRefusal("x")) is ASKED
    assert exit_code_of(NewCorruption("x")) is STATE
    assert (exit_code_of(NewFence("x")), exit_code_of(NewFence("x"), job=True)) == (STATE, ASKED)
    assert exit_code_of(NewStorageFault("x")) is FAILED
    assert exit_code_of(KeyError("x")) is FAILED


def test_a_refusal_carries_its_own_code_and_other_exit_codes_do_not_count():
    from mugrpo.orchestration.fork import ForkRefused
    from mugrpo.orchestration.preflight import Refusal
    from tasks.launchers.errors import JobFailedError, JobPreemptedError

    assert exit_code_of(Refusal("bad")) is ASKED
    assert exit_code_of(Refusal("held", ExitCode.STATE_REFUSES)) is STATE
    assert exit_code_of(ForkRefused("parent gone", ExitCode.STATE_REFUSES)) is STATE
    assert exit_code_of(ForkRefused("bad key")) is ASKED

    class Later(Refusal):
        pass

    assert exit_code_of(Later("x", ExitCode.STATE_REFUSES)) is STATE
    from mugrpo.orchestration.resume import MomentsPrunedError

    assert MomentsPrunedError("pruned").exit_code is exit_code_of(MomentsPrunedError("pruned")) is STATE
    # a job's own exit status is not the code of `mugrpo`: a failed or preempted job stops the run with 1
    assert exit_code_of(JobFailedError("nan", kind="train", exit_code=3)) is FAILED
    assert exit_code_of(JobPreemptedError("evicted", kind="train")) is FAILED


def test_the_jobs_exit_with_the_tables_codes(tmp_path):
    from mugrpo.commits.retention import OptimizerStatePruned
    from mugrpo.coordination.jobspec import JobSpec
    from mugrpo.coordination.lease import LeaseFenced
    from mugrpo.coordination.start_gate import StartTimeout
    from mugrpo.jobs.common import load_spec, preempted, refuse_untrusted
    from mugrpo.provenance.refusals import InputChangedError
    from mugrpo.storage.exceptions import ChecksumError

    for error, code in [
        (ChecksumError("a.parquet: sha256 differs"), ASKED),
        (InputChangedError("train.jsonl changed"), ASKED),
        (LeaseFenced("refusing to commit"), ASKED),
        (OptimizerStatePruned("pruned"), ASKED),
        (StartTimeout("not committed in time"), FAILED),
    ]:
        with pytest.raises(SystemExit) as info, refuse_untrusted("train", 0):
            raise error
        assert info.value.code == code == exit_code_of(error, job=True), error
    with pytest.raises(SystemExit) as info:
        load_spec(str(tmp_path / "missing.json"), JobSpec)
    assert info.value.code == ASKED
    with pytest.raises(SystemExit) as info:
        preempted("saved at update 3")
    assert info.value.code == PREEMPTED


def test_the_docs_list_the_same_codes():
    from mugrpo.common import exit_codes

    doc = (ROOT / "docs" / "reliability.md").read_text()
    section = doc.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (\d+) \| `(\w+)` \|", section, re.M))
    assert rows == {str(int(c)): c.name for c in ExitCode}
    for c in ExitCode:
        assert re.search(rf"^{int(c)}\s+{c.name}\s", exit_codes.__doc__, re.M), c


def test_mugrpo_run_exits_with_the_tables_code_for_a_refused_config(tmp_path):
    """A real refusal through the command line: an unknown key is a ConfigError, exit 2, one block, nothing written."""
    from mugrpo.cli import app
    from mugrpo.config import ConfigError

    result = CliRunner().invoke(
        app, ["run", "configs/gsm8k-smollm2-quick.yaml", f"run.root={tmp_path}", "train.lrr=1e-5"]
    )
    assert result.exit_code == exit_code_for(ConfigError) == ExitCode.ASKED_WRONG, result.output
    assert result.output.count("Error:") == 1 and "unknown key 'train.lrr'" in result.output
    assert "Traceback" not in result.output and list(tmp_path.iterdir()) == []
