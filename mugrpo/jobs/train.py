"""The training job: ``train.updates_per_stage`` optimizer updates of the policy on a stage's static rollouts,
with checkpoints and exact resume (docs/design.md, second half of a stage).

    python -m mugrpo.jobs.train SPEC      # SPEC: path or fsspec URL of a TrainSpec JSON (jobs/stage=k/train.spec.json)

The same code runs on one CPU, one GPU and several GPUs through accelerate (the launcher sets the processes up;
the job reads nothing else from it):

    # CPU (one process; the tests and the benchmark run this)
    python -m mugrpo.jobs.train runs/my-run/jobs/stage=0/train.spec.json

    # one GPU (plain python picks the GPU up too; add --mixed_precision bf16 for bf16 autocast, or set
    # train.mixed_precision in the config)
    accelerate launch --num_processes 1 -m mugrpo.jobs.train SPEC

    # several GPUs, data parallel (DDP): each rank takes a share of every minibatch; the loss is normalized by
    # the whole minibatch's counts, so results do not depend on the number of GPUs
    accelerate launch --multi_gpu --num_processes 4 -m mugrpo.jobs.train SPEC

    # the same data parallelism on CPU processes (gloo); the tests check it matches one process
    ACCELERATE_USE_CPU=true torchrun --standalone --nproc_per_node 2 -m mugrpo.jobs.train SPEC

    # several GPUs, sharded (FSDP): parameters, gradients and AdamW state sharded over ranks; checkpoints and the
    # published policy are gathered to full state dicts on rank 0
    accelerate launch --use_fsdp --num_processes 4 --fsdp_version 2 \\
        --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer \\
        --fsdp_state_dict_type FULL_STATE_DICT -m mugrpo.jobs.train SPEC

(``LlamaDecoderLayer`` for Llama/SmolLM2; ``Qwen2DecoderLayer`` for Qwen2.5, etc. An ``s3://`` SPEC needs the
store's credentials in the environment; ``MUGRPO_STORAGE_OPTIONS`` may carry JSON fsspec options for reading it.)

Pre-started (``start_after``, :mod:`mugrpo.coordination.start_gate`): the job imports torch, transformers and
accelerate, then waits for the generate manifest of its stage (and the previous stage's commit) before it reads
anything.

Preemption: on SIGTERM the job stops at the next safe point (it finishes the update in flight when the rest of it
and a checkpoint fit in the grace, else drops it), writes a checkpoint when its predicted write time fits in what is
left of the grace (``MUGRPO_STOP_GRACE_S``: seconds to the SIGKILL; the launchers set it from
``orchestration.stop_grace_s``), records ``jobs/stage=k/train.preempted.json`` and exits 75. A re-run resumes from
the saved update (:mod:`mugrpo.trainer.preemption`).

Exit codes: 0 done (or already committed), 1 inputs not committed within ``start_timeout_s``, 2 bad spec, bad
rollouts, a tampered input (checksum mismatch, the file named), a lost run lease or AdamW moments it starts from that
``train.keep_optimizer_state`` pruned (the checkpoint and the key named), 3 NaN/inf loss or gradient (the
minibatch's prompt ids are in ``jobs/stage=k/train.nonfinite.json``; the last checkpoint is intact), 75 preempted
(SIGTERM; saved at the update it names).
"""

from __future__ import annotations

import torch
from transformers.utils import logging as hf_logging

from mugrpo.commits.tables import SchemaError
from mugrpo.common.exit_codes import exit_code_of
from mugrpo.common.preemption import PreemptionInterrupt, PreemptionNotice
from mugrpo.coordination.start_gate import StartGate
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
from mugrpo.trainer.data import RolloutDataError
from mugrpo.trainer.loop import run_training
from mugrpo.trainer.preemption import Preempted
from mugrpo.trainer.spec import TrainSpec
from mugrpo.trainer.step import NonFiniteError


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: ``python -m mugrpo.jobs.train SPEC``."""
    # Until the update loop starts, a notice stops the job at once: nothing to save.
    run_noticed(
        "train", lambda notice: _train(argv, notice), "train: stopped by {signal} while it started; nothing to save"
    )


def _train(argv: list[str] | None, notice: PreemptionNotice) -> None:
    spec = load_spec(spec_argument(argv, "mugrpo.jobs.train", TrainSpec, __doc__), TrainSpec)
    try:
        prepare_process()
        hf_logging.disable_progress_bar()  # in a terminal too: the job draws its own progress bar
        # CPU: flush subnormal floats to zero. Softmax probabilities below 1.2e-38 (common over a 49k-152k
        # vocabulary) are subnormal, and x86 arithmetic on them is 10-100x slower; as zeros they change no log-prob
        # (those are computed in log space) and no gradient measurably. Deterministic, so resume stays bitwise exact.
        torch.set_flush_denormal(True)
        with refuse_untrusted("train", spec.stage):  # tampered checkpoint/optimizer/rollouts: exit 2, file named
            run_training(spec, origin=PROCESS_START, gate=StartGate(spec), notice=notice)
    except Preempted as stop:
        preempted(str(stop))
    except PreemptionInterrupt:
        said = f"train stage {spec.stage}: stopped by {notice.signal_name} before its update loop; nothing to save"
        preempted(said, notice)
    except (RolloutDataError, SchemaError) as e:
        fail(f"train stage {spec.stage}: bad rollouts: {e}", exit_code_of(e, job=True))
    except NonFiniteError as e:
        fail(
            f"train stage {spec.stage}: stopped, no checkpoint written for this update: {e}", exit_code_of(e, job=True)
        )


if __name__ == "__main__":
    main()
