"""Branching a run at a stage (docs/branching.md): a fork references its parent's stages, reproduces them
bitwise when nothing changes, re-scores the parent's responses with ``--reuse-rollouts``, and refuses what it cannot
build on.

A 3-stage parent (tiny random policy with the real SmolLM2 tokenizer, real GSM8K rows, every stage evaluated) runs
as the stage flow runs cold jobs (real job subprocesses and files); forks of it at stage 1 then run the same way.
Slow (about 20 job processes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from _tiny import start_job, tiny_config
from safetensors.torch import load_file

from mugrpo.config import config_from_dict
from mugrpo.orchestration.fork import ForkRefused, plan_fork
from mugrpo.orchestration.job_specs import write_job_specs
from mugrpo.orchestration.runs import attach_run, commit_stage, create_fork, init_run, load_run_config
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import StageTimings

PARENT, STAGES, K = "parent", 3, 1

pytestmark = pytest.mark.slow


def _ok(proc: subprocess.Popen, log: Path) -> None:
    assert proc.wait(timeout=900) == 0, log.read_text()[-4000:]


def run_stages(cfg, log: Path, first: int = 0) -> None:
    """What the stage flow does in cold execution: the stage's jobs as processes, then the stage commit."""
    init_run(cfg)
    run = attach_run(cfg)
    store = Store(cfg.run.root)
    for k in range(first, cfg.run.num_stages):
        urls = write_job_specs(run, k)
        for job in ("generate", "train", "eval"):
            if job == "eval" and store.exists(cfg.layout.job_manifest(k, "eval")):
                continue  # inherited from the parent (the same policy, the same eval config)
            _ok(start_job(job, urls[job], log), log)
        commit_stage(run, k, StageTimings())


