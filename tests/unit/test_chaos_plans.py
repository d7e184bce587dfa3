"""The chaos harness's plan invariants, on hand-made run folders: every stage has a prompt plan, no
prompt id is scheduled in two stages of one epoch, each stage's rollouts are of exactly its planned prompts, and
the plans equal the uninterrupted run's. The harness's data-edit moment runs in tests/test_chaos.py's quick mode."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.torch import save_file

from bench.support.chaos import check_run
from bench.support.chaos.invariants import plan_problems
from mugrpo.provenance.prompt_plan import PromptPlan


def plan(stage: int, ids: list[str], start: int, size: int = 4) -> str:
    return PromptPlan(
        run_id="chaos", stage=stage, seed=0, prompt_start=start, dataset_size=size, dataset_sha256="0" * 64,
        prompt_ids=ids,
    ).model_dump_json()  # fmt: skip


def two_stage_run(root: Path, plans: dict[int, list[str]], sampled: dict[int, list[str]]) -> Path:
    run = root / "chaos"
    for k in (0, 1):
        (run / f"rollouts/stage={k}").mkdir(parents=True)
        (run / f"jobs/stage={k}").mkdir(parents=True)
        pids = sampled[k]
        pq.write_table(
            pa.table({"prompt_id": pids, "sample_idx": [0] * len(pids), "policy_version": [2 * k] * len(pids)}),
            run / f"rollouts/stage={k}/shard=00000.parquet",
        )
        if k in plans:
            (run / f"jobs/stage={k}/generate.plan.json").write_text(plan(k, plans[k], 2 * k))
    (run / "stages").mkdir()
    for k in (0, 1):
        (run / f"stages/stage={k}.json").write_text("{}")
    (run / "train_steps/stage=0").mkdir(parents=True)
    pq.write_table(pa.table({"update": [1], "staleness": [0]}), run / "train_steps/stage=0/part-00001.parquet")
    (run / "policies/stage=2").mkdir(parents=True)
    save_file({"w": torch.arange(4.0)}, str(run / "policies/stage=2/model.safetensors"))
    return run


def test_plans_that_hold_pass(tmp_path):
    good = {0: ["a", "b"], 1: ["c", "d"]}
    run = two_stage_run(tmp_path / "run", good, good)
    assert plan_problems(run, 2) == []
    ref = tmp_path / "ref" / "chaos"
    shutil.copytree(run, ref)
    assert check_run(run, ref, 2).ok


def test_a_prompt_scheduled_in_two_stages_of_an_epoch_is_named(tmp_path):
    # Positions 0-1 and 2-3 of a 4-prompt set: one epoch. Stage 1 sampled "a" again, as a run whose training file
    # was reordered between its stages would.
    run = two_stage_run(tmp_path / "run", {0: ["a", "b"], 1: ["c", "a"]}, {0: ["a", "b"], 1: ["c", "a"]})
    assert plan_problems(run, 2) == ["prompt a is scheduled in stage 0 and stage 1 of epoch 0"]


def test_rollouts_must_be_of_exactly_the_planned_prompts_and_every_stage_needs_a_plan(tmp_path):
    run = two_stage_run(tmp_path / "run", {0: ["a", "b"]}, {0: ["a", "z"], 1: ["c", "d"]})
    assert plan_problems(run, 2) == [
        "stage 1 has no prompt plan",
        "stage 0: rollouts of prompts outside its plan, e.g. ['z']",
        "stage 0: planned prompts without rollouts, e.g. ['b']",
    ]


def test_plans_that_differ_from_the_uninterrupted_run_are_named(tmp_path):
    ref = two_stage_run(tmp_path / "ref", {0: ["a", "b"], 1: ["c", "d"]}, {0: ["a", "b"], 1: ["c", "d"]})
    run = two_stage_run(tmp_path / "run", {0: ["a", "b"], 1: ["d", "c"]}, {0: ["a", "b"], 1: ["c", "d"]})
    problems = check_run(run, ref, 2).problems
    assert "prompt plans of stages [1] differ from the uninterrupted run's" in problems
