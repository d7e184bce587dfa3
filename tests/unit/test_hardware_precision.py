"""``auto`` precision: the hardware verdict (mugrpo.common.hardware) and its resolution into a config
(mugrpo.config.precision). The real probe runs on this machine; a CPU without bf16 units cannot exist here when
this one has them, so that case is made with ``MUGRPO_CPU_BF16_UNITS=0`` (the documented operator override)."""

from __future__ import annotations

import pytest

from mugrpo.common import hardware
from mugrpo.common.hardware import Bf16Verdict, auto_choice, bf16_verdict, cpu_bf16_units, matmul_gflops
from mugrpo.config import load_config
from mugrpo.config.precision import FOLLOW_MODEL_DTYPE, concrete, describe, resolve_precision

CONFIG = "configs/gsm8k-smollm2.yaml"


def _verdict(native: bool, fp32: float = 40.0, bf16: float = 1.0) -> Bf16Verdict:
    units = ("avx512_bf16",) if native else ()
    return Bf16Verdict("cpu", "AVX2", units, fp32, bf16, native, f"test verdict native={native}")


@pytest.fixture
def fresh_verdict(monkeypatch):
    """No pin, no cached verdict: each test probes (and the cache is cleared again after)."""
    monkeypatch.delenv(hardware.PIN_ENV, raising=False)
    bf16_verdict.cache_clear()
    yield
    bf16_verdict.cache_clear()


def test_probe_measures_both_dtypes_on_this_cpu():
    fp32, bf16 = matmul_gflops(__import__("torch").float32), matmul_gflops(__import__("torch").bfloat16)
    assert fp32 > 0.1 and bf16 > 0.01


def test_verdict_without_units_is_fp32_and_gives_the_measured_ratio(fresh_verdict, monkeypatch):
    monkeypatch.setenv(hardware.UNITS_ENV, "0")
    assert cpu_bf16_units() == ()
    verdict = bf16_verdict()
    assert not verdict.native and verdict.units == ()
    assert verdict.fp32_gflops > 0 and verdict.bf16_gflops > 0
    assert (
        "no bf16 units" in verdict.reason
        and "GFLOP/s" in verdict.reason
        and "MUGRPO_CPU_BF16_UNITS=0" in verdict.reason
    )
    assert auto_choice() == ("fp32", verdict.reason)
    data = verdict.to_json()
    assert data["slowdown"] == pytest.approx(data["fp32_gflops"] / data["bf16_gflops"])


def test_units_forced_off_name_the_probe_ratio_in_the_right_direction(fresh_verdict, monkeypatch):
    """MUGRPO_CPU_BF16_UNITS=0 on a machine whose bf16 is fast: fp32 is chosen, and the reason does not call a faster
    bf16 "slower"."""
    monkeypatch.setenv(hardware.UNITS_ENV, "0")
    speeds = {"torch.float32": 40.0, "torch.bfloat16": 80.0}
    monkeypatch.setattr(hardware, "matmul_gflops", lambda dtype, *a, **k: speeds[str(dtype)])
    verdict = bf16_verdict()
    assert not verdict.native and "slower" not in verdict.reason and "treated as having no bf16 units" in verdict.reason
    assert "bf16 at 2.0x fp32" in verdict.reason
    speeds["torch.bfloat16"] = 1.0  # an emulated bf16: the usual reading
    bf16_verdict.cache_clear()
    assert "bf16 is emulated, 40.0x slower" in bf16_verdict().reason


def test_units_alone_do_not_make_bf16_native_when_the_probe_disagrees(fresh_verdict, monkeypatch):
    monkeypatch.setenv(hardware.UNITS_ENV, "1")
    speeds = {"torch.float32": 50.0, "torch.bfloat16": 2.0}
    monkeypatch.setattr(hardware, "matmul_gflops", lambda dtype, *a, **k: speeds[str(dtype)])
    verdict = bf16_verdict()
    assert not verdict.native and "25.0x slower" in verdict.reason


def test_units_and_a_fast_probe_make_bf16_native(fresh_verdict, monkeypatch):
    monkeypatch.setenv(hardware.UNITS_ENV, "1")
    speeds = {"torch.float32": 50.0, "torch.bfloat16": 100.0}
    monkeypatch.setattr(hardware, "matmul_gflops", lambda dtype, *a, **k: speeds[str(dtype)])
    assert bf16_verdict().native and auto_choice()[0] == "bf16"


def test_the_pin_overrides_the_hardware(monkeypatch):
    monkeypatch.setenv(hardware.PIN_ENV, "bf16")
    assert auto_choice(_verdict(native=False)) == ("bf16", "MUGRPO_AUTO_PRECISION=bf16 pins auto precision")


def test_every_config_in_configs_uses_auto_precision():
    from pathlib import Path

    configs = sorted(Path("configs").glob("gsm8k-smollm2*.yaml"))
    assert len(configs) >= 8
    for path in configs:
        cfg = load_config(path)
        if path.name == "gsm8k-smollm2-fp32.yaml":  # the job pinned to fp32 on purpose
            assert (cfg.model.dtype, cfg.train.mixed_precision) == ("float32", "no")
            continue
        assert (cfg.model.dtype, cfg.train.mixed_precision, cfg.train.checkpoint_dtype) == ("auto",) * 3, path


