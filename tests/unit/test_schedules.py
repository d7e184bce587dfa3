"""Stage schedules (mugrpo.schedules.stages): prompt ranges, policy versions and update counts of every stage, and the
job specs built from them."""

import pytest

from mugrpo.config import ConfigError, config_from_dict
from mugrpo.generation import GenerateSpec
from mugrpo.orchestration.runs import policy_version
from mugrpo.schedules.stages import STAGE_SCHEDULES, StagePlan, stage_plan, total_updates
from mugrpo.trainer.spec import TrainSpec


def _cfg(**run):
    return config_from_dict(
        {
            "run": {"num_stages": 3, **run},
            "generation": {"prompts_per_stage": 10},
            "train": {"updates_per_stage": 4, "rollouts_per_update": 8, "micro_batch_size": 4},
        }
    )


def test_constant_schedule_is_k_equal_stages():
    cfg = _cfg()
    assert [stage_plan(cfg, k) for k in range(4)] == [
        StagePlan(0, prompt_start=0, num_prompts=10, policy_version=0, updates=4),
        StagePlan(1, prompt_start=10, num_prompts=10, policy_version=4, updates=4),
        StagePlan(2, prompt_start=20, num_prompts=10, policy_version=8, updates=4),
        StagePlan(3, prompt_start=30, num_prompts=0, policy_version=12, updates=0),  # the final evaluation's policy
    ]
    assert total_updates(cfg) == 12 and {"constant", "per_stage"} <= set(STAGE_SCHEDULES)
    with pytest.raises(ValueError, match=r"stage 4 is outside \[0, 3\]"):
        stage_plan(cfg, 4)


def test_per_stage_schedule_places_each_stage_after_the_previous_ones():
    cfg = _cfg(stage_schedule={"name": "per_stage", "updates": [8, 2, 2], "prompts": [20, 5, 5]})
    plans = [stage_plan(cfg, k) for k in range(4)]
    assert [(p.prompt_start, p.num_prompts, p.policy_version, p.updates) for p in plans] == [
        (0, 20, 0, 8),
        (20, 5, 8, 2),
        (25, 5, 10, 2),
        (30, 0, 12, 0),
    ]
    # The job specs take their sizes from the schedule; the LR schedule spans the whole run.
    gen = GenerateSpec.from_config(cfg, 1, policy_version(cfg, 1))
    assert (gen.prompt_start, gen.num_prompts, gen.policy_version) == (20, 5, 8)
    train = TrainSpec.from_config(cfg, 1, policy_version(cfg, 1))
    assert (train.train.updates_per_stage, train.policy_version, train.total_updates) == (2, 8, 12)
    assert cfg.train.updates_per_stage == 4  # the run config itself is not changed
    # An empty list falls back to the constant value.
    only_updates = _cfg(stage_schedule={"name": "per_stage", "updates": [1, 2, 3]})
    assert [stage_plan(only_updates, k).num_prompts for k in range(3)] == [10, 10, 10]


def test_bad_schedules_fail_at_config_load_naming_the_field():
    with pytest.raises(ConfigError, match=r"run.stage_schedule.updates has 2 entries but run.num_stages is 3"):
        _cfg(stage_schedule={"name": "per_stage", "updates": [4, 4]})
    with pytest.raises(ConfigError, match=r"run.stage_schedule.prompts entries must be >= 1"):
        _cfg(stage_schedule={"name": "per_stage", "prompts": [4, 0, 4]})
    with pytest.raises(ConfigError, match=r"unknown stage schedule 'perstage' \(did you mean 'per_stage'\?\)"):
        _cfg(stage_schedule={"name": "perstage"})
