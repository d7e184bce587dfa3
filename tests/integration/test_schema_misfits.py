"""Reads that are not verified still name what is wrong: a committed rollouts shard replaced by a valid
Parquet file of another schema (the same rows, `reward` cast to a string, `advantage` dropped, a `bogus` column
added) makes `mugrpo report` and `mugrpo sql` over its run refuse it, naming the file and what differs; over a root
the file is skipped with a warning and the rest is served; `mugrpo status` calls the run not healthy.

Real files: the committed run of tests/integration/test_rescore.py (rollout shards scored by a real RewardScorer, a
real run.json), copied before it is corrupted; the real command line (typer's CliRunner) and real DuckDB."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_rescore import RUN, committed  # noqa: F401  (the fixture run)
from test_sql import write_run
from typer.testing import CliRunner

from mugrpo.cli import app
from mugrpo.commits.verify import verify_run
from mugrpo.sql import TargetError, connect
from mugrpo.storage.store import Store

runner = CliRunner()
VICTIM = "rollouts/stage=0/shard=00000.parquet"
#: What the block names about the victim: the table, its version and each difference.
DIFFERENCES = (
    "columns differ from the 'rollouts' schema version 4: column `reward` is string, expected float; missing column "
    "`advantage`; unexpected column `bogus`"
)


def replace_with_another_schema(path: Path) -> int:
    """Rewrite ``path`` as a valid Parquet file of another schema: the same rows, `reward` cast to a string,
    `advantage` dropped, a `bogus` column added (the file's metadata still says rollouts v4). Returns its rows."""
    t = pq.read_table(path, partitioning=None)
    t = t.set_column(t.schema.get_field_index("reward"), "reward", t["reward"].cast(pa.string()))
    t = t.drop_columns(["advantage"]).append_column("bogus", pa.array(["x"] * t.num_rows))
    pq.write_table(t, path)
    return t.num_rows


@pytest.fixture
def root(committed, tmp_path) -> Path:  # noqa: F811
    """A copy of the committed run's root whose VICTIM shard is replaced by a file of another schema."""
    root = tmp_path / "runs"
    shutil.copytree(committed, root)
    assert replace_with_another_schema(root / RUN / VICTIM) > 0
    return root


def test_the_victim_is_a_valid_parquet_file_that_verify_calls_corrupted(root):
    assert pq.read_table(root / RUN / VICTIM, partitioning=None).num_rows > 0
    report = verify_run(Store(str(root)), RUN, num_stages=2)
    assert VICTIM in report.stages[0].corrupted


def test_report_refuses_the_run_naming_the_file_in_one_short_block(root):
    run = root / RUN
    result = runner.invoke(app, ["report", str(run), "--out", str(root.parent / "report.html")])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.splitlines()) <= 15, result.output
    assert f"{run / VICTIM}: {DIFFERENCES}" in result.output
    assert f"`mugrpo verify {run}`" in result.output and "restore each from a copy" in result.output
    assert not (root.parent / "report.html").exists()


def test_sql_over_the_run_refuses_it_naming_the_file_and_never_serves_the_stray_column(root):
    run = root / RUN
    avg = runner.invoke(app, ["sql", str(run), "SELECT avg(reward) FROM rollouts"])
    assert avg.exit_code == 2 and "Traceback" not in avg.output and avg.stdout == ""
    assert f"{run / VICTIM}: {DIFFERENCES}" in avg.stderr and f"`mugrpo verify {run}`" in avg.stderr
    assert len(avg.stderr.splitlines()) <= 15, avg.stderr
    star = runner.invoke(app, ["sql", str(run), "-f", "json", "SELECT * FROM rollouts"])
    assert star.exit_code == 2 and star.stdout == "" and f"{run / VICTIM}: {DIFFERENCES}" in star.stderr
    with pytest.raises(TargetError, match=r"shard=00000\.parquet: columns differ"):
        connect(str(run))


def test_sql_over_a_root_skips_the_file_with_a_warning_and_serves_the_rest(root, committed):  # noqa: F811
    write_run(Store(str(root)), "intact")  # an intact run beside the corrupted one
    intact_rows = 2 * 12  # test_sql.write_run: 2 stages of 3 prompts x 4 samples
    kept = pq.read_table(committed / RUN / "rollouts/stage=0/shard=00001.parquet", partitioning=None).num_rows
    query = "SELECT run_id, count(*) AS n, any_value(typeof(reward)) AS t FROM rollouts GROUP BY ALL ORDER BY ALL"
    result = runner.invoke(app, ["sql", str(root), "-f", "json", query])
    assert result.exit_code == 0, result.output
    assert f"Warning: skipped {root / RUN / VICTIM}: {DIFFERENCES}" in result.stderr
    assert json.loads(result.stdout) == [
        {"run_id": "intact", "n": intact_rows, "t": "FLOAT"},
        {"run_id": RUN, "n": kept, "t": "FLOAT"},
    ]
    star = runner.invoke(app, ["sql", str(root), "-f", "json", "SELECT * FROM rollouts"])
    assert star.exit_code == 0 and len(json.loads(star.stdout)) == intact_rows + kept
    assert all("bogus" not in row for row in json.loads(star.stdout))


def test_status_calls_the_run_not_healthy_naming_the_file(root, committed):  # noqa: F811
    result = runner.invoke(app, ["status", str(root / RUN)])
    assert result.exit_code == 0, result.output
    assert f"not healthy: {root / RUN / VICTIM}: {DIFFERENCES}" in result.output
    intact = runner.invoke(app, ["status", str(committed / RUN)])
    assert intact.exit_code == 0 and "not healthy" not in intact.output
