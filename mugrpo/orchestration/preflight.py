"""Preflight: every check that can refuse a run, made before Prefect starts and before anything is written.

:func:`preflight` runs them in this order and raises the first :class:`Refusal`, one block of text with the exit
code of :mod:`mugrpo.common.exit_codes`' table (2: what was asked is wrong; 3: the run's state refuses it):

1. held-out benchmarks of the training task share no question text with training (2);
2. no worked example of ``data.prompt.examples`` is a problem of the data or of a benchmark (2);
3. the store is reachable and the run root can be read (2: a storage fault a user can fix, explained);
4. no other live writer holds the run lease, when ``orchestration.lease_wait_s`` is 0 (3);
5. the run may start or continue with this config and these inputs (:func:`mugrpo.orchestration.resume.check_resume`:
   a changed semantic key, a changed or missing input, precision fixed for the run's life) (2);
6. no stage asks for more prompts than the training set holds (2);
7. no committed file is corrupted (:func:`mugrpo.commits.verify.refuse_corrupted`, ``orchestration.verify_on_resume``:
   quick by default, re-hashing only what the next work reads) (3);
8. the run root is writable: a real 1 MiB block written, fsynced and removed (2: permission, read-only, full).

The command line calls it, prints a refusal and exits with its code, then takes the run lease and hands what was
checked to the run flow with it (:attr:`mugrpo.coordination.lease.RunLease.cleared`): when the run is as the checks
saw it (:meth:`Cleared.current`: run.json's bytes and the first open stage unchanged), the flow checks nothing again,
so a start hashes each file once; otherwise (another writer ran in between, the flow was started without the
command line) the flow runs the checks itself under the lease (:func:`mugrpo.orchestration.runs.start_run`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from mugrpo.common.exit_codes import ExitCode, exit_code_of
from mugrpo.config import ConfigError
from mugrpo.orchestration.resume import ResumeCheck, RunRefused, check_resume
from mugrpo.orchestration.runs import open_store
from mugrpo.storage.store import Store, sha256_bytes


class Refusal(Exception):
    """A run refused before it started: ``message`` is one block for the user, ``exit_code`` its
    :class:`~mugrpo.common.exit_codes.ExitCode` (what :func:`~mugrpo.common.exit_codes.exit_code_of` returns for it)."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.ASKED_WRONG) -> None:
        super().__init__(message)
        self.message, self.exit_code = message, ExitCode(exit_code)


@dataclass(frozen=True)
class Cleared:
    """A run that passed preflight: its store, its URL, what the resume check found (the concrete config with
    its precision, the stage it begins at), the committed files' check (None when ``verify_on_resume`` is off) and
    the run's state the checks saw (:func:`run_state`)."""

    store: Store
    uri: str
    check: ResumeCheck
    verified: Any = None  # mugrpo.commits.verify.VerifyReport
    state: tuple[str | None, int] | None = None

    def current(self, cfg: Any) -> bool:
        """Whether run ``cfg.run.id`` is still as the checks saw it (nothing was written to it since)."""
        return self.state is not None and run_state(self.store, cfg) == self.state


def run_state(store: Store, cfg: Any) -> tuple[str | None, int]:
    """(sha256 of run.json's bytes or None, first stage not committed): every start of a writer rewrites run.json,
    so an unchanged pair means no writer ran between two reads."""
    from mugrpo.commits.verify import open_stage

    layout = cfg.layout
    doc = store.read_bytes(layout.run_json) if store.exists(layout.run_json) else None
    return (None if doc is None else sha256_bytes(doc), open_stage(store, layout, cfg.run.num_stages))


@contextmanager
def _storage(url: str, storage_options: dict | None) -> Iterator[None]:
    """A storage fault a user can fix (endpoint, credentials, bucket, permissions, a full disk) as a Refusal."""
    from mugrpo.storage.errors import StorageUnavailable, explain_storage_error

    try:
        yield
    except StorageUnavailable as e:
        raise Refusal(str(e)) from None
    except Refusal:
        raise
    except Exception as e:
        message = explain_storage_error(e, url, storage_options)
        if message is None:
            raise
        raise Refusal(message) from None


