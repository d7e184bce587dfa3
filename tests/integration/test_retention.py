"""Retention of optimizer state (``train.keep_optimizer_state``, docs/branching.md "Retention") and the
storage figures of ``mugrpo status``.

Real files, built fast: a run started with ``init_run`` (run.json with its input fingerprints, the tiny initial
policy), then per stage the files a stage commits: rollout shards of the tiny policy with their generate manifest,
the published policy, the final checkpoint written by the real checkpoint writer (a real AdamW state, RNG, trainer
state, a reference to the published weights), the train manifest, and the stage commit of the flow
(``commit_stage``), which prunes.
"""

from __future__ import annotations

import functools
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from _tiny import tiny_config
from safetensors.torch import save_file
from typer.testing import CliRunner

from bench.support.synthetic import commit_rollouts, synthetic_rollout_rows
from mugrpo.cli import app
from mugrpo.commits.manifest import write_job_manifest
from mugrpo.commits.policies import committed_policy_ref
from mugrpo.commits.retention import (
    AUTO_KEEP_ALL_BELOW,
    OPTIMIZER_FILE,
    OptimizerStatePruned,
    describe,
    kept_stages,
    prune_optimizer_state,
)
from mugrpo.commits.verify import verify_run
from mugrpo.config import ConfigError, config_from_dict, load_config
from mugrpo.config_keys import OPERATIONAL_CLASS, key_class
from mugrpo.inspection.storage_use import storage_use
from mugrpo.orchestration.fork import ForkRefused, plan_fork
from mugrpo.orchestration.preflight import Refusal, preflight
from mugrpo.orchestration.resume import MomentsPrunedError, check_resume
from mugrpo.orchestration.runs import attach_run, commit_stage, init_run, load_run_config
from mugrpo.storage.store import COMPLETE_MARKER, Store
from mugrpo.trainer.checkpoint import capture_rng_state, read_checkpoint, read_optimizer_state, write_checkpoint
from mugrpo.trainer.commit import file_records
from schemas import FileRecord, JobManifest, StageTimings

UPDATES = 2
STAGES = 4
runner = CliRunner()


def _adamw_state() -> dict:
    """A real AdamW state dict (two moments per parameter) of a small model after one step."""
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 64)).sum().backward()
    opt.step()
    return opt.state_dict()


@functools.cache
def _rows(model_dir: str) -> list[dict]:
    """Real rollout rows (2 groups of 2) of the tiny policy, written as each stage's rollouts."""
    return synthetic_rollout_rows(model_dir, run_id="any", num_prompts=2, group_size=2)


def _manifest(cfg, stage: int, job: str, files: list[FileRecord], **counts: int) -> None:
    now = datetime.now(UTC)
    manifest = JobManifest(run_id=cfg.run.id, stage=stage, job=job, created_at=now, files=files, counts=counts)
    write_job_manifest(store_of(cfg), manifest)


def store_of(cfg) -> Store:
    return Store(cfg.run.root)


def write_stage(cfg, stage: int, tmp: Path) -> None:
    """What stage ``stage`` commits before the flow's stage commit: rollouts, the policy of stage+1, the final
    checkpoint (referencing that policy's weights), the generate and train manifests."""
    store, layout = store_of(cfg), cfg.layout
    rows = [{**row, "run_id": cfg.run.id, "stage": stage} for row in _rows(cfg.model.source)]
    commit_rollouts(store, cfg.run.id, stage, rows, shard_size=1)
    policy = tmp / f"{cfg.run.id}-policy-{stage + 1}"
    policy.mkdir(parents=True)
    save_file({"w": torch.full((64, 64), float(stage))}, str(policy / "model.safetensors"))
    (policy / "config.json").write_text("{}")
    store.upload_dir(policy, layout.policy_dir(stage + 1), meta={"stage": stage + 1})
    write_checkpoint(
        store,
        layout.checkpoint_dir(stage, UPDATES),
        policy_ref=committed_policy_ref(store, layout.policy_dir(stage + 1)),
        optimizer_state=_adamw_state(),
        trainer_state={"stage": stage, "stage_update": UPDATES, "global_update": (stage + 1) * UPDATES},
        rng_states=[capture_rng_state()],
    )
    _manifest(cfg, stage, "train", file_records(store, layout, layout.policy_dir(stage + 1)), updates=UPDATES)


