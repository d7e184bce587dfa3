"""Schemas: Parquet round trip with version metadata, and refusal of unknown versions or wrong tables."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mugrpo.commits.tables import (
    META_EXTENSIONS,
    SchemaError,
    read_table,
    schema_misfit,
    table_from_rows,
    write_table,
)
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import META_VERSION, OLDER_SCHEMAS, ROLLOUT_SCHEMA, SCHEMA_VERSIONS, TABLES


def rollout_rows(n: int = 3) -> list[dict]:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        dict(
            run_id="r",
            stage=0,
            policy_version=0,
            prompt_id="p0",
            sample_idx=i,
            group_size=n,
            prompt_text="q",
            prompt_token_ids=[1, 2],
            response_text="a",
            response_token_ids=[5, 2],
            behavior_logprobs=[-0.5, -0.25],
            finish_reason="stop",
            num_tokens=2,
            reward=float(i),
            reward_components={"math_correctness": float(i), "format": 1.0},
            reward_status="ok",
            ground_truth="4",
            extracted_answer=None if i == 0 else "4",
            advantage=0.5 * i,
            zero_variance=False,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            seed=7,
            engine="transformers",
            created_at=now,
        )
        for i in range(n)
    ]


def test_rollout_round_trip_keeps_types_and_values(tmp_path):
    store = Store(str(tmp_path))
    rows = rollout_rows()
    rec = write_table(store, "r/rollouts/stage=0/shard=00000.parquet", table_from_rows(rows, "rollouts"), "rollouts")
    assert rec.rows == 3 and len(rec.sha256) == 64
    back = read_table(store, "r/rollouts/stage=0/shard=00000.parquet", "rollouts", expected_sha256=rec.sha256)
    assert back.schema.remove_metadata().equals(ROLLOUT_SCHEMA)
    got = back.to_pylist()
    assert got[2]["behavior_logprobs"] == [-0.5, -0.25]
    assert dict(got[1]["reward_components"]) == {"math_correctness": 1.0, "format": 1.0}
    assert got[0]["extracted_answer"] is None
    assert back.column("prompt_token_ids").type == pa.list_(pa.int32())


def test_every_table_has_a_version():
    assert set(TABLES) == set(SCHEMA_VERSIONS)


def test_unknown_version_is_refused_with_the_file_named(tmp_path):
    store = Store(str(tmp_path))
    rel = "r/rollouts/stage=0/shard=00000.parquet"
    write_table(store, rel, table_from_rows(rollout_rows(), "rollouts"), "rollouts")
    table = pq.read_table(tmp_path / rel)
    meta = dict(table.schema.metadata)
    meta[META_VERSION] = b"999"
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / rel)
    with pytest.raises(SchemaError, match=r"shard=00000\.parquet.*schema version '999' is not supported"):
        read_table(store, rel, "rollouts")


def test_wrong_table_or_missing_column_is_refused(tmp_path):
    store = Store(str(tmp_path))
    rel = "r/x.parquet"
    write_table(store, rel, table_from_rows(rollout_rows(), "rollouts"), "rollouts")
    with pytest.raises(SchemaError, match="expected a mugrpo 'train_steps' table"):
        read_table(store, rel, "train_steps")
    bad = table_from_rows(rollout_rows(), "rollouts").drop_columns(["advantage"])
    with pytest.raises(SchemaError, match="advantage"):
        write_table(store, "r/y.parquet", bad, "rollouts")
    pq.write_table(pa.table({"a": [1]}), tmp_path / "r/plain.parquet")
    with pytest.raises(SchemaError, match="file says 'nothing'"):
        read_table(store, "r/plain.parquet", "rollouts")


def _stamped(schema: pa.Schema, table: str, version: int, extensions: str = "") -> pa.Schema:
    meta = {b"mugrpo.table": table.encode(), META_VERSION: str(version).encode()}
    return schema.with_metadata({**meta, **({META_EXTENSIONS: extensions.encode()} if extensions else {})})


def test_schema_misfit_accepts_every_readable_version_and_names_each_difference():
    """The one rule of read_table, from a schema alone (a file's footer): older versions and listed extension
    columns fit; a file of another schema is told apart column by column."""
    for (table, version), schema in OLDER_SCHEMAS.items():
        assert schema_misfit(_stamped(schema, table, version), table) is None, (table, version)
    for table, schema in TABLES.items():
        assert schema_misfit(_stamped(schema, table, SCHEMA_VERSIONS[table]), table) is None, table
    own = ROLLOUT_SCHEMA.append(pa.field("excludes", pa.bool_()))  # an algorithm's declared column
    assert schema_misfit(_stamped(own, "rollouts", 4, "excludes"), "rollouts") is None
    assert "unexpected column `excludes`" in schema_misfit(_stamped(own, "rollouts", 4), "rollouts")
    other = ROLLOUT_SCHEMA.set(ROLLOUT_SCHEMA.get_field_index("reward"), pa.field("reward", pa.string()))
    other = other.remove(other.get_field_index("advantage")).append(pa.field("bogus", pa.string()))
    assert schema_misfit(_stamped(other, "rollouts", 4), "rollouts") == (
        "columns differ from the 'rollouts' schema version 4: column `reward` is string, expected float; missing "
        "column `advantage`; unexpected column `bogus`"
    )
    v3 = OLDER_SCHEMAS[("train_steps", 3)]
    assert schema_misfit(_stamped(TABLES["train_steps"], "train_steps", 3), "train_steps") == (
        "columns differ from the 'train_steps' schema version 3: "
        + "; ".join(f"unexpected column `{f.name}`" for f in TABLES["train_steps"] if f.name not in v3.names)
    )
    nullable = ROLLOUT_SCHEMA.set(0, ROLLOUT_SCHEMA.field(0).with_nullable(True))
    assert schema_misfit(_stamped(nullable, "rollouts", 4), "rollouts").endswith(
        "column `run_id` is nullable, expected not nullable"
    )
    swapped = pa.schema([ROLLOUT_SCHEMA.field(1), ROLLOUT_SCHEMA.field(0), *list(ROLLOUT_SCHEMA)[2:]])
    assert schema_misfit(_stamped(swapped, "rollouts", 4), "rollouts").endswith("columns are not in the schema's order")


def _train_step(stage: int, update: int, metrics: dict[str, float]) -> dict:
    from mugrpo.trainer.records import train_step_row

    return train_step_row(
        run_id="r",
        stage=stage,
        stage_update=update,
        policy_version=0,
        metrics={"policy_loss": 0.5, "loss": 0.5, **metrics},
        grad_norm=1.0,
        lr=1e-5,
        num_sequences=8,
        num_tokens=100,
        seconds=1.0,
        staleness=0,
        mean_reward=0.1,
    )


def test_train_steps_version_1_reads_with_null_loss_metrics_in_python_and_sql(tmp_path):
    """train_steps v2 added the loss_metrics map (a loss's own metrics, e.g. ConSPO's); v1 files stay readable."""
    from mugrpo.sql import connect
    from schemas.tables import TRAIN_STEP_SCHEMA_V1

    store = Store(str(tmp_path))
    new_rel, old_rel = "r/train_steps/stage=1/part-00001.parquet", "r/train_steps/stage=0/part-00001.parquet"
    row = _train_step(1, 1, {"conspo_valid_groups": 2.0, "ratio_mean": 1.0})
    assert dict(row["loss_metrics"]) == {"conspo_valid_groups": 2.0} and row["ratio_mean"] == 1.0
    old = pa.Table.from_pylist([_train_step(0, 1, {})], schema=TRAIN_STEP_SCHEMA_V1)  # as mugrpo wrote v1
    old = old.replace_schema_metadata({b"mugrpo.table": b"train_steps", META_VERSION: b"1"})
    (tmp_path / old_rel).parent.mkdir(parents=True)
    pq.write_table(old, tmp_path / old_rel)

    assert SCHEMA_VERSIONS["train_steps"] == 4
    back = read_table(store, old_rel, "train_steps")
    assert back.schema.remove_metadata().equals(TABLES["train_steps"]) and back.column("loss_metrics").null_count == 1
    with connect(str(tmp_path / "r")) as cat:  # the current columns over older files only: loss_metrics NULL
        assert cat.arrow("SELECT loss_metrics FROM train_steps WHERE stage = 0").to_pylist() == [{"loss_metrics": None}]
    write_table(store, new_rel, table_from_rows([row], "train_steps"), "train_steps")
    with connect(str(tmp_path / "r")) as cat:
        rows = cat.arrow(
            "SELECT stage, loss_metrics['conspo_valid_groups'] AS valid FROM train_steps ORDER BY stage"
        ).to_pylist()
    assert rows == [{"stage": 0, "valid": None}, {"stage": 1, "valid": 2.0}]
    assert dict(read_table(store, new_rel, "train_steps").column("loss_metrics")[0].as_py()) == {
        "conspo_valid_groups": 2.0
    }


def test_rollouts_v1_files_are_read_with_top_k_and_min_p_off(tmp_path):
    """A run committed before rollouts v2 (no top_k / min_p columns) still resumes: the columns read as off."""
    from schemas.tables import ROLLOUT_SCHEMA_V1

    table = table_from_rows(rollout_rows(3), "rollouts").select(ROLLOUT_SCHEMA_V1.names)  # no top_k/min_p (nor v3's)
    table = table.replace_schema_metadata({b"mugrpo.table": b"rollouts", META_VERSION: b"1"})
    store = Store(str(tmp_path))
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    store.write_bytes("old.parquet", buf.getvalue().to_pybytes())
    upgraded = read_table(store, "old.parquet", "rollouts")
    assert upgraded.schema.remove_metadata().equals(ROLLOUT_SCHEMA)
    assert upgraded["top_k"].to_pylist() == [0, 0, 0] and upgraded["min_p"].to_pylist() == [0.0] * 3


def test_train_steps_version_2_reads_with_null_replay_columns(tmp_path):
    """train_steps v3 added the replay columns (arXiv 2606.04560); v2 files read them as NULL, in Python and SQL."""
    from mugrpo.sql import connect
    from schemas.tables import TRAIN_STEP_SCHEMA_V2, TRAIN_STEP_V3_COLUMNS

    store = Store(str(tmp_path))
    old_rel, new_rel = "r/train_steps/stage=0/part-00001.parquet", "r/train_steps/stage=1/part-00001.parquet"
    old = pa.Table.from_pylist([_train_step(0, 1, {})], schema=TRAIN_STEP_SCHEMA_V2)
    old = old.replace_schema_metadata({b"mugrpo.table": b"train_steps", META_VERSION: b"2"})
    (tmp_path / old_rel).parent.mkdir(parents=True)
    pq.write_table(old, tmp_path / old_rel)
    back = read_table(store, old_rel, "train_steps")
    assert all(back.column(c).null_count == 1 for c in TRAIN_STEP_V3_COLUMNS)
    row = _train_step(1, 1, {})
    row.update(num_fresh=8, num_replayed=4, replay_age_max=3)
    write_table(store, new_rel, table_from_rows([row], "train_steps"), "train_steps")
    with connect(str(tmp_path / "r")) as cat:
        rows = cat.arrow("SELECT stage, num_fresh, num_replayed FROM train_steps ORDER BY stage").to_pylist()
    assert rows == [
        {"stage": 0, "num_fresh": None, "num_replayed": None},
        {"stage": 1, "num_fresh": 8, "num_replayed": 4},
    ]


def test_train_steps_version_3_reads_with_a_null_health_panel_in_python_sql_and_status(tmp_path):
    """train_steps v4 added the health panel (ess, kl_sampler, ..., batch_id); v3 files read it as NULL in Python, in
    SQL (over v3 files only, and next to a v4 file) and in ``mugrpo status``'s health line."""
    from mugrpo.orchestration.runs import health_line, latest_train_step
    from mugrpo.sql import connect
    from schemas.tables import TRAIN_STEP_SCHEMA_V3, TRAIN_STEP_V4_COLUMNS

    store, layout = Store(str(tmp_path)), RunLayout("r")
    old_rel, new_rel = layout.train_steps_part(0, 1), layout.train_steps_part(1, 1)
    old = pa.Table.from_pylist([_train_step(0, 1, {})], schema=TRAIN_STEP_SCHEMA_V3)
    old = old.replace_schema_metadata({b"mugrpo.table": b"train_steps", META_VERSION: b"3"})
    (tmp_path / old_rel).parent.mkdir(parents=True)
    pq.write_table(old, tmp_path / old_rel)
    back = read_table(store, old_rel, "train_steps")
    assert back.schema.remove_metadata().equals(TABLES["train_steps"])
    assert all(back.column(c).null_count == 1 for c in TRAIN_STEP_V4_COLUMNS)
    with connect(str(tmp_path / "r")) as cat:  # v3 files only: the v4 columns exist, NULL
        assert cat.arrow("SELECT ess, batch_id FROM train_steps").to_pylist() == [{"ess": None, "batch_id": None}]
    latest = latest_train_step(store, layout, num_stages=1)
    assert latest["ess"] is None
    line = health_line(latest)
    assert line.startswith("health @ update 1 (stage 0): ESS -") and "S*eta -" in line
    row = _train_step(1, 1, {})
    row.update(ess=0.97, kl_sampler=1e-3, sampler_clip_frac=0.0, s_eta=0.0, batch_id="0123456789abcdef")
    write_table(store, new_rel, table_from_rows([row], "train_steps"), "train_steps")
    with connect(str(tmp_path / "r")) as cat:
        rows = cat.arrow("SELECT stage, ess, batch_id FROM train_steps ORDER BY stage").to_pylist()
    assert rows == [
        {"stage": 0, "ess": None, "batch_id": None},
        {"stage": 1, "ess": 0.97, "batch_id": "0123456789abcdef"},
    ]
    assert "ESS 0.970" in health_line(latest_train_step(store, layout, num_stages=2))


def test_map_columns_are_written_in_one_key_order():
    """A config read back from run.json lists reward components in another order than its YAML, so a
    resumed run built its reward_components maps in another key order. Maps are written sorted by key: the rows of a
    resumed run equal an uninterrupted run's, byte for byte."""
    import io

    import pyarrow.parquet as pq

    (base,) = rollout_rows(1)
    yaml_order = {**base, "reward_components": {"math_correctness": 1.0, "format": 0.5}}
    json_order = {**base, "reward_components": {"format": 0.5, "math_correctness": 1.0}}
    tables = [table_from_rows([row], "rollouts") for row in (yaml_order, json_order)]
    assert tables[0].column("reward_components").to_pylist() == [[("format", 0.5), ("math_correctness", 1.0)]]
    assert tables[0].equals(tables[1])
    blobs = []
    for t in tables:
        buf = io.BytesIO()
        pq.write_table(t, buf)
        blobs.append(buf.getvalue())
    assert blobs[0] == blobs[1]