def preflight(cfg: Any) -> Cleared:
    """Run every refusal check of a run start or resume (module docstring), in order; reads only.

    Args:
        cfg: the run config (a :class:`mugrpo.config.Config`).

    Returns:
        The store, the run's URL and the resume check.

    Raises:
        Refusal: the first check that refuses, with its message and exit code.
    """
    from mugrpo.commits.verify import CorruptedRunError, refuse_corrupted
    from mugrpo.coordination.lease import live_holder
    from mugrpo.data.datasets import check_heldout_disjoint
    from mugrpo.storage.errors import check_store, check_writable

    try:  # reasoning-gym benchmarks of the training task: no question text shared with training
        check_heldout_disjoint(cfg.data.train, [b.dataset for b in cfg.eval.benchmarks])
    except ValueError as e:
        raise Refusal(str(e)) from None
    check_prompt_examples(cfg)
    store = open_store(cfg)
    uri = store.uri(cfg.run.id)
    options = cfg.run.storage_options
    with _storage(uri, options):
        check_store(store, uri)
        holder = live_holder(store, cfg.run.id)
    if holder is not None and cfg.orchestration.lease_wait_s == 0:  # the flow takes the lease; refuse early here
        raise Refusal(
            f"run {cfg.run.id} at {uri} is being written by {holder}; two writers would commit over each other. "
            "Wait for it to finish or stop it (a dead writer's lease expires after orchestration.lease_ttl_s).",
            ExitCode.STATE_REFUSES,
        )
    with _storage(uri, options):
        try:
            check = check_resume(store, cfg)
        except (RunRefused, ConfigError) as e:  # a fork's broken lineage is the run's state (3)
            raise Refusal(str(e), exit_code_of(e)) from None
        check_stage_sizes(cfg)
        state = run_state(store, cfg)
        verified = None
        mode = cfg.orchestration.verify_on_resume
        if mode != "off":
            try:
                verified = refuse_corrupted(store, cfg.run.id, cfg.run.num_stages, cfg.layout, quick=mode == "quick")
            except CorruptedRunError as e:
                raise Refusal(str(e), exit_code_of(e)) from None
        check_writable(store, cfg.run.id, uri)
    return Cleared(store, uri, check, verified, state)


def check_prompt_examples(cfg: Any) -> None:
    """Refuse a worked example of ``data.prompt.examples`` that is a problem of the training data or of a benchmark
    (:func:`mugrpo.data.prompts.check_examples`); loads the datasets only when there are examples.

    Raises:
        Refusal: names the example and the dataset (or the dataset's error).
    """
    if not cfg.data.prompt.examples:
        return
    from mugrpo.data.datasets import DatasetError, load_problems
    from mugrpo.data.prompts import check_examples

    try:
        for ds in [cfg.data.train, *(b.dataset for b in cfg.eval.benchmarks)]:
            check_examples(cfg.data.prompt, (p.question for p in load_problems(ds)[0]), where=ds.name)
    except (ValueError, DatasetError) as e:
        raise Refusal(str(e)) from None


def check_stage_sizes(cfg: Any) -> None:
    """Refuse a stage that asks for more prompts than the training set holds: it would sample some prompt twice in
    one stage (:func:`mugrpo.provenance.prompt_plan.check_stage_prompts`).

    Raises:
        Refusal: names the stage, the prompts asked and the training set's size (or the dataset's error).
    """
    from mugrpo.data.datasets import DatasetError, load_problems
    from mugrpo.provenance.prompt_plan import PlanError, check_stage_prompts
    from mugrpo.schedules.stages import stage_plan

    try:
        problems, _ = load_problems(cfg.data.train)
        for k in range(cfg.run.num_stages):
            check_stage_prompts(stage_plan(cfg, k).num_prompts, len(problems), k, cfg.data.train)
    except (PlanError, DatasetError) as e:
        raise Refusal(str(e)) from None
