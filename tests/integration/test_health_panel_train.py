"""The health panel and the learner temperature in real training jobs on the tiny policy (CPU, in-process, real
Parquet): the panel is measured against the engine's log-probs while the loss uses the stage-start recompute,
T*eta survives a resume exactly, and a learner temperature equal to the sampling one changes nothing.

The rollouts are synthetic but real (:mod:`bench.support.synthetic`): behavior log-probs from a teacher-forced
forward of the same policy. An engine-vs-trainer mismatch is simulated by shifting the stored log-probs by up to
0.1 nats per token (what a real engine's kernels do, at a larger scale so the test can see it).
"""

from __future__ import annotations

import dataclasses
import math
import random
import shutil
from pathlib import Path

import pytest
import torch
from _tiny import policy_weights, train_spec

from bench.support.synthetic import commit_rollouts, synthetic_rollout_rows
from mugrpo.common.seeds import derive_seed
from mugrpo.policy.models import load_policy, load_tokenizer
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.tracking.events import committed_train_events
from mugrpo.trainer.data import load_rollouts, make_minibatch_order
from mugrpo.trainer.loop import Trainer, run_training
from mugrpo.trainer.optim import build_lr_schedule
from mugrpo.trainer.records import read_steps
from mugrpo.trainer.setup import recompute_behavior
from schemas.tables import TRAIN_STEP_V4_COLUMNS

RUN = "health-test"
LAYOUT = RunLayout(RUN)


def _commit(root: Path, tiny_model_dir: Path, *, temperature: float = 1.0, engine_noise: float = 0.0) -> Store:
    store = Store(str(root))
    store.upload_dir(tiny_model_dir, LAYOUT.policy_dir(0), meta={"stage": 0})
    rows = synthetic_rollout_rows(
        tiny_model_dir,
        run_id=RUN,
        num_prompts=4,
        group_size=4,
        seed=2,
        temperature=temperature,
        response_tokens=(2, 16),
    )
    rng = random.Random(0)
    for row in rows:  # the engine's log-probs, off from the trainer's by up to engine_noise nats
        row["behavior_logprobs"] = [x - engine_noise * rng.random() for x in row["behavior_logprobs"]]
    commit_rollouts(store, RUN, 0, rows, shard_size=2)
    return store


def _spec(root: Path, **train):
    return train_spec(
        root, RUN, train={"updates_per_stage": 4, "rollouts_per_update": 8, "checkpoint_every": 2, **train}
    )


def _steps(store: Store) -> list[dict]:
    table, _ = read_steps(store, LAYOUT, 0)
    return table.to_pylist()


