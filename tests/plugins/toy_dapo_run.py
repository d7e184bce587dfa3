"""Drives the toy plugin algorithm through real jobs in a fresh interpreter that loaded it (``MUGRPO_PLUGINS``):
``python toy_dapo_run.py ROOT TINY_MODEL_DIR OUT.json``; tests/e2e/test_toy_algorithm.py checks what it reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from _tiny import generate_spec, tiny_config, train_spec, with_policy
from toy_dapo import FIELDS, FILTERED, WEIGHT, ToyDAPOConfig

from mugrpo.commits.tables import read_table
from mugrpo.config import ConfigError, config_from_dict
from mugrpo.generation import run_generate
from mugrpo.rewards import RewardConfig
from mugrpo.schedules.stages import stage_plan
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.loop import run_training
from mugrpo.trainer.records import read_steps

RUN = "toy"


def shard_rows(store: Store, layout: RunLayout, shards: int) -> list[list[dict]]:
    out = []
    for s in range(shards):
        table = read_table(store, layout.rollout_shard(0, s), "rollouts", extra=FIELDS)
        out.append([{k: v for k, v in r.items() if k != "created_at"} for r in table.to_pylist()])
    return out


def main(root: Path, model_dir: Path, out: Path) -> None:
    report: dict = {}
    toy = {"oversample": 1.5, "groups_per_stage": 2}
    cfg = config_from_dict(tiny_config(root, model_dir, run_id=RUN, toy_dapo=toy))
    report["stage_prompts"] = stage_plan(cfg, 0).num_prompts  # 4 asked, over-sampled
    try:
        config_from_dict(tiny_config(root, model_dir, run_id=RUN, loss={"name": "toy_scaled_grpo"}))
    except ConfigError as e:
        report["refused"] = str(e)

    store, layout = with_policy(root, model_dir, RUN), RunLayout(RUN)
    spec = generate_spec(
        root,
        RUN,
        num_prompts=report["stage_prompts"],
        shard_size=2,
        sampling={"temperature": 1.0, "max_new_tokens": 6, "n": 4},
        reward=RewardConfig(components={"toy_parity": 1.0}, num_workers=1),
        toy_dapo=ToyDAPOConfig(**toy),
    )
    manifest = run_generate(spec)
    shards = (report["stage_prompts"] + 1) // 2
    first = shard_rows(store, layout, shards)
    report["counts"] = manifest.counts
    report["groups"] = [
        {"prompt_id": r["prompt_id"], "filtered": r[FILTERED], "zero_variance": r["zero_variance"], "weight": r[WEIGHT]}
        for rows in first
        for r in rows
        if r["sample_idx"] == 0
    ]
    schema = read_table(store, layout.rollout_shard(0, 0), "rollouts").schema
    report["extension_columns"] = (schema.metadata or {}).get(b"mugrpo.extension_columns", b"").decode()

    # Resume: the last shard and the commits gone; the re-run rebuilds the kept count from the committed shards.
    store.delete(layout.rollout_shard(0, shards - 1))
    store.delete(layout.job_manifest(0, "generate"))
    store.delete(layout.job_manifest(0, "generate.worker-000-of-001"))
    run_generate(spec)
    report["resumed_equal"] = shard_rows(store, layout, shards) == first

    train = train_spec(
        root,
        RUN,
        seed=3,
        total_updates=2,
        train={"updates_per_stage": 2, "rollouts_per_update": 4, "micro_batch_size": 2},
        loss={"name": "toy_scaled_grpo"},
        toy_dapo=ToyDAPOConfig(**toy),
    )
    trained = run_training(train)
    report["train_counts"] = trained.counts
    steps = read_steps(store, layout, 0)[0].to_pylist()
    report["steps"] = [{"num_sequences": s["num_sequences"], "loss_metrics": dict(s["loss_metrics"])} for s in steps]
    report["shown"] = shown_rows(root, store, layout, shards)
    out.write_text(json.dumps(report))


def shown_rows(root: Path, store: Store, layout: RunLayout, shards: int) -> dict:
    """What the run report and the tracker's rollout samples show of stage 0: the one exclusion rule
    (mugrpo.commits.exclusion over the declared excludes columns) leaves the plugin's filtered rows out."""
    from mugrpo.algorithms import excluding_columns
    from mugrpo.inspection.report import collect
    from mugrpo.tracking.events import rollout_sample

    data = collect(str(root / RUN))
    columns, sample = rollout_sample(store, layout, 0, 1000, excluding_columns())
    filtered = {r["prompt_id"] for rows in shard_rows(store, layout, shards) for r in rows if r[FILTERED]}
    return {
        "excluding": excluding_columns(),
        "report_rollouts": data.rollouts_by_stage[0]["rollouts"],
        "report_example_prompts": sorted({e["prompt_text"] for e in data.examples}),
        "sample_rows": len(sample),
        "sample_filtered": sum(row[columns.index("prompt_id")] in filtered for row in sample),
        "filtered_prompts": len(filtered),
    }


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
