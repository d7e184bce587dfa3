"""reasoning-gym as a data source and a verifier (mugrpo.data.gym, the ``reasoning_gym`` reward component): any task by
name and params, deterministic problems, a held-out split disjoint on question text, the task's own score_answer in
the verifier pool with the strict format policy, task columns in the rollout rows, and the missing-package error."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from mugrpo.config import ConfigError, config_from_dict, load_config
from mugrpo.data.datasets import DatasetConfig, DatasetError, check_heldout_disjoint, load_problems
from mugrpo.data.gym import split_of
from mugrpo.rewards import REWARD_FUNCTIONS, RewardConfig, RewardInput, RewardScorer

ARITH = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+", "-"]}
ARITH.update(allow_parentheses=False, allow_negation=False)


def gym(task: str = "basic_arithmetic", **over) -> DatasetConfig:
    fields = {"source": "reasoning_gym", "task": task, "size": 40, "seed": 0}
    if task == "basic_arithmetic":
        fields["params"] = ARITH
    fields.update(over)
    return DatasetConfig(**fields)


@pytest.mark.parametrize(
    ("task", "params"),
    [
        ("basic_arithmetic", ARITH),
        ("chain_sum", {"min_terms": 2, "max_terms": 3}),
        ("leg_counting", {}),
        ("gsm_symbolic", {}),
        ("letter_counting", {}),
    ],
)
def test_any_task_by_name_and_params_is_deterministic_and_its_gold_scores_one(task, params):
    cfg = gym(task, params=params, size=12)
    problems, report = load_problems(cfg)
    again, _ = load_problems(cfg)
    other, _ = load_problems(cfg.model_copy(update={"seed": 1}))
    assert len(problems) == 12 and report.loaded == 12 and cfg.name == task
    assert [(p.prompt_id, p.question, p.ground_truth) for p in problems] == [
        (p.prompt_id, p.question, p.ground_truth) for p in again
    ]
    assert [p.question for p in other] != [p.question for p in problems]
    assert all(p.task == task and json.loads(p.task_metadata)["source_dataset"] == task for p in problems)
    score = REWARD_FUNCTIONS["reasoning_gym"]
    for p in problems[:4]:  # the task's own verifier accepts its gold, boxed
        assert score(RewardInput.for_problem(p, f"so \\boxed{{{p.ground_truth}}}"), None) == 1.0


def test_heldout_split_is_disjoint_from_training_on_question_text():
    train, _ = load_problems(gym(size=2000))
    heldout, _ = load_problems(gym(size=150, split="heldout"))
    assert not {p.question for p in train} & {p.question for p in heldout}
    assert all(split_of(p.question, 0.1) == "heldout" for p in heldout)
    assert check_heldout_disjoint(gym(size=2000), [gym(size=150, split="heldout")]) == {"basic_arithmetic": 150}
    # a "benchmark" drawn from the training split of another seed shares questions, and the check says so
    with pytest.raises(ValueError, match="shares .* question"):
        check_heldout_disjoint(gym(size=2000), [gym(size=300, seed=7)])


def test_a_task_space_too_small_for_the_size_is_a_clear_error():
    tiny = {**ARITH, "max_digits": 1}  # 0..10 op 0..10: ~242 questions, ~24 of them held out
    with pytest.raises(DatasetError, match="distinct heldout problems"):
        load_problems(gym(params=tiny, size=100, split="heldout"))


def test_bad_task_or_params_fail_at_config_load_naming_them():
    with pytest.raises(ValueError, match="no task 'basic_arithmetc'.*basic_arithmetic"):
        gym("basic_arithmetc")
    with pytest.raises(ValueError, match="refuses params"):
        gym(params={**ARITH, "min_terms": 0})
    with pytest.raises(ValueError, match="task and size"):
        DatasetConfig(source="reasoning_gym", task="leg_counting")
    with pytest.raises(ValueError, match="belong to source reasoning_gym"):
        DatasetConfig(name="x", path="x.jsonl", task="leg_counting")


def test_reasoning_gym_reward_needs_reasoning_gym_training_data():
    with pytest.raises(ConfigError, match="reasoning_gym.*read from a file"):
        load_config(None, ["reward.components={reasoning_gym: 1.0}"])
    with pytest.raises(ConfigError, match="'reasoning_gym_exact'.*read from a file"):
        load_config(None, ["reward.components={reasoning_gym_exact: 1.0}"])
    cfg = config_from_dict(
        {"data": {"train": gym().model_dump()}, "reward": {"components": {"reasoning_gym": 1.0, "format": 0.1}}}
    )
    assert cfg.data.train.task == "basic_arithmetic"


def test_strict_format_and_the_tasks_own_score_through_the_verifier_pool():
    p = next(p for p in load_problems(gym())[0] if not p.ground_truth.startswith("-") and len(p.ground_truth) >= 2)
    gold = p.ground_truth
    cases = [
        (f"{p.question[10:-1]} = \\boxed{{{gold}}}", 1.0),
        (f"\\boxed{{ {gold} }}", 1.0),
        (f"The answer is {gold}.", 0.0),  # no box, no answer
        (f"#### {gold}", 0.0),  # math_correctness reads ####; the reasoning_gym component needs the box
        (f"\\boxed{{{gold}", 0.0),  # a box never closed
        (f"\\boxed{{1{gold}}}", len(gold) / (len(gold) + 1)),  # basic_arithmetic's partial credit: gold inside
        ("\\boxed{x}", 0.0),
    ]
    cases += [(f"\\boxed{{-{gold}}}", len(gold) / (len(gold) + 1))]  # a sign flip: partial credit too
    config = RewardConfig(components={"reasoning_gym": 1.0, "reasoning_gym_exact": 1.0, "format": 0.1}, num_workers=1)
    with RewardScorer(config) as scorer:
        results = scorer.score([RewardInput.for_problem(p, text) for text, _ in cases])
    for (text, expected), r in zip(cases, results, strict=True):
        assert r.status == "ok", text
        assert r.components["reasoning_gym"] == pytest.approx(expected), text
        # the exact component keeps only the task's full score: no credit for an answer that contains the gold
        assert r.components["reasoning_gym_exact"] == (1.0 if expected == 1.0 else 0.0), text
    # a problem read from a file has no task entry: the component gives it nothing
    assert REWARD_FUNCTIONS["reasoning_gym"](RewardInput(f"\\boxed{{{gold}}}", gold), gold) == 0.0


def test_a_changed_generator_is_an_error_status_not_a_silent_score():
    p = load_problems(gym())[0][0]
    with RewardScorer(RewardConfig(components={"reasoning_gym": 1.0}, num_workers=1)) as scorer:
        (r,) = scorer.score([RewardInput(f"\\boxed{{{p.ground_truth}}}", p.ground_truth + "1", p.task_ref)])
    assert r.status.startswith("error: ValueError") and "generator changed" in r.status and r.reward == 0.0


def test_without_the_package_a_config_that_names_it_fails_at_load_with_the_pip_command(tmp_path):
    config = tmp_path / "gym.yaml"
    config.write_text(
        textwrap.dedent(
            """
            data:
              train: {source: reasoning_gym, task: leg_counting, size: 10}
            """
        )
    )
    # sys.modules[name] = None is Python's own way to make an import fail as if the package were not installed
    code = (
        "import sys; sys.modules['reasoning_gym'] = None; from mugrpo.cli import main; "
        "sys.argv[1:] = ['config', 'show', sys.argv[1]]; main()"
    )
    out = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "needs the package reasoning-gym" in out.stderr and "pip install -e '.[gym]'" in out.stderr
