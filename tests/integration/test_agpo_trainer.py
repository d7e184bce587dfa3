"""AGPO in the trainer (arXiv 2605.20722): per-group eps from the probe statistics, H / H_ref / KLbar recorded per
update and checked by hand against the controller's rules, state in checkpoints and the manifest, and a resume from
a checkpoint that gives bitwise the same weights and metrics. Tiny policy on CPU, real files."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch
from _tiny import AGPO_LOSS, train_spec
from safetensors.torch import load_file

from bench.support.synthetic import commit_rollouts, synthetic_rollout_rows
from mugrpo.algorithms.agpo import AGPOConfig, adaptive_eps
from mugrpo.commits.manifest import read_job_manifest
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.loop import run_training
from mugrpo.trainer.spec import TrainSpec

RUN = "agpo-train"
UPDATES = 4


def _commit_stage(root, tiny_model_dir) -> list[dict]:
    store = Store(str(root))
    store.upload_dir(tiny_model_dir, RunLayout(RUN).policy_dir(0), meta={"stage": 0})
    rows = synthetic_rollout_rows(tiny_model_dir, run_id=RUN, stage=0, num_prompts=4, group_size=4, seed=5)
    for r in rows:  # probe statistics of the prompt (made up, distinct per prompt), as the generation job stores them
        k = int(r["prompt_id"], 16) % 7
        r.update(is_probe=False, probe_sigma=0.1 * k, probe_vote_entropy=0.2 * k, probe_skew=0.0, agpo_u=0.3 * k)
    commit_rollouts(store, RUN, 0, rows)
    return rows


def _spec(root) -> TrainSpec:
    return train_spec(
        root, RUN, keep_checkpoints=2, train={"updates_per_stage": UPDATES}, loss=AGPO_LOSS, agpo=AGPOConfig()
    )


def _steps(root) -> list[dict]:
    table = pq.read_table(Store(str(root)).local_path(RunLayout(RUN).train_steps_dir(0))).sort_by("stage_update")
    return [{**r, "m": dict(r["loss_metrics"])} for r in table.to_pylist()]


@pytest.mark.slow
def test_agpo_controller_in_training_by_hand_and_resume(tmp_path, tiny_model_dir):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    rows = _commit_stage(straight, tiny_model_dir)
    _commit_stage(resumed, tiny_model_dir)
    manifest = run_training(_spec(straight))
    steps = _steps(straight)
    assert [s["stage_update"] for s in steps] == list(range(1, UPDATES + 1))

    probes = {(r["probe_sigma"], r["probe_vote_entropy"]) for r in rows}
    cfg = AGPOConfig()
    first = steps[0]["m"]
    assert first["agpo_h_ref"] == first["agpo_entropy"] and first["agpo_kl_bar"] == 0.0  # H_ref = first H
    for prev, cur in zip(steps, steps[1:], strict=False):
        p, c = prev["m"], cur["m"]
        assert c["agpo_h_ref"] == pytest.approx(0.01 * p["agpo_entropy"] + 0.99 * p["agpo_h_ref"], rel=1e-12)
        assert c["agpo_kl_bar"] == pytest.approx(0.1 * p["agpo_kl_step"] + 0.9 * p["agpo_kl_bar"], rel=1e-12)
    for s in steps:
        m = s["m"]
        ratio = max(m["agpo_entropy"], 1e-8) / (max(m["agpo_h_ref"], 1e-8) + 1e-8)
        possible = [
            adaptive_eps(
                eps_base=cfg.eps_base,
                eps_min=cfg.eps_min,
                eps_max=cfg.eps_max,
                entropy_ratio=ratio,
                vote_entropy=e,
                sigma=sig,
                kl_bar=m["agpo_kl_bar"],
                skew=0.0,
                a_var=cfg.a_var,
                gamma=cfg.gamma,
                delta=cfg.delta,
                zeta=cfg.zeta,
            )
            for sig, e in probes
        ]
        assert min(possible) <= m["agpo_eps_min"] <= m["agpo_eps_mean"] <= m["agpo_eps_max"] <= max(possible)
        assert any(m["agpo_eps_min"] == pytest.approx(x, rel=1e-9) for x in possible)
        assert m["agpo_kl_step"] >= 0.0 and s["kl_ref"] is not None
    # at the stage commit the manifest holds the controller state after the last update
    last = steps[-1]["m"]
    assert manifest.metrics["agpo_h_ref"] == pytest.approx(0.01 * last["agpo_entropy"] + 0.99 * last["agpo_h_ref"])
    assert manifest.metrics["agpo_kl_bar"] == pytest.approx(0.1 * last["agpo_kl_step"] + 0.9 * last["agpo_kl_bar"])

    # Resume: an interrupted run whose last commit is the checkpoint after update 2 continues with its controller.
    run_training(_spec(resumed))
    store, layout = Store(str(resumed)), RunLayout(RUN)
    store.delete(layout.job_manifest(0, "train"))
    store.delete(layout.policy_dir(1), recursive=True)
    store.delete(layout.checkpoint_dir(0, UPDATES), recursive=True)
    store.delete(layout.train_steps_part(0, UPDATES))
    again = run_training(_spec(resumed))
    assert again.counts["resumed_from"] == 2
    a = load_file(str(Store(str(straight)).local_path(layout.policy_dir(1)) / "model.safetensors"))
    b = load_file(str(store.local_path(layout.policy_dir(1)) / "model.safetensors"))
    assert [n for n in a if not torch.equal(a[n], b[n])] == []
    assert [s["m"] for s in _steps(resumed)] == [s["m"] for s in steps]  # bitwise, controller metrics included
    assert again.metrics["agpo_h_ref"] == manifest.metrics["agpo_h_ref"]
    assert again.metrics["agpo_kl_bar"] == manifest.metrics["agpo_kl_bar"]
