"""`mugrpo rescore`: a committed stage's rollouts re-scored with another reward config, written beside them (never
over them), and the `reward_flips` SQL view over the result.

Real files: a stage committed as generation commits one (rollout shards scored by a real RewardScorer, group
advantages from compute_advantages, the generate job manifest), a real run.json, the real CLI (typer's CliRunner)
and real DuckDB."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bench.support.synthetic import commit_rollouts
from mugrpo.cli import app
from mugrpo.config import config_from_dict
from mugrpo.orchestration.rescore import RESCORE_SCHEMA, read_rescore_shard, rescore_stage
from mugrpo.provenance.refusals import RunRefused
from mugrpo.rewards import RewardConfig, RewardInput, RewardScorer
from mugrpo.scoring.advantages import compute_advantages
from mugrpo.sql import connect
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store, sha256_bytes

RUN, PROMPTS, GROUP = "rescore-test", 3, 4
#: The run's own reward: correctness only (a boxed answer equal to the gold).
RUN_REWARD = {"components": {"math_correctness": 1.0}, "num_workers": 1}
#: The re-scoring: a boxed answer is worth 0.5 whatever it says. Per prompt: the two boxed correct responses drop
#: 1 -> 0.5 (false positives of the old verifier, by this definition), the boxed wrong one rises 0 -> 0.5 (a false
#: negative), the unboxed correct one stays 0.
FORMAT_ONLY = "reward.components={format: 0.5}"
EXPECTED = {"rows": PROMPTS * GROUP, "false negative": PROMPTS, "false positive": 2 * PROMPTS, "unchanged": PROMPTS}

runner = CliRunner()


def _responses(p: int) -> list[str]:
    gold = 2 * p + 2
    return [
        f"{p} + {p + 2} = {gold}, so the answer is \\boxed{{{gold}}}.",
        f"I think it is \\boxed{{{gold + 1}}}.",
        f"The answer is {gold}.",  # correct but unboxed: the strict verifier gives no credit
        f"\\boxed{{{gold}}}",
    ]


def _rows(cfg) -> list[dict]:
    """Rollout rows of PROMPTS groups of GROUP responses, scored and normalized as the generate job does."""
    texts = [(p, i, t) for p in range(PROMPTS) for i, t in enumerate(_responses(p))]
    with RewardScorer(cfg.reward) as scorer:
        results = scorer.score([RewardInput(t, str(2 * p + 2)) for p, _, t in texts])
    rewards = np.array([r.reward for r in results], dtype=np.float32)
    adv, zero = compute_advantages(rewards, [f"p{p}" for p, _, _ in texts], cfg.advantage, expected_group_size=GROUP)
    now = datetime.now(UTC)
    rows = []
    for k, ((p, i, text), res) in enumerate(zip(texts, results, strict=True)):
        rows.append(
            {
                "run_id": RUN,
                "stage": 0,
                "policy_version": 0,
                "prompt_id": f"p{p}",
                "sample_idx": i,
                "group_size": GROUP,
                "prompt_text": f"What is {p} + {p + 2}?",
                "prompt_token_ids": [1, 2, 3 + p],
                "response_text": text,
                "response_token_ids": [5, 6, 7],
                "behavior_logprobs": [-0.1, -0.2, -0.3],
                "finish_reason": "stop",
                "num_tokens": 3,
                "reward": res.reward,
                "reward_components": res.components,
                "reward_status": res.status,
                "ground_truth": str(2 * p + 2),
                "extracted_answer": res.extracted_answer,
                "advantage": float(adv[k]),
                "zero_variance": bool(zero[k]),
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": 0,
                "min_p": 0.0,
                "seed": 7,
                "engine": "synthetic",
                "created_at": now,
            }
        )
    return rows


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> Path:
    """A run root whose stage 0 has committed its rollouts (2 shards), with a run.json as a run writes it."""
    root = tmp_path_factory.mktemp("rescore") / "runs"
    cfg = config_from_dict({"run": {"id": RUN, "root": str(root), "num_stages": 2}, "reward": RUN_REWARD}, source="t")
    store = Store(str(root))
    store.write_json(RunLayout(RUN).run_json, {"run_id": RUN, "config": cfg.to_json_dict()})
    commit_rollouts(store, RUN, 0, _rows(cfg), shard_size=2)
    return root


@pytest.fixture
def run_dir(committed, tmp_path) -> Path:
    """A private copy of the committed run (each test writes its own re-scorings)."""
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(committed, root)
    return root / RUN


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha256_bytes(p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file()}


def _rescore(run_dir: Path, *args: str):
    return runner.invoke(app, ["rescore", str(run_dir), "--stage", "0", *args])


def _rescored(run_dir: Path, name: str) -> list[dict]:
    """Every row of re-scoring ``name`` of stage 0, read through its manifest (sha256 checked)."""
    store, layout = Store(str(run_dir.parent)), RunLayout(RUN)
    manifest = store.read_json(layout.rescore_manifest(name, 0))
    rows = []
    for rec in manifest["files"]:
        rows += read_rescore_shard(store, layout.abs(rec["path"]), rec["sha256"]).to_pylist()
    return rows


def test_rescore_writes_beside_the_rollouts_and_equals_a_fresh_scoring(run_dir):
    before = _digests(run_dir)
    result = _rescore(run_dir, "--name", "format-only", FORMAT_ONLY)
    assert result.exit_code == 0, result.output
    assert "false negative" in result.output and "rescores/format-only/stage=0" in result.output
    after = _digests(run_dir)
    assert {k: v for k, v in after.items() if not k.startswith("rescores/")} == before  # nothing else changed
    assert sorted(k for k in after if k.startswith("rescores/")) == [
        "rescores/format-only/stage=0.json",
        "rescores/format-only/stage=0/shard=00000.parquet",
        "rescores/format-only/stage=0/shard=00001.parquet",
    ]
    store = Store(str(run_dir.parent))
    manifest = store.read_json(RunLayout(RUN).rescore_manifest("format-only", 0))
    assert manifest["counts"] == {**EXPECTED, "not_ok": 0}
    assert manifest["reward"]["components"] == {"format": 0.5}
    assert [f["path"] for f in manifest["source"]] == [
        "rollouts/stage=0/shard=00000.parquet",
        "rollouts/stage=0/shard=00001.parquet",
    ]

    rows = _rescored(run_dir, "format-only")
    assert [r["prompt_id"] for r in rows] == [f"p{p}" for p in range(PROMPTS) for _ in range(GROUP)]
    cfg = RewardConfig(components={"format": 0.5}, num_workers=1)
    texts = [t for p in range(PROMPTS) for t in _responses(p)]
    with RewardScorer(cfg) as scorer:
        fresh = scorer.score([RewardInput(t, str(2 * p + 2)) for p in range(PROMPTS) for t in _responses(p)])
    assert len(texts) == len(rows)
    assert [r["reward"] for r in rows] == [float(np.float32(f.reward)) for f in fresh]
    assert [r["reward_components"] for r in rows] == [list(f.components.items()) for f in fresh]
    assert [r["extracted_answer"] for r in rows] == [f.extracted_answer for f in fresh]
    assert {r["name"] for r in rows} == {"format-only"} and all(r["reward_status"] == "ok" for r in rows)
    # group advantages of the new rewards: per prompt [0.5, 0.5, 0, 0.5] -> the unboxed response below the mean
    new = np.array([r["reward"] for r in rows], dtype=np.float32)
    adv, zero = compute_advantages(new, [r["prompt_id"] for r in rows], config_from_dict({}).advantage)
    np.testing.assert_array_equal([r["advantage"] for r in rows], adv)
    assert [r["zero_variance"] for r in rows] == zero.tolist()
    assert [r["old_reward"] for r in rows] == [1.0, 0.0, 0.0, 1.0] * PROMPTS

    # the same name again with the same config: nothing written; with another config: refused, naming the path
    again = _rescore(run_dir, "--name", "format-only", FORMAT_ONLY)
    assert again.exit_code == 0, again.output
    assert "already written" in again.output and _digests(run_dir) == after
    clash = _rescore(run_dir, "--name", "format-only", "reward.components={format: 1.0}")
    assert clash.exit_code == 2
    assert clash.output.count("Error:") == 1 and "rescores/format-only/stage=0.json" in clash.output
    assert _digests(run_dir) == after


def test_reward_flips_view_counts_the_flips(run_dir):
    with connect(str(run_dir)) as cat:  # no re-scoring yet: both views exist, empty, with their columns
        assert cat.arrow("SELECT count(*) AS n FROM reward_flips").column("n").to_pylist() == [0]
        views = cat.views()
        assert [c for c, _ in views["rescores"]] == RESCORE_SCHEMA.names
        assert [c for c, _ in views["reward_flips"]] == [
            "run_id",
            "stage",
            "name",
            "prompt_id",
            "sample_idx",
            "old_reward",
            "new_reward",
            "flip",
            "response_text",
            "ground_truth",
            "extracted_answer",
            "new_extracted_answer",
        ]
    assert _rescore(run_dir, "--name", "format-only", FORMAT_ONLY).exit_code == 0
    assert _rescore(run_dir, "--name", "same").exit_code == 0

    query = "SELECT name, flip, count(*) AS n FROM reward_flips GROUP BY ALL ORDER BY ALL"
    result = runner.invoke(app, ["sql", str(run_dir), query, "--format", "csv"])
    assert result.exit_code == 0, result.output
    got = {(r["name"], r["flip"]): int(r["n"]) for r in csv.DictReader(io.StringIO(result.output))}
    assert got == {
        ("format-only", "false_negative"): EXPECTED["false negative"],
        ("format-only", "false_positive"): EXPECTED["false positive"],
        ("format-only", ""): EXPECTED["unchanged"],
        ("same", ""): PROMPTS * GROUP,
    }
    with connect(str(run_dir.parent)) as cat:  # over the root: the rollout's texts joined in
        row = cat.arrow(
            "SELECT * FROM reward_flips WHERE name = 'format-only' AND prompt_id = 'p1' AND sample_idx = 1"
        ).to_pylist()
    assert len(row) == 1
    assert row[0]["flip"] == "false_negative" and row[0]["response_text"] == _responses(1)[1]
    assert (row[0]["old_reward"], row[0]["new_reward"]) == (0.0, 0.5)
    assert row[0]["ground_truth"] == "4" and row[0]["extracted_answer"] == row[0]["new_extracted_answer"] == "5"


def test_refusals_are_one_block_exit_2(run_dir):
    before = _digests(run_dir)
    bad_key = _rescore(run_dir, "--name", "x", "train.lr=1")
    assert bad_key.exit_code == 2
    assert bad_key.output.count("Error:") == 1 and "'train.lr'" in bad_key.output
    uncommitted = runner.invoke(app, ["rescore", str(run_dir), "--stage", "1", "--name", "x"])
    assert uncommitted.exit_code == 2
    assert uncommitted.output.count("Error:") == 1
    assert "jobs/stage=1/generate.manifest.json" in uncommitted.output.replace("\n", "")
    bad_name = _rescore(run_dir, "--name", "../x")
    assert bad_name.exit_code == 2 and bad_name.output.count("Error:") == 1
    assert _digests(run_dir) == before  # nothing written by a refusal


def test_rescore_without_overrides_reproduces_the_stored_rewards(run_dir):
    store = Store(str(run_dir.parent))
    from mugrpo.orchestration.runs import load_run_config

    cfg = load_run_config(str(run_dir.parent), RUN)
    result = rescore_stage(store, cfg, 0, "same")
    assert result.counts == {
        "rows": PROMPTS * GROUP,
        "false negative": 0,
        "false positive": 0,
        "unchanged": 12,
        "not_ok": 0,
    }
    rows = _rescored(run_dir, "same")
    stored = _rows(cfg)
    assert [r["reward"] for r in rows] == [float(np.float32(s["reward"])) for s in stored]
    assert [r["old_reward"] for r in rows] == [r["reward"] for r in rows]
    np.testing.assert_array_equal([r["advantage"] for r in rows], np.float32([s["advantage"] for s in stored]))
    with pytest.raises(RunRefused, match="generate.manifest.json"):
        rescore_stage(store, cfg, 1, "same")