@pytest.mark.parametrize(
    ("native", "expected"),
    [(True, ("bfloat16", "bf16", "bfloat16", True)), (False, ("float32", "no", "float32", False))],
)
def test_auto_resolves_all_keys_together_from_the_verdict(monkeypatch, native, expected):
    monkeypatch.delenv(hardware.PIN_ENV, raising=False)
    resolved = resolve_precision(load_config(CONFIG), verdict=_verdict(native))
    cfg = resolved.config
    got = (
        cfg.model.dtype,
        cfg.train.mixed_precision,
        cfg.train.checkpoint_dtype,
        cfg.train.recompute_behavior_logprobs,
    )
    assert got == expected
    assert resolved.record["source"] == {k: "auto" for k in resolved.record["source"]}
    assert resolved.record["hardware"]["native"] is native and resolved.warning is None
    assert describe(resolved.record).startswith(f"precision: model.dtype={expected[0]}")


def test_explicit_bf16_without_units_runs_with_one_loud_warning_giving_the_ratio(monkeypatch):
    monkeypatch.delenv(hardware.PIN_ENV, raising=False)
    cfg = load_config(CONFIG, ["model.dtype=bfloat16", "train.mixed_precision=bf16"])
    resolved = resolve_precision(cfg, verdict=_verdict(native=False, fp32=46.0, bf16=1.0))
    assert resolved.config.model.dtype == "bfloat16"
    assert resolved.config.train.checkpoint_dtype == "bfloat16"  # left at auto: follows model.dtype
    assert resolved.warning.startswith("WARNING") and "46x slower than fp32 here" in resolved.warning
    assert "train.checkpoint_dtype=bfloat16" in resolved.warning


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        ("float32", ("no", "float32", False)),
        ("bfloat16", ("bf16", "bfloat16", True)),
        ("float16", ("no", "float32", True)),  # fp16 autocast is refused; checkpoints hold fp32 or bf16
    ],
)
def test_an_explicit_model_dtype_decides_the_train_keys_left_at_auto_on_any_machine(
    monkeypatch, native, dtype, expected
):
    """The lab configs' trap: ``model.dtype: float32`` with ``train.checkpoint_dtype: auto`` rounded weights and moments
    to bf16 at every checkpoint on a machine with bf16 units only. A config that names its precision resolves the
    same on a bf16 machine and on one without bf16 units, and says why."""
    monkeypatch.delenv(hardware.PIN_ENV, raising=False)
    resolved = resolve_precision(load_config(CONFIG, [f"model.dtype={dtype}"]), verdict=_verdict(native))
    cfg = resolved.config
    got = (cfg.train.mixed_precision, cfg.train.checkpoint_dtype, cfg.train.recompute_behavior_logprobs)
    assert (cfg.model.dtype, *got) == (dtype, *expected)
    source = resolved.record["source"]
    assert source == {
        "model.dtype": "config",
        "train.mixed_precision": "model.dtype",
        "train.checkpoint_dtype": "model.dtype",
    }
    reason = resolved.record["reason"]
    assert f"train.mixed_precision, train.checkpoint_dtype follow model.dtype={dtype}" in reason
    assert "test verdict" not in reason  # the hardware was not asked
    assert set(FOLLOW_MODEL_DTYPE) == {"float32", "bfloat16", "float16"}  # every model.dtype the config accepts


@pytest.mark.parametrize("native", [True, False])
def test_the_lab_configs_resolve_to_fp32_on_any_machine(monkeypatch, native):
    """configs/lab/*.yaml pin model.dtype float32 and leave train.checkpoint_dtype at auto: fp32 checkpoints on both."""
    from pathlib import Path

    monkeypatch.delenv(hardware.PIN_ENV, raising=False)
    configs = sorted(Path("configs/lab").glob("*.yaml"))
    assert configs
    for path in configs:
        cfg = load_config(path)
        assert cfg.model.dtype == "float32" and cfg.train.checkpoint_dtype == "auto", path
        resolved = resolve_precision(cfg, verdict=_verdict(native)).config
        got = (resolved.model.dtype, resolved.train.mixed_precision, resolved.train.checkpoint_dtype)
        assert got == ("float32", "no", "float32"), path


