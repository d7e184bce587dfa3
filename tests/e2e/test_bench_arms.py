"""The side-by-side benches (bench/speedup.py, vs_trl.py, ablation.py, gpu/run.py): equal budgets across arms,
the Amdahl bound, and each bench's --quick / --tiny mode end to end (slow: real job processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _bench import run_bench
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)

from bench._arms import ARMS, GRPO_MU, Budget, amdahl_bound, arm_config
from mugrpo.schedules.stages import stage_plan, total_updates

REPO = Path(__file__).resolve().parents[2]


def _shape(cfg) -> dict:
    plans = [stage_plan(cfg, k) for k in range(cfg.run.num_stages)]
    return {
        "updates": total_updates(cfg),
        "rollouts": sum(p.num_prompts for p in plans) * cfg.generation.sampling.n,
        "rollouts_per_update": cfg.train.rollouts_per_update,
        "prompts": (plans[0].prompt_start, plans[-1].prompt_start + plans[-1].num_prompts),
        "G": cfg.generation.sampling.n,
        "tokens": cfg.generation.sampling.max_new_tokens,
        "seed": cfg.run.seed,
        "model": cfg.model.source,
        "lr": cfg.train.lr,
    }


def test_arms_share_the_budget_and_differ_in_staleness_and_execution(tmp_path):
    b = Budget()
    cfgs = {arm: arm_config(arm, tmp_path / arm, arm, b) for arm in ARMS}
    shapes = {arm: _shape(cfg) for arm, cfg in cfgs.items()}
    lrs = {arm: shape.pop("lr") for arm, shape in shapes.items()}
    assert all(shape == shapes["mu"] for shape in shapes.values())
    assert lrs.pop("mu-lora") == 10 * lrs["mu"]  # LoRA at 10x full fine-tuning's rate ("LoRA Without Regret")
    assert len(set(lrs.values())) == 1
    assert shapes["mu"]["updates"] == b.updates == 32
    assert cfgs["mu"].run.num_stages == 4 and cfgs["mu"].train.updates_per_stage == b.updates // 4
    assert cfgs["grpo-warm"].train.updates_per_stage == GRPO_MU == cfgs["grpo-cold"].train.updates_per_stage
    assert cfgs["mu"].loss.name == "mu_grpo" and cfgs["grpo-warm"].loss.name == "grpo"
    assert [a for a in ARMS if cfgs[a].orchestration.execution == "warm"] == ["grpo-warm", "mu-warm", "grpo-warm-bf16"]
    # mu-seq is Mu-GRPO's cold run with its jobs one after another: the checkpoint overlap's share
    assert [a for a in ARMS if not cfgs[a].orchestration.overlap_checkpoint] == ["mu-seq"]
    assert [a for a in ARMS if not cfgs[a].orchestration.prestart_jobs] == ["mu-spawn"]
    # each mu-* arm is Mu-GRPO's cold run with one change
    core = {"run", "orchestration"}
    for arm, change in (("mu-seq", set()), ("mu-spawn", set()), ("mu-bf16", {"train"}), ("mu-lora", {"train"})):
        assert cfgs[arm].model_dump(exclude=core | change) == cfgs["mu"].model_dump(exclude=core | change), arm
    assert cfgs["mu-bf16"].train.checkpoint_dtype == cfgs["grpo-warm-bf16"].train.checkpoint_dtype == "bfloat16"
    assert cfgs["mu-lora"].train.lora.rank == 16 and cfgs["mu"].train.lora is None
    # mu-warm is Mu-GRPO's run exactly, only executed in one warm segment job
    assert cfgs["mu-warm"].loss == cfgs["mu"].loss and cfgs["mu-warm"].run.num_stages == cfgs["mu"].run.num_stages
    with pytest.raises(ValueError, match="unknown arm"):
        arm_config("grpo", tmp_path / "x", "x", b)


def test_budget_rejects_updates_the_arms_cannot_share():
    with pytest.raises(ValueError, match="multiple"):
        Budget(updates=18).check()
    with pytest.raises(ValueError, match="whole groups"):
        Budget(rollouts_per_update=6, group_size=4).check()


def test_amdahl_bound():
    assert amdahl_bound(0.0, 2.0) == pytest.approx(2.0)  # no training: the whole rollout ratio
    assert amdahl_bound(1.0, 10.0) == pytest.approx(1.0)  # all training: nothing to gain
    assert amdahl_bound(0.5, 1.82) == pytest.approx(1 / (0.5 + 0.5 / 1.82))
    with pytest.raises(ValueError):
        amdahl_bound(1.5, 2.0)


def _bench(args: list[str], tmp_path: Path, timeout: int = 2400) -> subprocess.CompletedProcess:
    return run_bench(args, timeout=timeout, env={"PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)})


@pytest.mark.slow
def test_speedup_quick_runs_all_arms_to_equal_updates(tmp_path):
    _bench(["bench/speedup.py", "--quick", "--out", str(tmp_path / "out")], tmp_path)
    res = json.loads((tmp_path / "out" / "speedup.json").read_text())
    assert set(res["results"]) == set(ARMS)
    assert {arm: runs[0]["updates"] for arm, runs in res["results"].items()} == dict.fromkeys(res["results"], 4)
    assert {arm: runs[0]["stages"] for arm, runs in res["results"].items()} == {
        arm: 1 if arm.startswith("grpo") else 2 for arm in ARMS
    }
    # the bytes each stage left: bf16 checkpoints and LoRA adapters write less than the full fp32 state
    disk = res["disk_gb_per_stage"]
    assert disk["mu-lora"] < disk["mu-bf16"] < disk["mu"] and disk["grpo-warm-bf16"] < disk["grpo-warm"]
    assert set(res["switch_per_stage_s"]) == set(ARMS)
    # the overlapped cold arm hid part of a checkpoint behind the next stage's generation, counted once; mu-seq none
    assert all(0.0 <= r["t_ckpt_hidden"] <= r["t_ckpt"] for runs in res["results"].values() for r in runs)
    assert res["results"]["mu-seq"][0]["t_ckpt_hidden"] == 0.0
    for runs in res["results"].values():
        r = runs[0]
        assert r["t_total"] >= r["t_roll"] + r["t_train"] > 0
    assert (tmp_path / "out" / "speedup_reward_vs_time.png").stat().st_size > 1000
    # each arm records the precision it ran in (the suite pins auto to fp32: tests/conftest.py)
    precision = {arm: runs[0]["precision"] for arm, runs in res["results"].items()}
    assert all(p["model.dtype"] == "float32" and "MUGRPO_AUTO_PRECISION" in p["reason"] for p in precision.values())


@pytest.mark.slow
def test_real_lm_quick_pairs_mu_cold_with_grpo_warm_at_the_same_policy_versions(tmp_path, prefect_api):  # noqa: F811
    """bench/real_lm.py --quick: both arms through `mugrpo run` (a tiny random policy, half of each arm's stages),
    evaluated at the same policy versions, each with a paired gain over its base and the final paired difference
    between the arms. The runs use this worker's test Prefect server (PREFECT_API_URL) instead of starting one each."""
    out = tmp_path / "real_lm.json"
    _bench(["bench/real_lm.py", "--quick", "--seeds", "0", "--out", str(out)], tmp_path)
    res = json.loads(out.read_text())
    for arm in ("mu", "grpo-warm"):
        (run,) = res["reports"][arm]
        assert [p["updates"] for p in run["points"]] == [0, 8, 16], arm
        assert all(p["problems"] == 4 for p in run["points"]), arm
        assert run["points"][0]["gain"] == 0.0 and run["t"]["t_total"] > 0
        ready = [p["ready_s"] for p in run["points"]]
        assert ready == sorted(ready) and ready[0] == 0.0 < ready[-1]
        assert run["precision"]["model.dtype"] == "float32"
    final = res["summary"]["final_mu_minus_grpo_warm"]
    assert final["problems"] == 4 and final["ci95"][0] <= final["mean"] <= final["ci95"][1]
    assert res["env"]["auto_precision"]["choice"] == "fp32"  # the suite pins auto (tests/conftest.py)


@pytest.mark.slow
def test_vs_trl_quick(tmp_path):
    if not (REPO / ".venv-trl" / "bin" / "python").exists():
        pytest.skip("no .venv-trl: create it with `make trl-venv`")
    _bench(["bench/vs_trl.py", "--quick", "--out", str(tmp_path / "out")], tmp_path)
    res = json.loads((tmp_path / "out" / "vs_trl.json").read_text())
    assert set(res["s_per_update"]) == {"trl", "grpo-warm", "mu", "bare"}
    assert all(v > 0 for v in res["s_per_update"].values())
    assert res["results"]["trl"][0]["curve"], "TRL logged no reward"
    assert len(res["results"]["bare"][0]["curve"]) == 8


@pytest.mark.slow
def test_ablation_quick(tmp_path):
    _bench(["bench/ablation.py", "--quick", "--out", str(tmp_path / "out")], tmp_path)
    res = json.loads((tmp_path / "out" / "ablation.json").read_text())
    assert set(res["curves"]) == {"naive", "relaxed", "veto-trigger", "veto-suffix", "veto-non_trigger_suffix",
                                  "veto-sequence"}  # fmt: skip
    for curve in res["curves"].values():
        assert curve["update"] == [1, 2, 3, 4]
    assert (tmp_path / "out" / "ablation.png").stat().st_size > 1000


@pytest.mark.slow
def test_gpu_script_tiny_on_cpu(tmp_path):
    _bench(["bench/gpu/run.py", "--tiny", "--out", str(tmp_path / "out")], tmp_path)
    res = json.loads((tmp_path / "out" / "gpu_bench.json").read_text())
    assert res["bare_train"]["tokens_per_s"] > 0
    assert {a: r["updates"] for a, r in res["arms"].items()} == {"mu": 8, "grpo-warm": 8}
    report = (tmp_path / "out" / "gpu_bench.md").read_text()
    assert "GRPO-warm / Mu-GRPO" in report
    # the device's image has no vLLM: its figures must never read as vLLM figures
    assert "no figure here is a vLLM figure" in res["generation_engine"] and res["generation_engine"] in report
