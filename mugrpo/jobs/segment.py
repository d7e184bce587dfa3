"""The warm segment job: one process runs stages k .. k+n-1 with the policy, the optimizer, the rollout engine and the
verifier pools loaded once (``orchestration.execution: warm``; the library is :mod:`mugrpo.execution.warm`).

    python -m mugrpo.jobs.segment SPEC       # SPEC: path or URL of a SegmentSpec JSON (jobs/stage=k/segment.spec.json)

Each stage writes the same job specs as the cold path and runs them through the same objects as the cold jobs, then
commits the stage; on CPU with the transformers engine, warm and cold give bitwise the same rollouts and weights.
Stages whose manifest exists are skipped; inside a stage every job resumes from what it committed.

Preemption: on SIGTERM the segment stops at once and exits 75 (its pools closed): what its stages committed is kept
(shards, checkpoints), the work since is redone by a re-run. (A cold train job saves the update in flight instead,
:mod:`mugrpo.trainer.preemption`.)

Exit codes: 0 done, 1 generation failed, 2 bad spec or bad rollouts, 3 NaN/inf loss or gradient, 75 preempted.
"""

from __future__ import annotations

from mugrpo.common.exit_codes import exit_code_of
from mugrpo.common.preemption import PreemptionInterrupt, PreemptionNotice
from mugrpo.jobs.common import (
    PROCESS_START,
    fail,
    load_spec,
    preempted,
    prepare_process,
    refuse_untrusted,
    run_noticed,
    spec_argument,
)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: ``python -m mugrpo.jobs.segment SPEC``."""
    run_noticed(
        "segment",
        lambda notice: _segment(argv, notice),
        "segment: stopped by {signal} while it started; nothing committed yet",
    )


def _segment(argv: list[str] | None, notice: PreemptionNotice) -> None:
    # Imported here, not at the top: the verifier pools' workers re-import the job's main module (``__mp_main__``),
    # and at the top these imports made each of them import torch and transformers before it could score
    # (tests/unit/test_job_imports.py keeps the module light).
    from transformers.utils import logging as hf_logging

    from mugrpo.commits.tables import SchemaError
    from mugrpo.execution.warm import SegmentSpec, run_segment
    from mugrpo.generation import GenerationError
    from mugrpo.trainer.data import RolloutDataError
    from mugrpo.trainer.step import NonFiniteError

    spec = load_spec(spec_argument(argv, "mugrpo.jobs.segment", SegmentSpec, __doc__), SegmentSpec)
    try:
        prepare_process()
        hf_logging.disable_progress_bar()  # in a terminal too: the jobs draw their own progress bars
        with refuse_untrusted("segment", spec.stage):
            run_segment(spec, origin=PROCESS_START)
    except PreemptionInterrupt:
        preempted(
            f"segment from stage {spec.stage}: stopped by {notice.signal_name}; what it committed is kept", notice
        )
    except GenerationError as e:
        fail(str(e), exit_code_of(e, job=True))
    except (RolloutDataError, SchemaError) as e:
        fail(f"segment from stage {spec.stage}: bad rollouts: {e}", exit_code_of(e, job=True))
    except NonFiniteError as e:
        fail(
            f"segment from stage {spec.stage}: stopped, no checkpoint written for this update: {e}",
            exit_code_of(e, job=True),
        )


if __name__ == "__main__":
    main()
