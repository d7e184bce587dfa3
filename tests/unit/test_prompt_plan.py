"""Prompt plans: a stage's prompts are recorded once and followed by every resume, whatever the training
file's order now; a new plan that would schedule a prompt twice in one epoch, or that is drawn from a training set
that changed since the run started, is refused; rollouts outside the plan are refused at the generation commit.

Real GSM8K rows, real Store files, the real selection (select_problems) and, for the job, the real generation job
on the tiny policy.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mugrpo.commits.manifest import read_job_manifest
from mugrpo.commits.tables import read_table
from mugrpo.data.datasets import DatasetConfig, load_problems
from mugrpo.generation import GenerateSpec, run_generate, select_problems
from mugrpo.provenance.fingerprint import TRAIN_ROLE, dataset_fingerprint, problems_digest
from mugrpo.provenance.prompt_plan import (
    PlanError,
    PromptPlan,
    check_rollouts_follow_plan,
    epoch_overlaps,
    read_plan,
    stage_prompts,
)
from mugrpo.rewards import RewardConfig
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
RUN = "plan"

pytestmark = pytest.mark.usefixtures("shared_data_dir")


@pytest.fixture
def train(tmp_path: Path) -> Path:
    """The first 40 GSM8K training rows, in a file the test may reorder."""
    path = tmp_path / "train.jsonl"
    with (DATA / "gsm8k/train.jsonl").open() as f:
        path.write_text("".join(next(f) for _ in range(40)))
    return path


def spec(root: Path, train: Path, stage: int, **over) -> GenerateSpec:
    fields = dict(
        root=str(root),
        run_id=RUN,
        stage=stage,
        seed=5,
        policy_dir=RunLayout(RUN).policy_dir(stage),
        dataset=DatasetConfig(name="gsm8k", path=str(train), answer_kind="gsm8k"),
        prompt_start=4 * stage,
        num_prompts=4,
        shard_size=2,
        sampling={"temperature": 1.0, "max_new_tokens": 6, "n": 2},
        reward=RewardConfig(components={"math_correctness": 1.0, "format": 0.5}, num_workers=1),
    )
    fields.update(over)
    return GenerateSpec(**fields)


def reverse(path: Path) -> None:
    """What `tac FILE > tmp && mv tmp FILE` does: the same rows in reverse order."""
    path.write_text("".join(reversed(path.read_text().splitlines(keepends=True))))


def ids(problems) -> list[str]:
    return [p.prompt_id for p in problems]


def test_a_stage_follows_its_plan_after_the_file_is_reordered(tmp_path, train):
    store = Store(str(tmp_path / "runs"))
    s1 = spec(tmp_path / "runs", train, 1)
    problems, _ = load_problems(s1.dataset)
    chosen = stage_prompts(store, s1, problems)
    assert ids(chosen) == ids(select_problems(problems, 5, 4, 4))
    plan = read_plan(store, RUN, 1)
    assert plan.prompt_ids == ids(chosen) and plan.prompt_start == 4 and plan.dataset_size == 40
    assert plan.seed == 5 and plan.code_version and plan.epochs() == [0, 0, 0, 0]

    reverse(train)
    reordered, _ = load_problems(s1.dataset)
    assert ids(select_problems(reordered, 5, 4, 4)) != ids(chosen)  # by position, the stage would change
    again = stage_prompts(store, s1, reordered)
    same = [(p.prompt_id, p.question, p.ground_truth) for p in again]
    assert same == [(p.prompt_id, p.question, p.ground_truth) for p in chosen]  # by plan: same prompts and order

    short = [p for p in reordered if p.prompt_id != chosen[2].prompt_id]
    with pytest.raises(PlanError, match=rf"stage 1: 1 of its planned prompts .*{chosen[2].prompt_id}"):
        stage_prompts(store, s1, short)


def test_a_new_plan_may_not_repeat_a_prompt_of_the_same_epoch(tmp_path, train):
    store = Store(str(tmp_path / "runs"))
    problems, _ = load_problems(DatasetConfig(name="gsm8k", path=str(train), answer_kind="gsm8k"))
    # Stage 0 was planned on another order of the file: it holds two of the prompts stage 1 now draws.
    stage1 = ids(select_problems(problems, 5, 4, 4))
    stage0 = PromptPlan(
        run_id=RUN,
        stage=0,
        seed=5,
        prompt_start=0,
        dataset_size=40,
        dataset_sha256=problems_digest(problems),  # the same training set (its digest), another plan
        prompt_ids=[stage1[1], "x1", stage1[3], "x2"],
    )
    store.write_bytes(RunLayout(RUN).prompt_plan(0), stage0.model_dump_json().encode())
    with pytest.raises(PlanError) as e:
        stage_prompts(store, spec(tmp_path / "runs", train, 1), problems)
    assert f"prompt {stage1[1]} is scheduled in stage 0 and stage 1 of epoch 0" in str(e.value)
    assert read_plan(store, RUN, 1) is None  # nothing written


def test_a_later_epoch_may_schedule_a_prompt_again(tmp_path, train):
    """6 problems, 4 per stage: stage 1 covers positions 4..7, i.e. the last two of epoch 0 and the first two of
    epoch 1, which stage 0 also sampled (in epoch 0): allowed."""
    store = Store(str(tmp_path / "runs"))
    ds = DatasetConfig(name="gsm8k", path=str(train), answer_kind="gsm8k", limit=6)
    problems, _ = load_problems(ds)
    first = stage_prompts(store, spec(tmp_path / "runs", train, 0, dataset=ds), problems)
    second = stage_prompts(store, spec(tmp_path / "runs", train, 1, dataset=ds), problems)
    assert ids(second)[2:] == ids(first)[:2]
    assert read_plan(store, RUN, 1).epochs() == [0, 0, 1, 1]
    assert epoch_overlaps([read_plan(store, RUN, 0), read_plan(store, RUN, 1)]) == []


def test_a_new_plan_is_refused_when_the_training_set_changed_since_the_run_started(tmp_path, train):
    store = Store(str(tmp_path / "runs"))
    s0, s1 = spec(tmp_path / "runs", train, 0), spec(tmp_path / "runs", train, 1)
    recorded = dataset_fingerprint(s0.dataset, TRAIN_ROLE)
    store.write_json(RunLayout(RUN).run_json, {"inputs": {TRAIN_ROLE: recorded.model_dump(mode="json")}})
    problems, _ = load_problems(s0.dataset)
    stage_prompts(store, s0, problems)
    reverse(train)
    reordered, _ = load_problems(s1.dataset)
    assert ids(stage_prompts(store, s0, reordered)) == read_plan(store, RUN, 0).prompt_ids
    with pytest.raises(PlanError) as e:  # stage 1 has no plan yet: it would be drawn from the changed file
        stage_prompts(store, s1, reordered)
    assert f"data.train: {train}" in str(e.value) and f"recorded sha256 {recorded.sha256}" in str(e.value)


def test_rollouts_outside_the_plan_are_refused(tmp_path, train):
    store = Store(str(tmp_path / "runs"))
    s0 = spec(tmp_path / "runs", train, 0)
    problems, _ = load_problems(s0.dataset)
    planned = ids(stage_prompts(store, s0, problems))
    check_rollouts_follow_plan(store, RUN, 0, planned[:3])  # a skipped (bad) prompt has no rollouts: fine
    with pytest.raises(PlanError, match="rollouts of 1 prompts outside its plan"):
        check_rollouts_follow_plan(store, RUN, 0, [*planned, "0123456789abcdef"])
    check_rollouts_follow_plan(store, RUN, 1, ["anything"])  # no plan (an older version's stage): not checked


@pytest.mark.slow
def test_the_generation_job_writes_and_follows_the_plan(tmp_path, train, tiny_model_dir):
    """The real job: its rollouts are the plan's prompts; re-sampling the stage after the file was reversed (its
    shards and manifests deleted) gives the same prompts and bitwise the same rollouts."""
    root = tmp_path / "runs"
    store = Store(str(root))
    store.upload_dir(tiny_model_dir, RunLayout(RUN).policy_dir(1))
    s1 = spec(root, train, 1, engine_kwargs={"num_threads": 1})
    run_generate(s1)
    plan = read_plan(store, RUN, 1)
    manifest = read_job_manifest(store, RUN, 1, "generate")
    rows = [read_table(store, RunLayout(RUN).abs(f.path), "rollouts") for f in manifest.files]
    first = sorted((r["prompt_id"], r["sample_idx"], r["response_text"]) for t in rows for r in t.to_pylist())
    assert {pid for pid, _, _ in first} == set(plan.prompt_ids) and len(first) == 4 * 2

    reverse(train)
    shutil.rmtree(root / RUN / "rollouts")
    for f in (root / RUN / "jobs" / "stage=1").glob("*.manifest.json"):
        f.unlink()
    path = tmp_path / "spec.json"
    path.write_text(s1.model_dump_json())
    out = subprocess.run([sys.executable, "-m", "mugrpo.jobs.generate", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    manifest = read_job_manifest(store, RUN, 1, "generate")
    rows = [read_table(store, RunLayout(RUN).abs(f.path), "rollouts") for f in manifest.files]
    again = sorted((r["prompt_id"], r["sample_idx"], r["response_text"]) for t in rows for r in t.to_pylist())
    assert again == first
    assert json.loads((root / RUN / "jobs/stage=1/generate.plan.json").read_text())["prompt_ids"] == plan.prompt_ids


def test_an_edit_that_keeps_size_and_mtime_is_refused_at_the_next_plan(tmp_path, train):
    """A same-size edit with its mtime set back is refused by the next stage's plan (the file is
    re-read in full against run.json's sha256), naming the training set and both sha256. Nothing is written."""
    import os

    store = Store(str(tmp_path / "runs"))
    s0, s1 = spec(tmp_path / "runs", train, 0), spec(tmp_path / "runs", train, 1)
    store.write_json(
        RunLayout(RUN).run_json, {"inputs": {TRAIN_ROLE: dataset_fingerprint(s0.dataset, TRAIN_ROLE).model_dump()}}
    )
    problems, _ = load_problems(s0.dataset)
    stage_prompts(store, s0, problems)
    stat = os.stat(train)
    text = train.read_text()
    edited = text.replace("Natalia", "Nataliz", 1)  # one letter, same size
    assert len(edited) == len(text) and edited != text
    train.write_text(edited)
    os.utime(train, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime set back
    assert dataset_fingerprint(s1.dataset, TRAIN_ROLE, dataset_fingerprint(s0.dataset, TRAIN_ROLE)).sha256
    changed, _ = load_problems(s1.dataset)
    with pytest.raises(PlanError, match="1 input changed since the run started") as e:
        stage_prompts(store, s1, changed)
    assert str(train) in str(e.value)
    assert read_plan(store, RUN, 1) is None
    # a run.json without the record (an older run): the earlier plans' problem digest still refuses it
    store.write_json(RunLayout(RUN).run_json, {})
    with pytest.raises(PlanError, match="is not the one stage 0 was planned on") as e:
        stage_prompts(store, s1, changed)
    assert problems_digest(problems) in str(e.value) and problems_digest(changed) in str(e.value)
    assert read_plan(store, RUN, 1) is None


def test_the_first_plan_checks_the_problems_it_read_against_the_record_at_the_start(tmp_path, train):
    """Run.json exists, no plan yet, two lines of the training file swapped (same size) and its mtime set
    back. Stage 0's plan, the first, is refused: the bytes and the problems it read are not those recorded."""
    import os

    from mugrpo.provenance.fingerprint import training_problems_digest

    store = Store(str(tmp_path / "runs"))
    s0 = spec(tmp_path / "runs", train, 0)
    fp = dataset_fingerprint(s0.dataset, TRAIN_ROLE)
    fp.problems_sha256 = training_problems_digest(s0.dataset)
    store.write_json(RunLayout(RUN).run_json, {"inputs": {TRAIN_ROLE: fp.model_dump()}})
    stat = os.stat(train)
    lines = train.read_bytes().splitlines(keepends=True)
    lines[0], lines[1] = lines[1], lines[0]
    train.write_bytes(b"".join(lines))
    os.utime(train, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    swapped, _ = load_problems(s0.dataset)
    with pytest.raises(PlanError) as e:
        stage_prompts(store, s0, swapped)
    assert str(train) in str(e.value) and fp.sha256 in str(e.value)
    assert fp.problems_sha256 in str(e.value) and problems_digest(swapped) in str(e.value)
    assert read_plan(store, RUN, 0) is None


def test_a_stage_of_more_prompts_than_the_training_set_holds_is_refused(tmp_path, train):
    store = Store(str(tmp_path / "runs"))
    ds = DatasetConfig(name="gsm8k", path=str(train), answer_kind="gsm8k", limit=3)
    problems, _ = load_problems(ds)
    with pytest.raises(PlanError, match="asks for 4 prompts but the training set .* holds 3"):
        stage_prompts(store, spec(tmp_path / "runs", train, 0, dataset=ds), problems)
    assert read_plan(store, RUN, 0) is None