@pytest.fixture(scope="module")
def parent_root(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("fork-runs")
    cfg = config_from_dict(
        tiny_config(
            root,
            tiny_model_dir,
            run_id=PARENT,
            run={"seed": 3, "num_stages": STAGES},
            loss={"name": "grpo"},
            train={"updates_per_stage": 2, "checkpoint_every": 1},
            eval={"every_stage": True},
        )
    )
    run_stages(cfg, root / "parent.log")
    return root


def fork(root: Path, child: str, *overrides: str, **options):
    store = Store(str(root))
    plan = plan_fork(store, load_run_config(str(root), PARENT), K, child, list(overrides), **options)
    create_fork(store, plan)
    return load_run_config(str(root), child), plan


def _rows(root: Path, run: str, stage: int) -> list[dict]:
    table = pq.read_table(root / run / "rollouts" / f"stage={stage}")
    rows = table.drop_columns(["run_id", "created_at", "stage"]).to_pylist()
    return sorted(rows, key=lambda r: (r["prompt_id"], r["sample_idx"]))


def _steps(root: Path, run: str, stage: int) -> list[dict]:
    table = pq.read_table(root / run / "train_steps" / f"stage={stage}")
    timing = ("run_id", "created_at", "stage")  # and wall-clock columns (seconds, tokens per second)
    keep = [c for c in table.column_names if c not in timing and "second" not in c]
    return sorted(table.select(keep).to_pylist(), key=lambda r: r["update"])


def _final(root: Path, run: str) -> dict[str, torch.Tensor]:
    return load_file(str(root / run / "policies" / f"stage={STAGES}" / "model.safetensors"))


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fork_without_overrides_reproduces_the_parent_bitwise(parent_root, tmp_path):
    cfg, plan = fork(parent_root, "same")
    assert plan.eval_inherited  # nothing that decides the evaluation changed
    doc = json.loads((parent_root / "same" / "run.json").read_text())
    assert doc["lineage"]["parent_run_id"] == PARENT and doc["lineage"]["stage"] == K
    assert doc["lineage"]["changed_keys"] == []
    # stage 0 is referenced: its manifests are the parent's, verbatim; no data file is copied
    assert (parent_root / "same/stages/stage=0.json").read_bytes() == (
        parent_root / PARENT / "stages/stage=0.json"
    ).read_bytes()
    assert not (parent_root / "same/rollouts/stage=0").exists()
    assert not (parent_root / "same/policies").exists() and not (parent_root / "same/checkpoints").exists()
    run_stages(cfg, tmp_path / "same.log", first=K)
    for k in range(K, STAGES):
        assert _rows(parent_root, "same", k) == _rows(parent_root, PARENT, k), f"stage {k} rollouts differ"
        assert _steps(parent_root, "same", k) == _steps(parent_root, PARENT, k), f"stage {k} train_steps differ"
    assert _same_weights(_final(parent_root, "same"), _final(parent_root, PARENT))
    # the fork's stage-1 manifest lists the parent's evaluation of policy 1, referenced
    manifest = json.loads((parent_root / "same/stages/stage=1.json").read_text())
    assert any(f["path"].startswith(f"../{PARENT}/evals/stage=1/") for f in manifest["files"])
    from mugrpo.commits.verify import verify_run

    report = verify_run(Store(str(parent_root)), "same", STAGES, cfg.layout)
    assert report.ok and any(p.startswith(f"../{PARENT}/rollouts/stage=0/") for p in report.stages[0].intact)
    from mugrpo.orchestration.rescore import rescore_stage
    from mugrpo.sql.catalog import connect

    again = rescore_stage(Store(str(parent_root)), cfg, 0, "again")  # an inherited stage: the parent's shards, read
    assert again.counts["rows"] == 8 and again.counts["unchanged"] == 8
    assert all(r.path.startswith(f"../{PARENT}/rollouts/stage=0/") for r in again.manifest.source)
    with connect(str(parent_root / "same")) as cat:  # the stages view: the inherited stage is the fork's, marked
        rows = cat.arrow("SELECT stage, inherited_from FROM stages ORDER BY stage").to_pylist()
    assert rows == [{"stage": 0, "inherited_from": PARENT}] + [
        {"stage": k, "inherited_from": None} for k in range(K, STAGES)
    ]


def test_reuse_rollouts_gives_the_parent_advantages_and_weights_bitwise(parent_root, tmp_path):
    cfg, _ = fork(parent_root, "reuse", reuse_rollouts=True)
    run_stages(cfg, tmp_path / "reuse.log", first=K)
    parent_rows, rows = _rows(parent_root, PARENT, K), _rows(parent_root, "reuse", K)
    assert rows == parent_rows  # re-scored with the same reward config: the same rewards and advantages
    assert _same_weights(_final(parent_root, "reuse"), _final(parent_root, PARENT))


def test_reuse_with_another_reward_rescored_as_a_fresh_scoring(parent_root, tmp_path):
    """A changed reward with reuse: the parent's responses, the new reward of each, advantages recomputed."""
    from mugrpo.rewards import RewardConfig, RewardInput, RewardScorer

    cfg, plan = fork(parent_root, "strict", "reward.components.format=0.0", reuse_rollouts=True)
    assert [c.key for c in plan.changes] == ["reward.components"]
    assert not plan.eval_inherited  # the reward scores the evaluation too
    run_stages(cfg, tmp_path / "strict.log", first=K)
    # the generate job says it re-scores, and what: no sampling
    assert (
        f"generate stage {K}: re-scoring the stored responses of {PARENT} (no sampling)"
        in (tmp_path / "strict.log").read_text()
    )
    parent_rows, rows = _rows(parent_root, PARENT, K), _rows(parent_root, "strict", K)
    assert [r["response_token_ids"] for r in rows] == [r["response_token_ids"] for r in parent_rows]
    assert [r["behavior_logprobs"] for r in rows] == [r["behavior_logprobs"] for r in parent_rows]
    with RewardScorer(RewardConfig(components={"math_correctness": 1.0, "format": 0.0}, num_workers=1)) as scorer:
        fresh = scorer.score([RewardInput(r["response_text"], r["ground_truth"]) for r in rows])
    assert [r["reward"] for r in rows] == [f.reward for f in fresh]
    assert [r["extracted_answer"] for r in rows] == [f.extracted_answer for f in fresh]


def test_refusals(parent_root):
    store = Store(str(parent_root))
    parent = load_run_config(str(parent_root), PARENT)

    def refused(*args, **kwargs) -> ForkRefused:
        with pytest.raises(ForkRefused) as info:
            plan_fork(store, parent, *args, **kwargs)
        assert "Nothing was written" in str(info.value)
        return info.value

    assert "the fork stage must be 1..3" in str(refused(0, "c0", []))
    assert "the fork stage must be 1..3" in str(refused(4, "c0", []))
    assert "run.num_stages > 3" in str(refused(3, "c0", []))  # the parent's last stage: the fork needs more stages
    assert "run.seed" in str(refused(1, "c1", ["run.seed=9"]))
    e = refused(1, "c2", ["generation.sampling.temperature=0.5"], reuse_rollouts=True)
    assert "generation.sampling.temperature" in str(e) and "--reuse-rollouts" in str(e)
    plan = refused(1, "c3", ["train.updates_per_stage=3"])  # stage 0's plan would change: named with both plans
    assert "stage 0 would be planned as 4 prompts from 0 and 3 updates" in str(plan) and "run.stage_schedule" in str(
        plan
    )
    assert plan.exit_code == 2
    assert refused(1, PARENT, []).exit_code == 3  # an existing run id
    assert "agpo" in str(refused(1, "c4", ["agpo={probe: true}"], reuse_rollouts=True))  # probes cannot be served
    assert not (parent_root / "c0").exists() and not (parent_root / "c2").exists()


def test_a_changed_or_missing_parent_file_is_refused_naming_it(parent_root, tmp_path):
    from mugrpo.orchestration.preflight import Refusal, preflight
    from mugrpo.orchestration.resume import check_resume

    cfg, _ = fork(parent_root, "guarded", "train.lr=0.002")
    store = Store(str(parent_root))
    manifest = parent_root / PARENT / "jobs/stage=0/train.manifest.json"
    saved = manifest.read_bytes()
    manifest.write_bytes(saved.replace(b'"updates"', b'"updates" ', 1))
    try:
        with pytest.raises(ForkRefused) as info:
            check_resume(store, cfg)
        assert info.value.exit_code == 3 and f"{PARENT}/jobs/stage=0/train.manifest.json" in str(info.value)
    finally:
        manifest.write_bytes(saved)
    check_resume(store, cfg)  # restored: it may continue
    shard = parent_root / PARENT / "rollouts/stage=0/shard=00000.parquet"  # a data file the fork references
    saved = shard.read_bytes()
    shard.write_bytes(saved[:-1] + bytes([saved[-1] ^ 1]))
    try:
        with pytest.raises(Refusal) as refused:
            preflight(cfg)  # what `mugrpo resume` checks before anything starts (orchestration.verify_on_resume)
        assert refused.value.exit_code == 3
        assert f"{PARENT}/rollouts/stage=0/shard=00000.parquet" in refused.value.message
    finally:
        shard.write_bytes(saved)
    ckpt = RunLayout(PARENT).checkpoints_dir(0)
    moved = tmp_path / "ckpt"
    os.rename(parent_root / ckpt, moved)
    try:
        with pytest.raises(ForkRefused) as info:
            check_resume(store, cfg)
        assert "final checkpoint of stage 0" in str(info.value)
        with pytest.raises(ForkRefused, match="pruned") as info:
            plan_fork(store, load_run_config(str(parent_root), PARENT), K, "late", [])
        assert info.value.exit_code == 3 and "--fresh-optimizer" in str(info.value)
        plan_fork(store, load_run_config(str(parent_root), PARENT), K, "late", [], fresh_optimizer=True)
    finally:
        os.rename(moved, parent_root / ckpt)


def test_sigkill_of_a_fork_mid_stage_then_resume_is_bitwise(parent_root, tmp_path):
    cfg, _ = fork(parent_root, "killed", "train.lr=0.002")
    log = tmp_path / "killed.log"
    init_run(cfg)
    urls = write_job_specs(attach_run(cfg), K)
    _ok(start_job("generate", urls["generate"], log), log)
    proc = start_job("train", urls["train"], log)
    layout, deadline = cfg.layout, time.monotonic() + 600
    while not (parent_root / layout.checkpoint_dir(K, 1)).joinpath("_COMPLETE").exists():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # mid-stage: after update 1's checkpoint, before the stage's last update
    proc.wait()
    run_stages(cfg, log, first=K)
    reference, _ = fork(parent_root, "unkilled", "train.lr=0.002")
    run_stages(reference, tmp_path / "unkilled.log", first=K)
    for k in range(K, STAGES):
        assert _steps(parent_root, "killed", k) == _steps(parent_root, "unkilled", k)
    assert _same_weights(_final(parent_root, "killed"), _final(parent_root, "unkilled"))


def test_a_warm_fork_trains_as_the_cold_fork(parent_root, tmp_path):
    """One algorithm, one code path: a fork run warm (one segment job from its fork stage on) commits the same
    rollouts and final weights as the same fork run cold (test_fork_without_overrides_...: the parent's)."""
    from mugrpo.execution.warm import SegmentSpec

    cfg, _ = fork(parent_root, "warm", "orchestration.execution=warm", f"orchestration.segment_stages={STAGES}")
    init_run(cfg)
    spec = tmp_path / "segment.json"
    spec.write_text(SegmentSpec.from_config(cfg, K, STAGES - K).model_dump_json())
    _ok(start_job("segment", spec, tmp_path / "warm.log"), tmp_path / "warm.log")
    for k in range(K, STAGES):
        assert _rows(parent_root, "warm", k) == _rows(parent_root, PARENT, k), f"stage {k} rollouts differ"
    assert _same_weights(_final(parent_root, "warm"), _final(parent_root, PARENT))
