"""The evaluation job: avg@k and pass@k of one policy on each configured benchmark (the library is
:mod:`mugrpo.evaluation.worker`).

    python -m mugrpo.jobs.eval SPEC          # SPEC: path or URL of an EvalSpec JSON

Writes one Parquet file per benchmark, ``evals/stage={k}/{benchmark}.parquet`` (one row per sample), skipping
benchmarks already written (resume), then its worker manifest, then (once every worker has committed, with
``eval.workers`` > 1 splitting the benchmarks; :mod:`mugrpo.coordination.fanout`) the job manifest with avg@k / pass@k
per benchmark. ``stage`` names the policy evaluated: policies/stage={k} (stage K is the final policy).

Pre-started (``start_after``, :mod:`mugrpo.coordination.start_gate`): the verifier pool and the benchmarks are ready
before the policy's commit marker appears.

Preemption: on SIGTERM the job stops at once and exits 75; the benchmarks written by then are kept, the one being
evaluated is discarded (a re-run evaluates it again).

Exit codes: 0 done, 1 inputs not committed within ``start_timeout_s``, 2 bad spec, a tampered input or a lost run
lease, 75 preempted (SIGTERM).
"""

from __future__ import annotations

from mugrpo.common.preemption import PreemptionInterrupt, PreemptionNotice
from mugrpo.coordination.start_gate import StartGate
from mugrpo.jobs.common import (
    PROCESS_START,
    load_spec,
    preempted,
    prepare_process,
    refuse_untrusted,
    run_noticed,
    spec_argument,
)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: ``python -m mugrpo.jobs.eval SPEC``."""
    run_noticed(
        "eval",
        lambda notice: _evaluate(argv, notice),
        "eval: stopped by {signal} while it started; nothing evaluated yet",
    )


def _evaluate(argv: list[str] | None, notice: PreemptionNotice) -> None:
    # Imported here, not at the top: the verifier pool's workers re-import the job's main module (``__mp_main__``),
    # and at the top this import made each of them import torch and transformers (1.2 s of CPU per worker) before
    # it could score; tests/unit/test_job_imports.py keeps the module light.
    from mugrpo.evaluation.worker import EvalSpec, run_eval

    spec = load_spec(spec_argument(argv, "mugrpo.jobs.eval", EvalSpec, __doc__), EvalSpec)
    try:
        prepare_process()
        with refuse_untrusted("eval", spec.stage):
            run_eval(spec, origin=PROCESS_START, gate=StartGate(spec))
    except PreemptionInterrupt:
        preempted(
            f"eval stage {spec.stage}: stopped by {notice.signal_name}; the benchmark being evaluated is discarded",
            notice,
        )


if __name__ == "__main__":
    main()
