"""Forks without a model: the `lineage` SQL view, the fork part of the report and `mugrpo status`'s fork line, over
a fabricated parent (evals of stages 0..2, 2 = its final policy) and a fork at stage K=1 (evals of stages 2..3)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from test_sql import _eval_rows, write_run
from typer.testing import CliRunner

from mugrpo.commits.manifest import new_manifest, write_manifest
from mugrpo.commits.tables import table_from_rows, write_table
from mugrpo.config import load_config
from mugrpo.evaluation.metrics import paired_difference_ci
from mugrpo.inspection.report import collect, render
from mugrpo.sql import connect
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store

K, PARENT_STAGES, CHILD_STAGES = 1, 2, 3
CONFIG = "configs/gsm8k-smollm2-quick.yaml"
CHANGE = {"key": "train.lr", "from": 5e-06, "to": 1e-05, "class": "semantic"}


def _write_evals(store: Store, run_id: str, stage: int, skill: float) -> list:
    rel = RunLayout(run_id).eval_file(stage, "gsm8k")
    return [write_table(store, rel, table_from_rows(_eval_rows(run_id, stage, skill), "evals"), "evals")]


def _config(root: Path, run_id: str, stages: int, lr: float) -> dict:
    overrides = [f"run.root={root}", f"run.id={run_id}", f"run.num_stages={stages}", f"train.lr={lr}"]
    return load_config(CONFIG, overrides).to_json_dict()


@pytest.fixture
def family(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    store = Store(str(root))
    write_run(store, "parent", skill=0.5)  # stages 0, 1 (evals at skill 0.5, 0.75)
    _write_evals(store, "parent", PARENT_STAGES, 0.5)  # the parent's final policy
    created = datetime(2026, 1, 1, tzinfo=UTC).isoformat()
    store.write_json(
        "parent/run.json", {"created_at": created, "config": _config(root, "parent", PARENT_STAGES, 5e-06)}
    )
    config = _config(root, "child", CHILD_STAGES, 1e-05)
    config["run"]["parent"] = {"run_id": "parent", "stage": K, "reuse_rollouts": False, "fresh_optimizer": False}
    copy = store.read_bytes("parent/stages/stage=0.json")
    store.write_bytes("child/stages/stage=0.json", copy)  # verbatim: its run_id is the parent's
    lineage = {
        "parent": store.uri("parent"),
        "parent_run_id": "parent",
        "stage": K,
        "parent_config_sha256": "0" * 64,
        "changed_keys": [CHANGE],
        "reuse_rollouts": False,
        "fresh_optimizer": False,
        "eval_inherited": True,
        "references": {"stages/stage=0.json": "f" * 64},
        "created_at": "2026-01-02T00:00:00+00:00",
    }
    store.write_json("child/run.json", {"created_at": created, "config": config, "lineage": lineage})
    for k in range(K, CHILD_STAGES):  # the fork's own stages; stage 1's eval is the parent's (inherited)
        files = _write_evals(store, "child", k, 0.75) if k > K else []
        write_manifest(store, new_manifest("child", k, files))
    _write_evals(store, "child", CHILD_STAGES, 0.75)  # the fork's final policy
    return root


def _scores(root: Path, run_id: str, stage: int) -> dict[str, float]:
    with connect(str(root / run_id)) as cat:
        rows = cat.arrow(f"SELECT prompt_id, score FROM eval_problems WHERE stage = {stage}").to_pylist()
    return {r["prompt_id"]: r["score"] for r in rows}


def test_lineage_view_lists_parents_and_forks(family: Path):
    with connect(str(family)) as cat:
        rows = {r["run_id"]: r for r in cat.arrow("SELECT * FROM lineage").to_pylist()}
        child_stages = cat.arrow("SELECT DISTINCT stage FROM evals WHERE run_id = 'child' ORDER BY 1").to_pylist()
    assert set(rows) == {"child", "parent"}
    assert rows["parent"]["parent_run_id"] is None and rows["parent"]["fork_stage"] is None
    child = rows["child"]
    assert (child["parent_run_id"], child["fork_stage"], child["eval_inherited"]) == ("parent", K, True)
    assert child["reuse_rollouts"] is False and child["changed_keys"] == ["train.lr: 5e-06 -> 1e-05"]
    assert child["created_at"] == datetime(2026, 1, 2, tzinfo=UTC)
    assert [r["stage"] for r in child_stages] == [2, 3]  # SQL over the fork shows only its own stages


def test_report_of_a_fork_holds_the_parents_curve_and_paired_differences(family: Path):
    data = collect(str(family / "child"))
    curve = {e["stage"]: e for e in data.evals}
    assert sorted(curve) == [0, 1, 2, 3]
    assert [curve[k]["from_parent"] for k in sorted(curve)] == [True, True, False, False]
    assert curve[1]["avg_at_k"] == pytest.approx(sum(_scores(family, "parent", 1).values()) / 4)
    assert curve[3]["avg_at_k"] == pytest.approx(sum(_scores(family, "child", 3).values()) / 4)
    fork = data.fork
    assert fork is not None and (fork.parent_run_id, fork.stage, fork.changed) == (
        "parent",
        K,
        ["train.lr: 5e-06 -> 1e-05"],
    )
    pairs = {(d["child_stage"], d["parent_stage"]): d for d in fork.diffs}
    assert set(pairs) == {(2, 2), (3, 2)} and pairs[(3, 2)]["final"] and not pairs[(2, 2)]["final"]
    for (cs, ps), d in pairs.items():
        ci = paired_difference_ci(_scores(family, "child", cs), _scores(family, "parent", ps))
        assert (d["diff"], d["ci95_low"], d["ci95_high"], d["problems"]) == pytest.approx((ci.mean, ci.low, ci.high, 4))
        assert d["ci95_low"] < d["diff"] < d["ci95_high"]
    page = render(data)
    assert "<h2>Lineage</h2>" in page and "stage 1 (parent)" in page and "train.lr: 5e-06 -&gt; 1e-05" in page


def test_status_prints_the_fork_line(family: Path):
    from mugrpo.cli import app

    result = CliRunner().invoke(app, ["status", str(family / "child")])
    assert result.exit_code == 0, result.output
    assert "fork of parent at stage 1 (stages 0..0 referenced; changed: train.lr 5e-06 -> 1e-05)" in result.output
    plain = CliRunner().invoke(app, ["status", str(family / "parent")])
    assert plain.exit_code == 0, plain.output
    assert "fork of" not in plain.output
    assert json.loads((family / "child" / "run.json").read_text())["lineage"]["stage"] == K