def make_run(root: Path, model_dir: Path, run_id: str, keep, stages: int = STAGES):
    cfg = config_from_dict(
        tiny_config(root, model_dir, run_id=run_id, run={"num_stages": stages}, train={"keep_optimizer_state": keep})
    )
    init_run(cfg)
    return cfg


def commit_stages(cfg, tmp: Path, stages: range) -> None:
    for k in stages:
        write_stage(cfg, k, tmp)
        commit_stage(attach_run(cfg), k, StageTimings())


def has_moments(cfg, stage: int) -> bool:
    return (Path(cfg.run.root) / cfg.layout.checkpoint_dir(stage, UPDATES) / OPTIMIZER_FILE).exists()


def marker(cfg, stage: int) -> dict:
    return json.loads((Path(cfg.run.root) / cfg.layout.checkpoint_dir(stage, UPDATES) / COMPLETE_MARKER).read_text())


class Killed(Exception):
    """The process dies here."""


@pytest.fixture(scope="module")
def last_run(tmp_path_factory, tiny_model_dir):
    """A 4-stage run with ``train.keep_optimizer_state=last``, its stages 0-2 committed."""
    root = tmp_path_factory.mktemp("retention")
    cfg = make_run(root / "runs", tiny_model_dir, "last", "last")
    commit_stages(cfg, root, range(3))
    return cfg


def test_the_key_is_operational_and_validated():
    from mugrpo.config import Config

    assert key_class("train.keep_optimizer_state", Config) == OPERATIONAL_CLASS
    assert Config().train.keep_optimizer_state == "auto"
    for value, want in (("all", "all"), ("last", "last"), (3, 3), ("2", 2)):
        assert Config.model_validate({"train": {"keep_optimizer_state": value}}).train.keep_optimizer_state == want
    for bad in (0, -1, True, "first"):
        with pytest.raises(ConfigError, match="keep_optimizer_state"):
            load_config(None, [f"train.keep_optimizer_state={json.dumps(bad)}"])
    assert [kept_stages(s, 10) for s in ("all", "last", 3)] == [None, 1, 3]
    assert kept_stages("auto", AUTO_KEEP_ALL_BELOW - 1) is None and kept_stages("auto", AUTO_KEEP_ALL_BELOW) == 1
    assert kept_stages("auto", None) is None  # nothing measured: keep
    assert "last: 8.59 GB" in describe("auto", 8_589_934_592)


def test_last_prunes_the_moments_of_earlier_stages_and_keeps_the_rest_verifiable(last_run, tmp_path):
    cfg, store, layout = last_run, store_of(last_run), last_run.layout
    assert [has_moments(cfg, k) for k in range(3)] == [False, False, True]  # the next stage starts from stage 2's
    for k in range(3):  # policies, weights references, RNG and trainer state stay
        assert store.is_complete_dir(layout.policy_dir(k + 1)) and store.is_complete_dir(
            layout.checkpoint_dir(k, UPDATES)
        )
    record = marker(cfg, 0)
    assert OPTIMIZER_FILE not in record["files"] and "policy.ref.json" in record["files"]
    pruned = record["pruned"][OPTIMIZER_FILE]
    assert pruned["reason"] == "train.keep_optimizer_state=last" and pruned["bytes"] > 30_000
    assert len(pruned["sha256"]) == 64 and record["step"] == UPDATES  # the marker's other fields are kept
    report = verify_run(store, cfg.run.id, cfg.run.num_stages, layout)
    assert report.ok, report.problems()
    assert not any(OPTIMIZER_FILE in p for s in report.stages[:2] for p in s.intact)
    assert f"checkpoints/stage=2/step={UPDATES:06d}/{OPTIMIZER_FILE}" in report.stages[2].intact
    # Whoever needs pruned moments is told so, naming the key: a resume of stage 0's training, a stage carrying
    # stage 1's moments over.
    with pytest.raises(OptimizerStatePruned, match="train.keep_optimizer_state=last"):
        read_checkpoint(store, layout.checkpoint_dir(0, UPDATES), tmp_path / "resume")
    with pytest.raises(OptimizerStatePruned, match="--fresh-optimizer"):
        read_optimizer_state(store, layout.checkpoint_dir(1, UPDATES))
    assert read_optimizer_state(store, layout.checkpoint_dir(2, UPDATES))["state"]  # what stage 3 starts from


