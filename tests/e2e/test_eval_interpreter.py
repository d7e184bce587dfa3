"""The eval job runs in the interpreter of the engine it samples with, and the default per-stage eval
(``eval.every_stage: true``, the main config's setting) runs inside a real flow.

Found following README's vLLM section: generation ran in ``generation.python`` (.venv-vllm), then the eval job,
which samples with the same engine, was launched in the main interpreter and failed (``No module named 'vllm'``).
Now ``eval.python`` follows ``generation.python`` and a conflicting value is refused at load, naming both keys.

- config level: the derived interpreter and the refusal (no vLLM needed);
- a real 1-stage flow (``mugrpo run``, real Prefect server, real job subprocesses) whose ``generation.python`` is a
  wrapper around this interpreter that records each job it starts: the generate job and both eval jobs (stage 0's
  per-stage eval and the final one) go through it, the train job does not, and both evals are committed;
- the same flow with ``generation.engine: vllm`` in the vLLM virtualenv, skipped unless ``MUGRPO_VLLM_PYTHON``
  names it (like tests/integration/test_vllm_engine.py).
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from flows.stage import job_python
from mugrpo.cli import app
from mugrpo.commits.manifest import read_job_manifest, read_manifest
from mugrpo.config import ConfigError, load_config
from mugrpo.storage.store import Store
from tasks.kubernetes.settings import KubernetesJobSettings

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
VLLM_PYTHON = os.environ.get("MUGRPO_VLLM_PYTHON")
runner = CliRunner()


def test_eval_job_runs_in_the_generation_interpreter_unless_set():
    vllm = load_config(None, ["generation.engine=vllm", "generation.python=.venv-vllm/bin/python"])
    assert job_python(vllm, "generate") == job_python(vllm, "eval") == ".venv-vllm/bin/python"
    assert job_python(vllm, "train") is None  # the trainer stays in the main interpreter
    same = load_config(None, ["generation.engine=vllm", "generation.python=/v/bin/python", "eval.python=/v/bin/python"])
    assert job_python(same, "eval") == "/v/bin/python"
    # transformers runs anywhere: an explicit eval.python is kept
    other = load_config(None, ["generation.python=/gen/bin/python", "eval.python=/eval/bin/python"])
    assert job_python(other, "eval") == "/eval/bin/python"
    assert job_python(load_config(None, []), "eval") is None  # nothing set: this interpreter


def test_a_vllm_eval_in_another_interpreter_is_refused_at_load_naming_both_keys():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["generation.engine=vllm", "generation.python=.venv-vllm/bin/python", "eval.python=python3"])
    message = str(err.value)
    assert "eval.python ('python3')" in message and "generation.python ('.venv-vllm/bin/python')" in message
    with pytest.raises(ConfigError, match="generation.python \\(None\\)"):
        load_config(None, ["generation.engine=vllm", "eval.python=.venv-vllm/bin/python"])


def test_kubernetes_eval_job_gets_the_generation_image_and_gpus_unless_set():
    settings = KubernetesJobSettings(
        image="reg/mugrpo:cpu", images={"generate": "reg/mugrpo:vllm"}, gpus={"generate": 2, "train": 1}
    )
    assert (settings.image_for("eval"), settings.gpus_for("eval")) == ("reg/mugrpo:vllm", 2)
    assert (settings.image_for("train"), settings.gpus_for("train")) == ("reg/mugrpo:cpu", 1)
    own = KubernetesJobSettings(
        image="reg/mugrpo:cpu", images={"generate": "reg/a", "eval": "reg/b"}, gpus={"generate": 2, "eval": 0}
    )
    assert (own.image_for("eval"), own.gpus_for("eval")) == ("reg/b", 0)


def recording_interpreter(path: Path, real: str, log: Path) -> Path:
    """An executable that appends its arguments to ``log``, then runs them with ``real``."""
    path.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexec "{real}" "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def one_stage_overrides(root: Path, model_dir: Path, run_id: str) -> list[str]:
    bench = {"name": "gsm8k", "path": str(DATA / "gsm8k/test.jsonl"), "answer_kind": "gsm8k"}
    return [
        f"run.root={root}",
        f"run.id={run_id}",
        "run.num_stages=1",
        f"model.source={model_dir}",
        "model.max_context=512",
        f"data.train.path={DATA / 'gsm8k/train.jsonl'}",
        "data.train.limit=8",
        "generation.prompts_per_stage=2",
        "generation.shard_size=2",
        "generation.sampling.max_new_tokens=6",
        "generation.sampling.n=2",
        "train.updates_per_stage=1",
        "train.rollouts_per_update=4",
        "train.micro_batch_size=2",
        f"eval.benchmarks=[{json.dumps({'dataset': bench, 'num_prompts': 2, 'max_new_tokens': 4})}]",
        "orchestration.retries=0",
        "tracking.sinks=[]",
    ]


def assert_both_evals_committed(root: Path, run_id: str) -> None:
    store = Store(str(root))
    for stage in (0, 1):  # stage 0's per-stage eval (eval.every_stage) and the final policy's
        manifest = read_job_manifest(store, run_id, stage, "eval")
        assert manifest is not None, f"no eval job manifest for policy {stage}"
        assert pq.read_table(root / run_id / f"evals/stage={stage}/gsm8k.parquet").num_rows == 2
    stage0 = read_manifest(store, run_id, 0)
    assert any(k.startswith("eval/") for k in stage0.metrics), stage0.metrics


@pytest.mark.parametrize("fork", [False, True])
def test_default_per_stage_eval_runs_in_a_flow_in_the_generation_interpreter(
    tmp_path, tiny_model_dir, prefect_api, fork
):
    """Every job a new interpreter (``orchestration.fork_jobs: false``): the generate job and both evals start
    through the generation interpreter, the train job does not. Forked from the job fork server (the default): the
    generation interpreter starts one server (servers are kept by interpreter), which forks those three jobs."""
    log = tmp_path / "interpreter.log"
    wrapper = recording_interpreter(tmp_path / "gen-python", sys.executable, log)
    overrides = [
        *one_stage_overrides(tmp_path, tiny_model_dir, "evalflow"),
        f"generation.python={wrapper}",
        f"orchestration.fork_jobs={str(fork).lower()}",
    ]
    cfg = load_config("configs/gsm8k-smollm2-quick.yaml", overrides)
    assert cfg.eval.every_stage and cfg.eval.python is None  # the main config's default: evaluate every stage
    result = runner.invoke(app, ["run", "configs/gsm8k-smollm2-quick.yaml", *overrides])
    assert result.exit_code == 0, result.output
    assert_both_evals_committed(tmp_path, "evalflow")
    started = [line.split()[1] for line in log.read_text().splitlines()]  # "-m mugrpo.jobs.KIND SPEC"
    expected = ["mugrpo.jobs.forkserver"] if fork else ["mugrpo.jobs.generate", "mugrpo.jobs.eval", "mugrpo.jobs.eval"]
    assert started == expected, started


@pytest.mark.vllm
def test_readme_vllm_config_runs_end_to_end(tmp_path, tiny_model_dir, prefect_api):
    overrides = [
        *one_stage_overrides(tmp_path, tiny_model_dir, "vllmflow"),
        "generation.engine=vllm",
        f"generation.python={VLLM_PYTHON}",
        "generation.engine_kwargs={max_model_len: 512, enforce_eager: true}",  # the tiny policy: eager starts fast
    ]
    overrides += ["model.dtype=bfloat16", "train.mixed_precision=bf16", "train.recompute_behavior_logprobs=true"]
    cfg = load_config("configs/gsm8k-smollm2-quick.yaml", overrides)
    assert cfg.train.recompute_behavior_logprobs and cfg.model.dtype == "bfloat16"  # auto's pick with bf16 units
    result = runner.invoke(app, ["run", "configs/gsm8k-smollm2-quick.yaml", *overrides])
    assert result.exit_code == 0, result.output
    assert_both_evals_committed(tmp_path, "vllmflow")
    assert_update_1_fidelity_under_vllm_bf16(tmp_path / "vllmflow")


#: Update-1 importance ratio with recompute_behavior_logprobs (the bf16 configs' setting): the behavior log-probs
#: are the trainer's own, under the same autocast and batch-invariant attention, so the ratio is 1 up to this
#: (docs/precision.md; tests/unit/test_precision.py holds the same bound).
RECOMPUTE_RATIO_TOLERANCE = 1e-6
#: Raw vLLM-bf16 vs trainer-bf16-autocast mismatch, read off the health panel (which compares pi_theta with the
#: engine's log-probs q even when the loss uses the recompute: update 1 with recompute off would see these ratios).
#: bf16 keeps 8 significand bits, so two bf16 forwards with different kernels differ per token by up to a few
#: tenths of a nat (measured on this tiny policy: max |log r| 0.12 over 32 tokens; in this run p1 0.934, max
#: 1.046; SmolLM2-135M over ~2,000 tokens, docs/precision.md: up to 0.61 with the transformers engine). Beyond this
#: bound the engine is not sampling the trainer's policy (a convention error: temperature, truncation, weights).
BF16_MAX_ABS_LOG_RATIO = 1.0


def assert_update_1_fidelity_under_vllm_bf16(run_dir: Path) -> None:
    """Every stage's first update (policy unchanged since its rollouts were sampled) in ``train_steps``: the loss's
    ratio is 1 within RECOMPUTE_RATIO_TOLERANCE and the Mu-GRPO veto never fires; the panel's raw vLLM-vs-trainer
    ratios stay within BF16_MAX_ABS_LOG_RATIO and are not all 1 (the panel reads the engine's q, not the recompute)."""
    stages = sorted(p.name for p in run_dir.glob("train_steps/stage=*"))
    assert stages, run_dir
    for stage in stages:
        steps = pq.read_table(run_dir / "train_steps" / stage).to_pylist()
        first = [s for s in steps if s["stage_update"] == 1]
        assert len(first) == 1, (stage, steps)
        row = first[0]
        assert abs(row["ratio_mean"] - 1) <= RECOMPUTE_RATIO_TOLERANCE, (stage, row["ratio_mean"])
        assert abs(row["ratio_max"] - 1) <= RECOMPUTE_RATIO_TOLERANCE, (stage, row["ratio_max"])
        assert row["veto_token_frac"] == 0 and row["veto_response_frac"] == 0, (stage, row)
        assert row["trigger_count"] == 0, (stage, row)
        low, high, top = row["sampler_ratio_p1"], row["sampler_ratio_p99"], row["sampler_ratio_max"]
        print(f"\n{stage} update 1, vLLM bf16 vs trainer bf16: sampler ratio p1 {low:.4f} p99 {high:.4f} max {top:.4f}")
        assert math.exp(-BF16_MAX_ABS_LOG_RATIO) <= low <= high <= top <= math.exp(BF16_MAX_ABS_LOG_RATIO), row
        assert (low, top) != (1.0, 1.0), row
