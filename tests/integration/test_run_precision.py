"""``auto`` precision through a run's bookkeeping (mugrpo.orchestration): resolved once at run start on this
machine, recorded in run.json with its reason and probe figures, kept on resume whatever the resuming machine would
pick, and a change refused as a semantic one with its way out. A CPU without bf16 units is made with the documented
``MUGRPO_CPU_BF16_UNITS=0`` (this machine may have them); real tiny model, real run folder."""

from __future__ import annotations

import json

import pytest

from mugrpo.common.hardware import bf16_verdict
from mugrpo.config import load_config
from mugrpo.generation.spec import GenerateSpec
from mugrpo.orchestration.runs import ConfigMismatchError, start_run
from mugrpo.trainer.spec import TrainSpec


@pytest.fixture
def machine(monkeypatch):
    """This machine without bf16 units, auto not pinned; returns a function that switches the units on."""
    monkeypatch.delenv("MUGRPO_AUTO_PRECISION", raising=False)
    monkeypatch.setenv("MUGRPO_CPU_BF16_UNITS", "0")
    bf16_verdict.cache_clear()

    def with_units(speedup: float) -> None:
        monkeypatch.setenv("MUGRPO_CPU_BF16_UNITS", "1")
        import mugrpo.common.hardware as hardware

        monkeypatch.setattr(
            hardware, "matmul_gflops", lambda dtype, *a, **k: 10.0 * (speedup if dtype.itemsize == 2 else 1)
        )
        bf16_verdict.cache_clear()

    yield with_units
    bf16_verdict.cache_clear()


def _cfg(tmp_path, tiny_model_dir, *more):
    overrides = [f"run.root={tmp_path}", "run.id=p1", f"model.source={tiny_model_dir}", "run.num_stages=2", *more]
    return load_config("configs/gsm8k-smollm2-quick.yaml", overrides)


def test_auto_resolves_to_fp32_without_bf16_units_and_is_recorded(tmp_path, tiny_model_dir, machine):
    started = start_run(_cfg(tmp_path, tiny_model_dir))
    cfg = started.config
    assert (cfg.model.dtype, cfg.train.mixed_precision, cfg.train.checkpoint_dtype) == ("float32", "no", "float32")
    assert cfg.train.recompute_behavior_logprobs is False and started.warning is None
    doc = json.loads((tmp_path / "p1" / "run.json").read_text())
    assert doc["config"]["model"]["dtype"] == "float32" and doc["config"]["train"]["mixed_precision"] == "no"
    record = doc["precision"]
    assert record["requested"]["model.dtype"] == "auto" and record["source"]["model.dtype"] == "auto"
    assert "no bf16 units" in record["reason"] and record["hardware"]["bf16_gflops"] > 0
    # The job specs carry the resolved precision.
    assert GenerateSpec.from_config(cfg, 0, 0).dtype == "float32"
    assert TrainSpec.from_config(cfg, 0, 0).train.mixed_precision == "no"


def test_a_resume_on_a_bf16_machine_keeps_fp32_and_a_change_is_refused(tmp_path, tiny_model_dir, machine):
    start_run(_cfg(tmp_path, tiny_model_dir))
    machine(speedup=2.0)  # the run moves to a machine with bf16 units: auto would pick bf16 here
    assert bf16_verdict().native
    resumed = start_run(_cfg(tmp_path, tiny_model_dir))
    assert resumed.config.model.dtype == "float32" and resumed.precision["source"]["model.dtype"] == "recorded"
    doc = json.loads((tmp_path / "p1" / "run.json").read_text())
    assert doc["history"][-1]["event"] == "resume" and doc["history"][-1]["precision"]["hardware"]["native"]
    with pytest.raises(ConfigMismatchError) as e:
        start_run(_cfg(tmp_path, tiny_model_dir, "model.dtype=bfloat16"))
    message = str(e.value)
    assert 'model.dtype: "float32" -> "bfloat16"' in message and "leave model.dtype at auto" in message


def test_a_bf16_run_resumed_where_bf16_is_emulated_says_so_with_the_ratio(tmp_path, tiny_model_dir, machine):
    machine(speedup=2.0)
    started = start_run(_cfg(tmp_path, tiny_model_dir))
    assert started.config.model.dtype == "bfloat16" and started.config.train.recompute_behavior_logprobs is True
    machine(speedup=1 / 46)  # resumed on a CPU whose probe runs bf16 46x slower
    resumed = start_run(_cfg(tmp_path, tiny_model_dir))
    assert resumed.config.model.dtype == "bfloat16"
    assert resumed.warning is not None and "46x slower than fp32 here" in resumed.warning