@pytest.mark.slow  # two tiny training jobs (~30 s on a loaded 2-core machine)
def test_panel_is_against_the_sampler_and_t_eta_survives_a_resume(tiny_model_dir, tmp_path):
    root = tmp_path / "store"
    store = _commit(root, tiny_model_dir, engine_noise=0.1)
    spec = _spec(root, recompute_behavior_logprobs=True, lr=1e-3, warmup_updates=1)
    run_training(spec)
    steps = _steps(store)
    assert [s["stage_update"] for s in steps] == [1, 2, 3, 4]
    first = steps[0]
    # The loss's ratio is against the recompute: exactly 1 at update 1 of an unchanged policy.
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and first["ratio_max"] == pytest.approx(1.0, abs=1e-6)
    # The panel's weights are against the engine's q: they show the simulated mismatch (pi/q in [1, e^0.1]).
    assert 0.99 < first["ess"] < 1.0 and first["kl_sampler"] > 1e-4
    assert (
        1.0
        <= first["sampler_ratio_p1"]
        < first["sampler_ratio_p99"]
        <= first["sampler_ratio_max"]
        <= math.exp(0.1) + 1e-5
    )
    assert first["sampler_clip_frac"] == 0.0  # mu_grpo's [0, 5]
    for s in steps:
        assert all(s[c] is not None for c in TRAIN_STEP_V4_COLUMNS), s
        assert len(s["batch_id"]) == 16 and int(s["batch_id"], 16) >= 0
        assert s["s_eta"] == s["staleness"] * s["lr"] and s["logit_var"] > 0
    schedule = build_lr_schedule(spec.train, spec.total_updates)
    assert [s["t_eta"] for s in steps] == [math.fsum(schedule.lr(v) for v in range(1, u + 1)) for u in (1, 2, 3, 4)]
    assert steps[-1]["staleness"] == 3 and steps[-1]["s_eta"] > 0  # update 4 of a stage: S = 3
    events = committed_train_events(store, LAYOUT, 0, after_update=0)  # what the tracker sinks log
    logged = events[0].values
    assert logged["train/ess"] == first["ess"] and logged["train/t_eta"] == first["t_eta"]
    assert "train/batch_id" not in logged  # a string: not a metric

    # A job killed after the checkpoint of update 2: the resumed job rewrites updates 3-4 with the same T*eta.
    store.delete(LAYOUT.job_manifest(0, "train"))
    store.delete(LAYOUT.policy_dir(1), recursive=True)
    store.delete(LAYOUT.checkpoint_dir(0, 4), recursive=True)
    store.delete(LAYOUT.train_steps_part(0, 4))
    run_training(spec)
    resumed = _steps(store)
    assert [s["t_eta"] for s in resumed] == [s["t_eta"] for s in steps]
    assert [s["batch_id"] for s in resumed] == [s["batch_id"] for s in steps]  # same data order, same batches
    assert [s["ess"] for s in resumed] == pytest.approx([s["ess"] for s in steps], rel=1e-6)


@pytest.mark.slow  # three tiny training jobs
def test_learner_temperature(tiny_model_dir, tmp_path):
    """Sampled at T = 0.8: a learner at 0.8 is the default bitwise; a learner at 1.0 moves the update-1 ratio off 1
    (ess < 1) while the stage-start recompute of the behavior log-probs stays at the sampler's 0.8."""
    base = tmp_path / "base"
    _commit(base, tiny_model_dir, temperature=0.8)
    for name in ("same", "cool"):
        shutil.copytree(base, tmp_path / name)
    run_training(_spec(base, recompute_behavior_logprobs=True))
    run_training(_spec(tmp_path / "same", recompute_behavior_logprobs=True, learner_temperature=0.8))
    run_training(_spec(tmp_path / "cool", recompute_behavior_logprobs=True, learner_temperature=1.0))
    default, same, cool = (_steps(Store(str(tmp_path / n))) for n in ("base", "same", "cool"))
    for key in ("loss", "grad_norm", "ratio_mean", "ess", "kl_sampler", "t_eta", "batch_id"):
        assert [s[key] for s in same] == [s[key] for s in default], key
    w_default, w_same = (policy_weights(Store(str(tmp_path / n)), LAYOUT.policy_dir(1)) for n in ("base", "same"))
    assert all(torch.equal(w_default[k], w_same[k]) for k in w_default)
    assert abs(cool[0]["ratio_mean"] - 1.0) > 1e-3 and cool[0]["ess"] < 0.999
    assert abs(default[0]["ratio_mean"] - 1.0) < 1e-6

    # The recompute that replaces q stays at the sampler's temperature whatever the learner's.
    def recomputed(learner_temperature: float | None) -> list[list[float]]:
        spec = _spec(base, recompute_behavior_logprobs=True, learner_temperature=learner_temperature)
        store = Store(str(base))
        data = load_rollouts(store, RUN, [0], skip_zero_variance_groups=spec.train.skip_zero_variance_groups)
        order = make_minibatch_order(
            data, rollouts_per_update=8, group_minibatches=False, seed=derive_seed(spec.seed, 0, "train-data-order")
        )
        trainer = Trainer()
        trainer.tokenizer = load_tokenizer(tiny_model_dir)
        behavior, _ = load_policy(tiny_model_dir)
        recompute_behavior(trainer, spec, data, order, behavior)
        assert all(r.sampler_logprobs is not None for r in data.rollouts)
        return [list(dataclasses.asdict(r)["behavior_logprobs"]) for r in data.rollouts]

    assert recomputed(1.0) == recomputed(None)