def test_the_job_exits_2_naming_the_key(last_run):
    from mugrpo.jobs.common import refuse_untrusted

    with pytest.raises(SystemExit) as info, refuse_untrusted("train", 2):
        read_optimizer_state(store_of(last_run), last_run.layout.checkpoint_dir(1, UPDATES))
    assert info.value.code == 2


def test_a_resume_that_would_start_from_pruned_moments_is_refused(last_run, tmp_path):
    """A rollback to before stage 1 (its stage and job manifests deleted): stage 1's training would resume from its
    own checkpoint, whose moments are gone; with that checkpoint deleted too, from stage 0's final one, also
    pruned. Both are refused before anything runs, naming the key and the fork that starts fresh."""
    root = tmp_path / "runs"
    shutil.copytree(Path(last_run.run.root), root)
    cfg = load_run_config(str(root), last_run.run.id)
    store, layout = Store(str(root)), cfg.layout
    check_resume(store, cfg)  # as committed: stage 3 starts from stage 2's moments, which are kept
    for k in (1, 2):
        store.delete(layout.stage_manifest(k))
        for job in ("generate", "train"):
            store.delete(layout.job_manifest(k, job))
    with pytest.raises(MomentsPrunedError) as info:
        check_resume(store, cfg)
    text = str(info.value)
    assert info.value.exit_code == 3 and "cannot continue at stage 1" in text
    assert "checkpoints/stage=1/step=000002" in text and "train.keep_optimizer_state=last" in text
    assert "--at-stage 1 --id NEW --fresh-optimizer" in text
    with pytest.raises(Refusal) as refused:
        preflight(cfg)  # what `mugrpo resume` checks before anything starts
    assert refused.value.exit_code == 3 and "train.keep_optimizer_state=last" in refused.value.message
    store.delete(layout.checkpoints_dir(1), recursive=True)
    with pytest.raises(MomentsPrunedError, match="checkpoints/stage=0/step=000002"):
        check_resume(store, cfg)


def test_a_fork_at_a_stage_whose_moments_were_pruned_needs_fresh_moments(last_run):
    store, parent = store_of(last_run), load_run_config(last_run.run.root, last_run.run.id)
    for stage in (1, 2):  # they start from the moments of stages 0 and 1: pruned
        with pytest.raises(ForkRefused) as info:
            plan_fork(store, parent, stage, f"child{stage}", [])
        assert info.value.exit_code == 3
        assert "train.keep_optimizer_state=last" in str(info.value) and "--fresh-optimizer" in str(info.value)
        plan_fork(store, parent, stage, f"child{stage}", [], fresh_optimizer=True)
    plan_fork(store, parent, 3, "child3", [])  # stage 2's moments are kept


