"""AGPO's generation (arXiv 2605.20722): probe rows at tau_base, training rows at each prompt's adaptive tau, the
temperature controller checked by replaying the committed probes by hand, and a resume that continues the EMA."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _tiny import generate_spec, with_policy

from mugrpo.algorithms.agpo import AGPOConfig, TemperatureController, dispersion, skewness, vote_entropy
from mugrpo.commits.manifest import read_job_manifest
from mugrpo.commits.tables import read_table
from mugrpo.generation import run_generate
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.data import load_rollouts

AGPO = AGPOConfig(tau_lambda=0.5)  # a larger gain than the code's 0.15


def _shard_rows(root, num_shards: int) -> list[list[dict]]:
    store, layout = Store(str(root)), RunLayout("gen")
    return [read_table(store, layout.rollout_shard(0, s), "rollouts").to_pylist() for s in range(num_shards)]


def test_probe_then_adaptive_temperature_by_hand_and_resume(tmp_path, tiny_model_dir):
    root = tmp_path
    with_policy(root, tiny_model_dir, "gen")
    spec = generate_spec(root, "gen", num_prompts=4, agpo=AGPO, advantage={"estimator": "agpo"})
    manifest = run_generate(spec)
    shards = _shard_rows(root, 2)
    rows = [r for shard in shards for r in shard]
    probes = [r for r in rows if r["is_probe"]]
    train = [r for r in rows if not r["is_probe"]]
    assert len(probes) == len(train) == 12
    assert manifest.counts["rows"] == 12 and manifest.counts["excluded_rows"] == 12
    assert manifest.counts["excluded_tokens"] == sum(r["num_tokens"] for r in probes)
    assert manifest.counts["tokens"] == sum(r["num_tokens"] for r in rows)

    # Replay the controller by hand over the prompts in shard order, from the probe rows alone.
    ctl = TemperatureController(lam=0.5)
    prompts = list(dict.fromkeys(r["prompt_id"] for r in train))
    for pid in prompts:
        probe = sorted((r for r in probes if r["prompt_id"] == pid), key=lambda r: r["sample_idx"])
        rewards = [r["reward"] for r in probe]
        sigma, ent = dispersion(rewards, "std"), vote_entropy([r["response_text"] for r in probe])
        tau, c = ctl.step(sigma + ent)  # w_r = w_e = 1, w_k = 0
        group = [r for r in train if r["prompt_id"] == pid]
        assert all(r["temperature"] == 1.0 for r in probe)
        for r in group + probe:
            assert r["probe_sigma"] == pytest.approx(sigma) and r["probe_vote_entropy"] == pytest.approx(ent)
            assert r["probe_skew"] == pytest.approx(skewness(rewards))
            assert r["agpo_u"] == pytest.approx(sigma + ent) and r["agpo_c"] == pytest.approx(c)
        assert all(r["temperature"] == pytest.approx(tau) for r in group)  # float32 column
    assert ctl.ema == pytest.approx(manifest.metrics["agpo_u_ema"])
    # (the tiny random model's probes all have reward 0 and 3 distinct answers, so U is the same for every prompt
    # and tau stays tau_base here; the temperature's response to U is covered by the scripted-controller test and
    # test_probe_temperatures_reach_the_engine_params below)
    # AGPO advantage of a training group: (r - mean) / max(sample std, 1e-8) of the training rewards
    for pid in prompts:
        group = [r for r in train if r["prompt_id"] == pid]
        rew = np.array([r["reward"] for r in group], dtype=np.float64)
        std = rew.std(ddof=1)
        expected = np.zeros_like(rew) if std == 0 else (rew - rew.mean()) / max(std, 1e-8)
        np.testing.assert_allclose([r["advantage"] for r in group], expected, rtol=1e-5, atol=1e-6)

    # The trainer never sees the probes.
    data = load_rollouts(Store(str(root)), "gen", [0], skip_zero_variance_groups=False)
    assert data.counts["excluded_rows"] == 12 and len(data.rollouts) == 12
    assert all(r.columns["probe_sigma"] is not None and r.columns["is_probe"] is False for r in data.rollouts)

    # Resume: the last shard and the manifest gone, the re-run replays shard 0's U and rewrites shard 1 bitwise.
    store, layout = Store(str(root)), RunLayout("gen")
    store.delete(layout.rollout_shard(0, 1))
    store.delete(layout.job_manifest(0, "generate"))
    store.delete(layout.job_manifest(0, "generate.worker-000-of-001"))  # the worker's own commit (fan-out)
    again = run_generate(spec)
    redone = _shard_rows(root, 2)
    for col in ("prompt_id", "response_token_ids", "temperature", "agpo_u", "agpo_c", "is_probe", "advantage"):
        assert [r[col] for r in redone[1]] == [r[col] for r in shards[1]], col
    assert again.metrics["agpo_u_ema"] == manifest.metrics["agpo_u_ema"]  # bitwise
    assert math.isfinite(again.metrics["mean_temperature"])


def test_rollouts_without_agpo_have_no_probe_rows(tmp_path, tiny_model_dir):
    root = tmp_path
    with_policy(root, tiny_model_dir, "gen")
    manifest = run_generate(generate_spec(root, "gen", num_prompts=2))
    rows = _shard_rows(root, 1)[0]
    assert manifest.counts["excluded_rows"] == 0 and "agpo_u_ema" not in manifest.metrics
    assert all(r["is_probe"] is False and r["agpo_u"] is None for r in rows)


def test_probe_temperatures_reach_the_engine_params(tmp_path):
    from mugrpo.algorithms.agpo.probe import PromptPlan, ShardProbe
    from mugrpo.algorithms.agpo.stats import ProbeStats
    from mugrpo.generation import shard_params

    stats = ProbeStats(0.0, 0.0, 0.0, 0.0)
    probe = ShardProbe([], [], [PromptPlan(stats, 1.0, 0.0, 0.75), PromptPlan(stats, 2.0, 1.0, 1.4)])
    spec = generate_spec(tmp_path, "gen", agpo=AGPO)
    params = shard_params(spec, 0, [object(), object()], probe)
    assert params.temperatures == (0.75, 1.4) and params.temperatures_for(2) == [0.75, 1.4]
    assert shard_params(spec, 0, [object(), object()]).temperatures is None


def test_rollouts_version_1_files_read_with_null_agpo_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from test_schemas import rollout_rows

    from mugrpo.sql import connect
    from schemas import SCHEMA_VERSIONS, TABLES
    from schemas.tables import META_VERSION, ROLLOUT_SCHEMA_V1

    rel = "r/rollouts/stage=0/shard=00000.parquet"
    old = pa.Table.from_pylist(rollout_rows(), schema=ROLLOUT_SCHEMA_V1)  # as mugrpo wrote v1
    old = old.replace_schema_metadata({b"mugrpo.table": b"rollouts", META_VERSION: b"1"})
    (tmp_path / rel).parent.mkdir(parents=True)
    pq.write_table(old, tmp_path / rel)
    assert SCHEMA_VERSIONS["rollouts"] == 4
    back = read_table(Store(str(tmp_path)), rel, "rollouts")
    assert back.schema.remove_metadata().equals(TABLES["rollouts"])
    assert back.column("is_probe").null_count == back.num_rows == old.num_rows
    with connect(str(tmp_path / "r")) as cat:
        got = cat.arrow("SELECT count(*) AS n FROM rollouts WHERE is_probe IS NOT TRUE").to_pylist()
    assert got == [{"n": old.num_rows}]