def test_an_explicit_train_key_and_a_recorded_one_win_over_model_dtype(monkeypatch):
    monkeypatch.delenv(hardware.PIN_ENV, raising=False)
    cfg = load_config(CONFIG, ["model.dtype=float32", "train.checkpoint_dtype=bfloat16"])
    resolved = resolve_precision(cfg, verdict=_verdict(native=False))
    assert (resolved.config.train.mixed_precision, resolved.config.train.checkpoint_dtype) == ("no", "bfloat16")
    assert resolved.record["source"]["train.checkpoint_dtype"] == "config"
    # A run started before this rule, model.dtype float32 and checkpoint_dtype auto on a bf16 machine, recorded bf16
    # checkpoints: its resume keeps them (precision is fixed for a run's life).
    stored = load_config(CONFIG, ["model.dtype=float32", "train.mixed_precision=no", "train.checkpoint_dtype=bfloat16"])
    resumed = resolve_precision(load_config(CONFIG, ["model.dtype=float32"]), stored=stored, verdict=_verdict(False))
    assert resumed.config.train.checkpoint_dtype == "bfloat16"
    assert resumed.record["source"]["train.checkpoint_dtype"] == "recorded"
    # model.dtype kept from run.json decides the train keys the record lacks, not this machine.
    stored = load_config(CONFIG, ["model.dtype=bfloat16"])  # train keys still auto in this stored config
    resumed = resolve_precision(load_config(CONFIG), stored=stored, verdict=_verdict(native=False))
    assert (resumed.config.train.mixed_precision, resumed.config.train.checkpoint_dtype) == ("bf16", "bfloat16")
    assert resumed.record["source"]["train.mixed_precision"] == "model.dtype"


def test_a_resume_keeps_the_recorded_precision_whatever_this_machine_picks(monkeypatch):
    monkeypatch.delenv(hardware.PIN_ENV, raising=False)
    stored = resolve_precision(load_config(CONFIG), verdict=_verdict(native=True)).config  # started on bf16 units
    resumed = resolve_precision(load_config(CONFIG), stored=stored, verdict=_verdict(native=False))
    assert resumed.config.model.dtype == "bfloat16" and resumed.config.train.recompute_behavior_logprobs is True
    assert resumed.record["source"]["model.dtype"] == "recorded"
    assert "46" not in (resumed.warning or "x") and "40x slower" in resumed.warning  # emulated here: said, with ratio


def test_specs_built_outside_a_run_are_concrete():
    from mugrpo.trainer.spec import TrainSpec

    cfg = load_config(CONFIG)  # the suite pins auto to fp32 (tests/conftest.py)
    assert concrete(cfg).model.dtype == "float32" and concrete(concrete(cfg)) == concrete(cfg)
    spec = TrainSpec(root="r", run_id="p", stage=0, policy_version=0, train={"updates_per_stage": 2})
    train = spec.train  # a mapping that leaves the precision keys out: fp32, as GenerateSpec's dtype default
    assert (train.mixed_precision, train.checkpoint_dtype, train.recompute_behavior_logprobs) == (
        "no",
        "float32",
        False,
    )
    assert TrainSpec(root="r", run_id="p", stage=0, policy_version=0).train.checkpoint_dtype == "float32"
    assert TrainSpec.from_config(cfg, 0, 0).train.mixed_precision == "no"  # from_config resolves (concrete)


def test_job_specs_and_engines_refuse_auto_naming_the_field(tmp_path):
    """``auto`` exists in the config layer alone: a spec or an engine given it fails loudly, naming the field,
    instead of resolving it again on whatever machine the job lands on."""
    from mugrpo.common.dtypes import torch_dtype
    from mugrpo.engines.transformers_engine import TransformersEngine
    from mugrpo.engines.vllm_engine import VLLMEngine
    from mugrpo.evaluation.worker import EvalSpec
    from mugrpo.execution.warm import SegmentSpec
    from mugrpo.generation import GenerateSpec
    from mugrpo.trainer.spec import TrainSpec

    run = {"root": "r", "run_id": "p", "stage": 0}
    with pytest.raises(ValueError, match=r"dtype\n.*dtype='auto': a job spec takes a concrete precision"):
        GenerateSpec(**run, policy_dir="p", dataset={"name": "d", "path": "x.jsonl"}, num_prompts=1, dtype="auto")
    with pytest.raises(ValueError, match="dtype='auto'"):
        EvalSpec(**run, policy_dir="p", benchmarks=[], dtype="auto")
    for key in ("mixed_precision", "checkpoint_dtype", "recompute_behavior_logprobs"):
        with pytest.raises(ValueError, match=f"train.{key}='auto'"):
            TrainSpec(**run, policy_version=0, train={key: "auto"})
    cfg = load_config(CONFIG)  # every precision key at auto
    with pytest.raises(ValueError, match="train.mixed_precision='auto'.*resolve_precision"):
        TrainSpec(**run, policy_version=0, train=cfg.train)  # a config's section: resolve it first
    with pytest.raises(ValueError, match="config.model.dtype='auto'"):
        SegmentSpec(**run, config=cfg.to_json_dict(), num_stages=1)
    assert SegmentSpec.from_config(cfg, 0, 1).config["train"]["checkpoint_dtype"] == "float32"
    with pytest.raises(ValueError, match="dtype='auto'"):
        torch_dtype("auto")
    with pytest.raises(ValueError, match="must name a torch dtype"):
        torch_dtype("float33")
    with pytest.raises(ValueError, match="dtype='auto'"):
        TransformersEngine.from_dir(tmp_path, dtype="auto")
    with pytest.raises(ValueError, match="dtype='auto'"):
        VLLMEngine(tmp_path, dtype="auto")  # refused before vLLM is imported or started