def test_an_integer_keeps_that_many_stages_and_auto_keeps_all_of_a_small_model(tmp_path, tiny_model_dir):
    two = make_run(tmp_path / "runs", tiny_model_dir, "two", 2)
    commit_stages(two, tmp_path, range(STAGES))
    assert [has_moments(two, k) for k in range(STAGES)] == [False, False, True, True]
    assert marker(two, 1)["pruned"][OPTIMIZER_FILE]["reason"] == "train.keep_optimizer_state=2"
    auto = make_run(tmp_path / "runs", tiny_model_dir, "auto", "auto")
    commit_stages(auto, tmp_path, range(STAGES))
    assert all(has_moments(auto, k) for k in range(STAGES))  # a few KB of moments: auto is all
    assert all("pruned" not in marker(auto, k) for k in range(STAGES))
    # A resume may lower it (operational): the next commit prunes every stage beyond it, once.
    data = auto.model_dump(mode="json")
    data["train"]["keep_optimizer_state"] = "last"
    commit_stage(attach_run(config_from_dict(data)), STAGES - 1, StageTimings())
    assert [has_moments(auto, k) for k in range(STAGES)] == [False, False, False, True]
    assert verify_run(store_of(auto), auto.run.id, STAGES, auto.layout).ok


def test_an_interrupted_prune_leaves_a_verifiable_checkpoint_and_the_next_commit_finishes_it(
    tmp_path, tiny_model_dir, monkeypatch
):
    cfg = make_run(tmp_path / "runs", tiny_model_dir, "cut", "last")
    commit_stages(cfg, tmp_path, range(1))
    write_stage(cfg, 1, tmp_path)
    store = store_of(cfg)

    def killed(self, rel, recursive=False):
        raise Killed(rel)

    with monkeypatch.context() as m:  # killed after the marker's rewrite, before the file's deletion
        m.setattr(Store, "delete", killed)
        with pytest.raises(Killed, match=OPTIMIZER_FILE):
            commit_stage(attach_run(cfg), 1, StageTimings())
    assert has_moments(cfg, 0) and OPTIMIZER_FILE in marker(cfg, 0)["pruned"]  # an extra file no marker lists
    assert verify_run(store, cfg.run.id, cfg.run.num_stages, cfg.layout).ok
    with pytest.raises(OptimizerStatePruned):
        read_optimizer_state(store, cfg.layout.checkpoint_dir(0, UPDATES))
    commit_stages(cfg, tmp_path, range(2, 3))
    assert [has_moments(cfg, k) for k in range(3)] == [False, False, True]
    assert prune_optimizer_state(store, cfg.layout.checkpoint_dir(0, UPDATES), "again") == []  # idempotent
    assert verify_run(store, cfg.run.id, cfg.run.num_stages, cfg.layout).ok


def test_status_shows_the_bytes_per_stage_and_the_projection(last_run):
    cfg, root = last_run, Path(last_run.run.root)
    use = storage_use(store_of(cfg), cfg, [0, 1, 2])
    run_dir = root / cfg.run.id

    def size(*globs: str) -> int:
        return sum(p.stat().st_size for g in globs for p in run_dir.glob(g) if p.is_file())

    assert sorted(use.stages) == [0, 1, 2]
    for k in range(3):
        b = use.stages[k]
        assert b.policies == size(f"policies/stage={k + 1}/*")
        assert b.rollouts == size(f"rollouts/stage={k}/*")
        assert b.optimizer == size(f"checkpoints/stage={k}/*/{OPTIMIZER_FILE}") and (b.optimizer > 0) == (k == 2)
        assert b.weights == 0  # the final checkpoint references the published weights
    assert use.run.policies == size("policies/stage=0/*")
    assert use.total.total == size("**/*")
    per_stage = round(sum(use.stages[k].total - use.stages[k].optimizer for k in range(3)) / 3)
    assert use.per_stage == per_stage and use.kept == 1 and use.optimizer_per_stage == use.stages[2].optimizer
    assert use.projected == use.run.total + per_stage * STAGES + use.stages[2].optimizer
    assert use.pruned == use.stages[2].optimizer * (STAGES - 1)
    result = runner.invoke(app, ["status", str(root / cfg.run.id)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "ckpt optimizer" in out and "rollouts" in out and "projected for 4 stages" in out
    assert "retention: train.keep_optimizer_state=last" in out and "left: stages [3]" in out
