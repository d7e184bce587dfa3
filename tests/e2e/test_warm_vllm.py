"""Warm execution on the vLLM engine (tier c): one segment job runs 2 stages with one vLLM engine, the
trainer's weights loaded into it in place after each stage's updates (``collective_rpc`` + vLLM's in-place
``reload_weights``), compared with the cold run of the same config (a fresh engine per generate job).

- Every stage, the first included: vLLM's CPU sampler is deterministic given the engine core's torch generator
  (the segment reseeds it with the cold job's seed before each generation and drops the prefix cache), but it draws
  one noise seed per row of its persistent batch, and which request sits in which row depends on the requests the
  engine ran before (and, seen under load, on scheduling: a first stage can differ too). So a warm engine can hand
  a request another row's noise than a fresh engine does, and the two runs' responses then differ. Checked: where a
  warm and a cold response share a prefix, its log-probs are bitwise equal (the reloaded weights are bitwise those a
  fresh engine loads), and every warm log-prob equals the teacher-forced log-prob of the stage's published policy
  within 1e-4 (the engine test's tolerance): the warm engine samples exactly the distribution the cold one does.
- The weight sync is measured per stage (T_sync) and shown by ``mugrpo status``.
- Ratio fidelity (tier d), fp32 with the library default ``train.recompute_behavior_logprobs: false``: at each
  stage's first update (policy unchanged) the loss's ratio and the health panel's raw vLLM-vs-trainer ratios are 1
  within 1e-4 in both runs, and the veto never fires.

Both runs train in the vLLM virtualenv (``train.python``), as the warm segment does. Tiny policy, real jobs and
files; needs ``MUGRPO_VLLM_PYTHON`` (tests/conftest.py: a failure under CI without it).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from _tiny import REPO_ROOT, job_env, start_job, tiny_config
from safetensors.torch import load_file

from mugrpo.commits.manifest import read_manifest
from mugrpo.config import config_from_dict
from mugrpo.config.precision import concrete
from mugrpo.execution.warm import SegmentSpec
from mugrpo.orchestration.job_specs import write_job_specs
from mugrpo.orchestration.runs import attach_run, commit_stage, init_run, open_store
from mugrpo.policy.models import load_policy, response_logprobs
from mugrpo.storage.layout import RunLayout
from schemas import StageTimings

RUN = "warmvllm"
#: Two stages: stage 0 starts the engine on the behavior policy, stage 1 samples after an in-place weight load (the
#: sync under test); a third stage would repeat that load and cost another fresh engine in the cold run.
STAGES, UPDATES = 2, 2
VLLM_PYTHON = os.environ.get("MUGRPO_VLLM_PYTHON", "")

pytestmark = pytest.mark.vllm


def vllm_config(root: Path, model_dir: Path, **orchestration) -> dict:
    return tiny_config(
        root,
        model_dir,
        run_id=RUN,
        run={"seed": 3, "num_stages": STAGES},
        loss={"name": "grpo"},
        generation={
            "engine": "vllm",
            "python": VLLM_PYTHON,
            # 64 MiB of KV cache: the tiny policy; eager: its few tokens do not repay a compiled start
            "engine_kwargs": {"max_model_len": 512, "kv_cache_memory_bytes": 2**26, "enforce_eager": True},
            "sampling": {"max_new_tokens": 8},
        },
        train={"updates_per_stage": UPDATES, "checkpoint_every": UPDATES, "python": VLLM_PYTHON},
        orchestration=orchestration,
    )


def _ok(proc: subprocess.Popen, log: Path) -> None:
    assert proc.wait(timeout=1200) == 0, log.read_text()[-5000:]


def _env() -> dict[str, str]:
    return job_env()  # one torch thread per job (the cold chain and the segment run side by side)


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> dict:
    """The cold run (generate and train jobs per stage, as the stage flow launches them) and the warm segment."""
    tmp = tmp_path_factory.mktemp("warm-vllm")
    warm = config_from_dict(vllm_config(tmp / "warm", tiny_model_dir, execution="warm", segment_stages=STAGES))
    init_run(warm)
    spec = tmp / "segment.json"
    spec.write_text(SegmentSpec.from_config(warm, 0, STAGES).model_dump_json())
    segment = start_job("segment", spec, tmp / "warm.log", env=_env(), python=VLLM_PYTHON)  # runs beside the cold
    cold = config_from_dict(vllm_config(tmp / "cold", tiny_model_dir))
    init_run(cold)
    cold_run = attach_run(cold)
    log = tmp / "cold.log"
    for k in range(STAGES):
        urls = write_job_specs(cold_run, k)
        for job in ("generate", "train"):
            _ok(start_job(job, urls[job], log, env=_env(), python=VLLM_PYTHON), log)
        commit_stage(cold_run, k, StageTimings())
    _ok(segment, tmp / "warm.log")
    return {"cold": cold, "warm": warm, "tmp": tmp, "warm_log": (tmp / "warm.log").read_text()}


def _rollouts(cfg, stage: int):
    path = open_store(cfg).local_path(RunLayout(RUN).rollouts_dir(stage))
    return pq.read_table(path).sort_by([("prompt_id", "ascending"), ("sample_idx", "ascending")])


def test_warm_vllm_samples_the_synced_policy_and_matches_the_cold_run_where_the_noise_does(runs):
    cold, warm = runs["cold"], runs["warm"]
    shared = 0
    for k in range(STAGES):
        assert _rollouts(cold, k).num_rows == _rollouts(warm, k).num_rows == 4 * 2
        # the sampling noise may land on other requests than in a fresh engine (module docstring); where a warm
        # and a cold response share a prefix, its log-probs are bitwise equal: the reloaded weights are bitwise
        # those a fresh engine loads from the published policy
        for ra, rb in zip(_rollouts(cold, k).to_pylist(), _rollouts(warm, k).to_pylist(), strict=True):
            assert (ra["prompt_id"], ra["sample_idx"]) == (rb["prompt_id"], rb["sample_idx"])
            n = 0
            while n < min(len(ra["response_token_ids"]), len(rb["response_token_ids"])) and (
                ra["response_token_ids"][n] == rb["response_token_ids"][n]
            ):
                n += 1
            assert ra["behavior_logprobs"][:n] == rb["behavior_logprobs"][:n], (k, ra["prompt_id"])
            shared += n
        # and the warm engine sampled from the synced policy: its log-probs are the teacher-forced ones of the
        # stage's published behavior policy
        rows = _rollouts(warm, k).to_pylist()
        model, _ = load_policy(open_store(warm).local_path(RunLayout(RUN).policy_dir(k)))
        reference = response_logprobs(
            model, [r["prompt_token_ids"] for r in rows], [r["response_token_ids"] for r in rows], 1.0
        )
        diff = max(
            abs(x - y)
            for r, ref in zip(rows, reference, strict=True)
            for x, y in zip(r["behavior_logprobs"], ref, strict=True)
        )
        assert diff < 1e-4, (k, diff)
    assert shared > 0
    # one engine for the segment, weights loaded into it in place before every stage after the first
    assert runs["warm_log"].count("weights synced into the vllm engine") == STAGES


def test_t_sync_is_measured_per_stage_and_shown_by_status(runs):
    warm = runs["warm"]
    store = open_store(warm)
    t_sync = [read_manifest(store, RUN, k).timings.t_sync for k in range(STAGES)]
    assert t_sync[0] < 0.05  # the engine started on stage 0's behavior policy: nothing to load
    assert all(t > 0 for t in t_sync[1:]), t_sync
    print(f"\nwarm vLLM T_sync per stage: {[round(t, 4) for t in t_sync]} s", file=sys.stderr)
    out = subprocess.run(
        [sys.executable, "-m", "mugrpo.cli", "status", RUN, "--root", str(warm.run.root)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "T_sync" in out.stdout and "warm execution" in out.stdout
    rows = [line for line in out.stdout.splitlines() if re.match(r"\W*[0-2]\W+committed", line)]
    assert len(rows) == STAGES, out.stdout
    for row, t in zip(rows, t_sync, strict=True):
        assert f"{t:.3f}s" in row, (row, t)


#: fp32, recompute off: the update-1 ratio is vLLM's log-prob against the trainer's, 1 within the engine test's
#: fp32 mismatch bound (tests/integration/test_vllm_engine.py, FP32_MISMATCH_TOLERANCE; docs/precision.md).
FP32_RATIO_TOLERANCE = 1e-4


def test_update_1_ratio_of_every_stage_is_1_in_fp32_without_recompute(runs):
    for name in ("cold", "warm"):
        cfg = runs[name]
        resolved = concrete(cfg)  # the library defaults: auto precision, pinned to fp32 in the suite (conftest)
        assert not resolved.train.recompute_behavior_logprobs and resolved.model.dtype == "float32"
        for k in range(STAGES):
            path = open_store(cfg).local_path(RunLayout(RUN).train_steps_dir(k))
            first = [s for s in pq.read_table(path).to_pylist() if s["stage_update"] == 1]
            assert len(first) == 1, (name, k)
            row = first[0]
            bound = math.exp(FP32_RATIO_TOLERANCE)
            for col in ("ratio_mean", "ratio_max", "sampler_ratio_p1", "sampler_ratio_p99", "sampler_ratio_max"):
                assert 1 / bound <= row[col] <= bound, (name, k, col, row[col])
            assert row["veto_token_frac"] in (0, None) and row["trigger_count"] in (0, None), (name, k, row)
