"""The parts warm execution adds, one at a time (fast): where a stage's behavior policy is when policies are
published every N stages, which checkpoints are pruned, which stages are evaluated, and the segment's progress
records as the launcher task reads them."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mugrpo.commits.manifest import checkpoint_steps, write_job_manifest
from mugrpo.commits.policies import local_policy_dir
from mugrpo.config import Config
from mugrpo.execution.warm import PROGRESS_TAG as JOB_TAG
from mugrpo.execution.warm import SegmentSpec
from mugrpo.orchestration.runs import behavior_policy_dir, evaluates_stage, prune_stage_checkpoints, publishes_policy
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import JobManifest
from tasks.jobs import PROGRESS_TAG, ProgressArtifact

RUN = "parts"


def _cfg(root: Path, **orchestration) -> Config:
    return Config.model_validate(
        {"run": {"id": RUN, "root": str(root), "num_stages": 4}, "orchestration": orchestration}
    )


def _commit_dir(store: Store, tmp: Path, rel: str, name: str) -> None:
    src = tmp / name
    (src / "model").mkdir(parents=True, exist_ok=True)
    (src / "model" / "config.json").write_text("{}")
    store.upload_dir(src, rel)


def _train_done(store: Store, stage: int, updates: int) -> None:
    manifest = JobManifest(
        run_id=RUN, stage=stage, job="train", created_at=datetime.now(UTC), files=[], counts={"updates": updates}
    )
    write_job_manifest(store, manifest)


def test_behavior_policy_is_the_published_one_or_the_previous_final_checkpoint(tmp_path):
    cfg = _cfg(tmp_path / "root", publish_policy_every=2)
    store, layout = Store(str(tmp_path / "root")), RunLayout(RUN)
    assert [publishes_policy(cfg, k) for k in range(5)] == [True, False, True, False, True]
    with pytest.raises(FileNotFoundError, match="stage 0"):
        behavior_policy_dir(store, cfg, 0)
    _commit_dir(store, tmp_path, layout.policy_dir(0), "p0")
    assert behavior_policy_dir(store, cfg, 0) == layout.policy_dir(0)

    # stage 0 trains 4 updates (checkpoints at 2 and 4); no policies/stage=1
    _commit_dir(store, tmp_path, layout.checkpoint_dir(0, 2), "c02")
    with pytest.raises(FileNotFoundError):  # stage 0 has not committed its training: no final checkpoint yet
        behavior_policy_dir(store, cfg, 1)
    _commit_dir(store, tmp_path, layout.checkpoint_dir(0, 4), "c04")
    _train_done(store, 0, 4)
    assert behavior_policy_dir(store, cfg, 1) == layout.checkpoint_dir(0, 4)
    assert (
        local_policy_dir(store, layout.checkpoint_dir(0, 4)) == store.local_path(layout.checkpoint_dir(0, 4)) / "model"
    )

    # stage 1 made no update (every group zero-variance): stage 2's behavior policy is stage 1's
    _train_done(store, 1, 0)
    assert behavior_policy_dir(store, cfg, 2) == layout.checkpoint_dir(0, 4)
    # pruning after stage 1 keeps that checkpoint, drops the older one of the same stage
    assert prune_stage_checkpoints(store, cfg, 1) == [layout.checkpoint_dir(0, 2)]
    assert checkpoint_steps(store, layout, 0) == [4]

    # a published policy wins
    _commit_dir(store, tmp_path, layout.policy_dir(2), "p2")
    assert behavior_policy_dir(store, cfg, 2) == layout.policy_dir(2)
    assert prune_stage_checkpoints(store, cfg, 1) == [layout.checkpoint_dir(0, 4)]
    assert checkpoint_steps(store, layout, 0) == []


def test_evaluated_stages_follow_every_n_stages(tmp_path):
    bench = {"dataset": {"name": "gsm8k", "path": "x.jsonl"}}
    cfg = Config.model_validate({"run": {"num_stages": 8}, "eval": {"every_n_stages": 2, "benchmarks": [bench]}})
    assert [k for k in range(8) if evaluates_stage(cfg, k)] == [0, 2, 4, 6]
    cfg = Config.model_validate({"run": {"num_stages": 8}, "eval": {"every_stage": False, "benchmarks": [bench]}})
    assert not any(evaluates_stage(cfg, k) for k in range(8))
    assert not evaluates_stage(Config(), 0)  # no benchmarks


def test_segment_progress_lines_feed_the_artifact(tmp_path):
    assert JOB_TAG == PROGRESS_TAG  # the job prints what the launcher task parses
    calls = []
    progress = ProgressArtifact(
        "segment",
        {"run": "My_Run", "stage": "8"},
        create=lambda **kw: calls.append(("create", kw["progress"], kw["key"])) or "id-1",
        update=lambda artifact_id, **kw: calls.append(("update", kw["progress"], artifact_id)),
    )
    assert progress.key == "my-run-segment-8"
    assert progress.feed("generate stage 3: 64 rows") is None
    assert progress.feed(PROGRESS_TAG + "{not json") is None
    record = {"stage": 9, "done": 2, "of": 8, "updates": 4, "policy_version": 40, "mean_reward": 0.25, "t_switch": 1.5}
    assert progress.feed(PROGRESS_TAG + json.dumps(record)) == record
    assert progress.feed("[segment] " + PROGRESS_TAG + json.dumps({**record, "done": 8})) is not None
    assert progress.records[0] == record
    assert calls == [("create", 25.0, "my-run-segment-8"), ("update", 100.0, "id-1")]
    spec = SegmentSpec.from_config(_cfg(tmp_path, execution="warm", segment_stages=8), 8, 8)
    assert spec.stage == 8 and spec.num_stages == 8 and spec.config["orchestration"]["execution"] == "warm"


def test_warm_bf16_engine_samples_as_the_cold_engine(tiny_model_dir):
    """With ``model.dtype: bfloat16`` (the SmolLM2 configs) the warm engine keeps a bf16 copy of the trainer's fp32
    policy. It must sample exactly as the cold job's engine, which loads the policy from disk in bf16: the same
    tokens and behavior log-probs. ``model.to(bf16)`` would also cast the rotary ``inv_freq`` buffer, which
    transformers keeps in fp32, and every log-prob would differ."""
    from types import SimpleNamespace

    import torch

    from mugrpo.config import load_config
    from mugrpo.engines.base import SamplingParams
    from mugrpo.engines.transformers_engine import TransformersEngine
    from mugrpo.execution.warm import WarmEngine
    from mugrpo.policy.models import load_policy

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "gsm8k-smollm2.yaml", ["model.dtype=bfloat16"])
    assert cfg.model.dtype == "bfloat16" and cfg.generation.engine == "transformers"
    policy, tokenizer = load_policy(tiny_model_dir)  # the trainer's live fp32 policy (a Trainer holds these two)
    warm = WarmEngine(cfg, SimpleNamespace(policy=policy, tokenizer=tokenizer, weights_stage=0), str(tiny_model_dir))
    cold = TransformersEngine.from_dir(tiny_model_dir, dtype=cfg.model.dtype)
    buffers = dict(warm.engine.model.named_buffers())
    assert buffers["model.rotary_emb.inv_freq"].dtype == torch.float32
    assert next(warm.engine.model.parameters()).dtype == torch.bfloat16
    assert policy.lm_head.weight.dtype == torch.float32  # the trainer's master weights are untouched

    prompts = [tokenizer("Natalia sold clips to 48 of her friends.").input_ids, tokenizer("What is 7 x 8?").input_ids]
    params = SamplingParams(n=2, max_new_tokens=24, temperature=1.0, seed=11)
    got, want = warm.generate(prompts, params), cold.generate(prompts, params)
    for got_group, want_group in zip(got, want, strict=True):
        for a, b in zip(got_group, want_group, strict=True):
            assert a.response_token_ids == b.response_token_ids
            assert a.behavior_logprobs == b.behavior_logprobs


def test_a_fork_prunes_its_own_checkpoints_never_its_parents(tmp_path):
    """A fork at stage 2 with policies published every 2 stages: its commits prune its own stages' checkpoints; the
    parent's checkpoints below the fork stage (which other forks may start from) are never deleted."""
    root = tmp_path / "root"
    store, parent = Store(str(root)), RunLayout(RUN)
    for k in range(2):
        _commit_dir(store, tmp_path, parent.checkpoint_dir(k, 4), f"p{k}")
        _train_done(store, k, 4)
    cfg = Config.model_validate(
        {
            "run": {"id": "child", "root": str(root), "num_stages": 4, "parent": {"run_id": RUN, "stage": 2}},
            "orchestration": {"publish_policy_every": 2},
        }
    )
    child = cfg.layout
    assert child.checkpoint_dir(1, 4) == parent.checkpoint_dir(1, 4)  # the fork reads them where they are
    _commit_dir(store, tmp_path, child.checkpoint_dir(2, 2), "c22")
    _commit_dir(store, tmp_path, child.checkpoint_dir(2, 4), "c24")
    _commit_dir(store, tmp_path, child.policy_dir(4), "c4")  # the next behavior policy is published
    assert prune_stage_checkpoints(store, cfg, 3) == [child.checkpoint_dir(2, 2), child.checkpoint_dir(2, 4)]
    assert checkpoint_steps(store, parent, 0) == [4] and checkpoint_steps(store, parent, 1) == [4]
