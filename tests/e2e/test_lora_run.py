"""LoRA runs (train.lora, mugrpo/policy/adapters.py) through the cold stage schedule: every stage publishes only its
adapter, with a reference to its base; the sampling jobs merge it into the base once per stage, and what they
sample from is what the trainer trains (here: its first importance ratio is 1; tests/integration/test_lora.py
checks the merged sampler against a trained adapter token by token).

Tiny random policy with the real SmolLM2 tokenizer, real GSM8K rows, real job processes (pre-started, forked from
the job fork server), real files; peft's own LoRA layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _tiny import tiny_config
from safetensors.torch import load_file

from bench.warm_vs_cold import run_cold
from mugrpo.commits.manifest import read_job_manifest
from mugrpo.config import ConfigError, config_from_dict
from mugrpo.orchestration.runs import open_store
from mugrpo.policy.adapters import ADAPTER_CONFIG, BASE_REF_FILE
from mugrpo.storage.layout import RunLayout

pytestmark = pytest.mark.slow
RUN = "lora"
STAGES = 2


def test_a_lora_run_publishes_adapters_and_samples_the_trained_policy(tiny_model_dir, tmp_path):
    cfg = config_from_dict(
        tiny_config(
            tmp_path / "runs",
            tiny_model_dir,
            run_id=RUN,
            run={"num_stages": STAGES},
            train={"lora": {"rank": 4, "alpha": 8.0}, "lr": 1e-2},
            eval={"every_stage": True},
        )
    )
    run_cold(cfg, tmp_path / "jobs.log")
    store, layout = open_store(cfg), RunLayout(RUN)
    base = store.local_path(layout.policy_dir(0))
    full_bytes = (base / "model.safetensors").stat().st_size
    for k in range(1, STAGES + 1):
        adapter = store.local_path(layout.policy_dir(k))
        assert (adapter / ADAPTER_CONFIG).is_file() and not (adapter / "model.safetensors").exists()
        weights = load_file(str(adapter / "adapter_model.safetensors"))
        assert weights and all("lora_" in name for name in weights)
        assert (adapter / "adapter_model.safetensors").stat().st_size < full_bytes / 4
        ref = json.loads((adapter / BASE_REF_FILE).read_text())
        assert ref["policy"] == layout.policy_dir(0)
        assert ref["files"] == store.read_json(f"{layout.policy_dir(0)}/_COMPLETE")["files"]
    # stage 1 sampled from the merged policy of stage 1: the trainer's first ratio is 1 (the tiny random policy
    # earns no reward here, so the adapter's B stays 0: tests/integration/test_lora.py trains one that moves)
    steps = pq.read_table(store.local_path(layout.train_steps_dir(1))).sort_by("stage_update").to_pylist()
    assert abs(steps[0]["ratio_mean"] - 1.0) < 1e-4, steps[0]["ratio_mean"]
    for k in range(STAGES):
        assert read_job_manifest(store, RUN, k, "eval") is not None


def test_lora_runs_cold(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="train.lora needs orchestration.execution = cold"):
        config_from_dict(
            tiny_config(tmp_path, tiny_model_dir, train={"lora": {"rank": 2}}, orchestration={"execution": "warm"})
        )


def test_lora_without_peft_names_the_extra(tiny_model_dir, tmp_path, monkeypatch):
    """peft is looked up, not imported, when a config is validated (read-only commands validate configs too); where
    it is not installed the config error names the extra."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(ConfigError, match=r"train.lora needs the 'peft' package: pip install -e '\.\[lora\]'"):
        config_from_dict(tiny_config(tmp_path, tiny_model_dir, train={"lora": {"rank": 2}}))
