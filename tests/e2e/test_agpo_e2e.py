"""A tiny AGPO run end to end (arXiv 2605.20722): two stages of real jobs in-process on the tiny policy with the real
SmolLM2 tokenizer: probe + adaptive-temperature generation, AGPO training with the reference KL, and the controller
states handed from stage 0 to stage 1 through the committed manifests."""

from __future__ import annotations

import math

import pytest
from _tiny import AGPO_LOSS, generate_spec, train_spec, with_policy

from mugrpo.algorithms import excluding_columns
from mugrpo.algorithms.agpo import AGPOConfig
from mugrpo.commits.tables import read_table
from mugrpo.generation import run_generate
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.tracking.events import rollout_sample
from mugrpo.trainer.loop import run_training
from mugrpo.trainer.records import read_steps
from mugrpo.trainer.spec import TrainSpec

AGPO = AGPOConfig()


def _train_spec(root, stage: int) -> TrainSpec:
    return train_spec(
        root,
        "gen",
        stage=stage,
        seed=3,
        policy_version=2 * stage,
        total_updates=4,
        train={
            "updates_per_stage": 2,
            "rollouts_per_update": 6,
            "micro_batch_size": 3,
            "skip_zero_variance_groups": False,
        },
        loss=AGPO_LOSS,
        agpo=AGPO,
    )


@pytest.mark.slow
def test_tiny_agpo_run_two_stages(tmp_path, tiny_model_dir):
    root = tmp_path
    with_policy(root, tiny_model_dir, "gen")
    store, layout = Store(str(root)), RunLayout("gen")
    gen_manifests, train_manifests = [], []
    for stage in (0, 1):
        gen = generate_spec(
            root,
            "gen",
            stage=stage,
            num_prompts=4,
            prompt_start=4 * stage,
            policy_version=2 * stage,
            policy_dir=layout.policy_dir(stage),
            agpo=AGPO,
            advantage={"estimator": "agpo"},
        )
        gen_manifests.append(run_generate(gen))
        train_manifests.append(run_training(_train_spec(root, stage)))

    for stage, (g, t) in enumerate(zip(gen_manifests, train_manifests, strict=True)):
        assert g.counts["rows"] == 12 and g.counts["excluded_rows"] == 12 and g.counts["excluded_tokens"] > 0
        assert g.counts["tokens"] > g.counts["excluded_tokens"]
        assert t.counts["updates"] == 2 and t.counts["excluded_rows"] == 12 and t.counts["rows"] == 12
        steps, _ = read_steps(store, layout, stage)
        for row in steps.to_pylist():
            m = dict(row["loss_metrics"])
            assert AGPO.eps_min <= m["agpo_eps_min"] <= m["agpo_eps_max"] <= AGPO.eps_max
            assert math.isfinite(row["loss"]) and row["kl_ref"] is not None
    # stage 1 starts from stage 0's committed controller states
    first = dict(read_steps(store, layout, 1)[0].to_pylist()[0]["loss_metrics"])
    assert first["agpo_h_ref"] == train_manifests[0].metrics["agpo_h_ref"]
    assert first["agpo_kl_bar"] == train_manifests[0].metrics["agpo_kl_bar"]
    stage1 = read_table(store, layout.rollout_shard(1, 0), "rollouts").to_pylist()
    first_prompt = next(r for r in stage1 if not r["is_probe"])
    ema0 = gen_manifests[0].metrics["agpo_u_ema"]
    assert first_prompt["agpo_c"] == pytest.approx((first_prompt["agpo_u"] - ema0) / (ema0 + 1e-8))
    # the tracker's rollout sample shows training responses only (the declared excludes columns: probes left out)
    columns, sample = rollout_sample(store, layout, 0, 50, excluding_columns())
    stage0 = [
        r
        for name in sorted(store.listdir(layout.rollouts_dir(0)))
        if name.endswith(".parquet")
        for r in read_table(store, f"{layout.rollouts_dir(0)}/{name}", "rollouts").to_pylist()
    ]
    assert any(r["is_probe"] for r in stage0)
    assert len(sample) == min(50, sum(not r["is_probe"] for r in stage0))
