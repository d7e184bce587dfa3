"""A config that names its precision computes the same bits on any machine (docs/precision.md, "auto").

The lab configs pin ``model.dtype: float32`` and ``train.mixed_precision: "no"`` and leave
``train.checkpoint_dtype`` at ``auto``. When each ``auto`` key asked the hardware on its own, that key resolved to
bfloat16 on a CPU with bf16 units, and the trainer rounded its weights and AdamW moments to bf16 at every checkpoint
there and not on a CPU without them: the same config trained differently on two machines. Now the explicit
``model.dtype`` decides it (:data:`mugrpo.config.precision.FOLLOW_MODEL_DTYPE`).

``configs/lab/grpo.yaml`` (warm execution), shrunk to the tiny policy and 2 stages of 2 updates, is started twice, as
``mugrpo run`` starts it (:func:`mugrpo.orchestration.runs.start_run` resolves the precision, then the segment job
runs the stages), each in its own process: with ``MUGRPO_CPU_BF16_UNITS=0`` (a CPU without bf16 units) and with
``MUGRPO_CPU_BF16_UNITS=1`` and a probe that confirms them (bf16 matmuls twice as fast as fp32: a bf16 machine on
any CPU this test runs on). The final published weights must be bitwise equal, and fp32. About 30 s on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _tiny import REPO_ROOT, job_env
from safetensors.torch import load_file

pytest.importorskip("reasoning_gym")

CONFIG = REPO_ROOT / "configs" / "lab" / "grpo.yaml"
RUN = "lab-precision"
STAGES = 2

#: One "machine": ``python -c DRIVER UNITS CONFIG SPEC OVERRIDES...``. With units on, the bf16 probe is made to
#: agree (bf16 2x fp32), as on a CPU with AVX512-BF16 or AMX; then the run starts (precision resolved and recorded
#: in run.json) and the segment job runs every stage in this process. Prints the machine's verdict and the record.
DRIVER = """
import json, sys
from pathlib import Path

import mugrpo.common.hardware as hardware

if sys.argv[1] == "1":
    hardware.matmul_gflops = lambda dtype, *a, **k: 20.0 if dtype.itemsize == 2 else 10.0
from mugrpo.config import load_config
from mugrpo.execution.warm import SegmentSpec
from mugrpo.jobs.segment import main
from mugrpo.orchestration.runs import start_run

started = start_run(load_config(sys.argv[2], sys.argv[4:]))
spec = Path(sys.argv[3])
spec.write_text(SegmentSpec.from_config(started.config, 0, started.config.run.num_stages).model_dump_json())
verdict = hardware.bf16_verdict()
print("MACHINE " + json.dumps({"native": verdict.native, "reason": verdict.reason, "precision": started.precision}))
main([str(spec)])
"""


def tiny_lab_overrides(root: Path, model_dir: Path) -> list[str]:
    """The lab config on the tiny policy: 2 stages of 4 prompts x 2 responses of at most 6 tokens, 2 updates of 4
    rollouts per stage with a checkpoint after each (every checkpoint is where bf16 would round), no evaluation.
    Weight decay moves the weights although the tiny policy earns no reward (zero advantages)."""
    return [
        f"run.root={root}",
        f"run.id={RUN}",
        f"run.num_stages={STAGES}",
        f"model.source={model_dir}",
        "data.train.size=64",
        "generation.prompts_per_stage=4",
        "generation.shard_size=2",
        "generation.sampling.n=2",
        "generation.sampling.max_new_tokens=6",
        "train.updates_per_stage=2",
        "train.rollouts_per_update=4",
        "train.micro_batch_size=2",
        "train.checkpoint_every=1",
        "train.skip_zero_variance_groups=false",
        "train.weight_decay=0.1",
        "eval.every_stage=false",
        f"orchestration.segment_stages={STAGES}",
        "orchestration.publish_policy_every=1",
    ]


def start_machine(units: str, root: Path, model_dir: Path) -> subprocess.Popen:
    """The run on a machine with (``units="1"``) or without (``"0"``) bf16 units; auto precision not pinned."""
    env = {k: v for k, v in job_env(MUGRPO_CPU_BF16_UNITS=units).items() if k != "MUGRPO_AUTO_PRECISION"}
    root.mkdir(parents=True)
    args = [str(CONFIG), str(root / "segment.spec.json"), *tiny_lab_overrides(root / "runs", model_dir)]
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, units, *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=(root / "run.log").open("wb"),
        stderr=subprocess.STDOUT,
    )


def test_a_lab_config_trains_the_same_bits_with_and_without_bf16_units(tmp_path, tiny_model_dir):
    roots = {units: tmp_path / f"units-{units}" for units in ("0", "1")}
    procs = {units: start_machine(units, root, tiny_model_dir) for units, root in roots.items()}  # side by side
    for units, proc in procs.items():
        assert proc.wait(timeout=600) == 0, (roots[units] / "run.log").read_text()[-4000:]
    machines = {}
    for units, root in roots.items():
        (line,) = [ln for ln in (root / "run.log").read_text().splitlines() if ln.startswith("MACHINE ")]
        machines[units] = json.loads(line.removeprefix("MACHINE "))
    # The two processes really are two machines: auto alone would pick bf16 on one and fp32 on the other.
    assert machines["1"]["native"] and not machines["0"]["native"], machines

    final = {
        units: load_file(str(root / "runs" / RUN / f"policies/stage={STAGES}" / "model.safetensors"))
        for units, root in roots.items()
    }
    a, b = final["0"], final["1"]
    unequal = sorted(set(a) ^ set(b)) + sorted(k for k in a.keys() & b.keys() if not torch.equal(a[k], b[k]))
    assert not unequal, f"final weights differ between the two machines (names only in one, or other bits): {unequal}"
    assert {t.dtype for t in a.values()} == {torch.float32}
    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not torch.equal(a[k], initial[k]) for k in a.keys() & initial.keys())  # the run did train
    # Why: model.dtype float32 decided the checkpoint dtype on both machines, not the hardware (run.json's record).
    for machine in machines.values():
        record = machine["precision"]
        assert (record["model.dtype"], record["train.mixed_precision"], record["train.checkpoint_dtype"]) == (
            "float32",
            "no",
            "float32",
        ), record
        assert record["source"]["train.checkpoint_dtype"] == "model.dtype", record
