"""mugrpo sql: read-only DuckDB views over local and S3 runs (real Parquet files, real DuckDB, moto S3 server)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from _s3 import moto_server, s3_root  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from mugrpo.commits.manifest import new_manifest, write_manifest
from mugrpo.commits.tables import table_from_rows, write_table
from mugrpo.sql import ReadOnlyQueryError, SqlError, TargetError, connect
from mugrpo.sql.cli import register_cli
from mugrpo.sql.readonly import PositionalReader, ReadOnlyFileSystem
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import StageTimings

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
STAGES, PROMPTS, GROUP, UPDATES, EVAL_PROMPTS = 2, 3, 4, 3, 4


def _rollout_rows(run_id: str, stage: int, skill: float, correctness: str = "correctness") -> list[dict]:
    rows = []
    for p in range(PROMPTS):
        for i in range(GROUP):
            n = 5 + 17 * i + 3 * p + stage  # response lengths 5..60 tokens
            correct = (i + p + stage) % 4 < 4 * skill
            rows.append(
                {
                    "run_id": run_id,
                    "stage": stage,
                    "policy_version": stage * UPDATES,
                    "prompt_id": f"p{p}",
                    "sample_idx": i,
                    "group_size": GROUP,
                    "prompt_text": f"What is {p} + {p}?",
                    "prompt_token_ids": list(range(10 + p)),
                    "response_text": f"The answer is \\boxed{{{2 * p if correct else p}}}" + " ..." * i,
                    "response_token_ids": [(7 * j + i) % 100 for j in range(n)],
                    "behavior_logprobs": [-0.05 * ((j % 7) + 1) for j in range(n)],
                    "finish_reason": "length" if n > 50 else "stop",
                    "num_tokens": n,
                    "reward": float(correct),
                    "reward_components": {correctness: float(correct), "format": 1.0},
                    "reward_status": "ok",
                    "ground_truth": str(2 * p),
                    "extracted_answer": str(2 * p if correct else p),
                    "advantage": (1.0 if correct else -1.0) * 0.5,
                    "zero_variance": False,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": 0,
                    "min_p": 0.0,
                    "seed": 1000 * stage + 10 * p + i,
                    "engine": "transformers",
                    "created_at": T0 + timedelta(hours=stage, seconds=p),
                }
            )
    return rows


def _train_rows(run_id: str, stage: int) -> list[dict]:
    rows = []
    for u in range(1, UPDATES + 1):
        rows.append(
            {
                "run_id": run_id,
                "stage": stage,
                "update": stage * UPDATES + u,
                "stage_update": u,
                "policy_loss": 0.1 / u,
                "loss": 0.1 / u,
                "clip_frac_low": 0.0,
                "clip_frac_high": 0.01 * u,
                "veto_token_frac": 0.02 * (u - 1),
                "veto_response_frac": 0.1 * (u - 1),
                "trigger_count": float(u - 1),
                "ratio_mean": 1.0 + 0.05 * (u - 1),
                "ratio_max": 1.5 + u,
                "ratio_mean_neg_adv": 0.9 - 0.1 * (u - 1),
                "approx_kl_behavior": 0.001 * u,
                "kl_ref": None,
                "entropy": 0.8,
                "grad_norm": 1.0,
                "lr": 1e-5,
                "num_sequences": 8,
                "num_tokens": 8 * (30 + u),
                "seconds": 2.0,
                "tokens_per_second": 4.0 * (30 + u),
                "staleness": u - 1,
                "mean_reward": 0.25 + 0.1 * stage,
                "created_at": T0 + timedelta(hours=stage, minutes=u),
            }
        )
    return rows


def _eval_rows(run_id: str, stage: int, skill: float) -> list[dict]:
    return [
        {
            "run_id": run_id,
            "stage": stage,
            "benchmark": "gsm8k",
            "prompt_id": f"e{p}",
            "sample_idx": s,
            "k": 2,
            "prompt_text": f"eval {p}",
            "response_text": "\\boxed{1}",
            "num_tokens": 20 + p,
            "finish_reason": "stop",
            "ground_truth": "1",
            "extracted_answer": "1",
            "correct": (p + s) % 4 < 4 * skill,
            "reward_status": "ok",
            "temperature": 0.6,
            "top_p": 0.95,
            "created_at": T0 + timedelta(hours=stage, minutes=30),
        }
        for p in range(EVAL_PROMPTS)
        for s in range(2)
    ]


def write_run(
    store: Store, run_id: str, *, skill: float = 0.5, run_json: bool = True, correctness: str = "correctness"
) -> None:
    """A small committed run: STAGES stages of rollouts, train steps, one eval benchmark and manifests;
    ``correctness``: the name of the rollouts' correctness reward component."""
    layout = RunLayout(run_id)
    if run_json:
        store.write_json(layout.run_json, {"created_at": T0.isoformat(), "code_version": "abc123", "config": {"mu": 8}})
    for k in range(STAGES):
        rows = _rollout_rows(run_id, k, skill + 0.25 * k, correctness)
        shards = [rows[:GROUP], rows[GROUP:]]  # two shards; a group never spans two shards
        files = []
        for s, shard in enumerate(shards):
            rel = layout.rollout_shard(k, s)
            files.append(
                write_table(store, rel, table_from_rows(shard, "rollouts"), "rollouts", run_rel=layout.rel(rel))
            )
        rel = layout.train_steps_part(k, 0)
        files.append(write_table(store, rel, table_from_rows(_train_rows(run_id, k), "train_steps"), "train_steps"))
        if k > 0:  # a replay audit part: stage k's update 1 used 2 fresh rows and replayed 2 of stage k-1
            audit = [
                {
                    "run_id": run_id,
                    "stage": k,
                    "update": k * 4 + 1,
                    "stage_update": 1,
                    "rollout_stage": k - replayed,
                    "prompt_id": r["prompt_id"],
                    "sample_idx": r["sample_idx"],
                    "replayed": bool(replayed),
                    "birth_update": (k - replayed) * 4,
                    "age": 4 * replayed,
                    "advantage": r["advantage"],
                    "priority": abs(r["advantage"]) ** 0.5 if replayed else None,
                }
                for replayed in (0, 1)
                for r in (_rollout_rows(run_id, k - replayed, skill)[:2])
            ]
            rel = layout.table_part("replay", k, 1)
            write_table(store, rel, table_from_rows(audit, "replay"), "replay")
        rel = layout.eval_file(k, "gsm8k")
        files.append(
            write_table(store, rel, table_from_rows(_eval_rows(run_id, k, skill + 0.25 * k), "evals"), "evals")
        )
        timings = StageTimings(t_gen=10.0 + k, t_train=20.0, t_eval=5.0, t_switch=3.0, t_total=38.0 + k)
        write_manifest(
            store,
            new_manifest(run_id, k, files, counts={"rollouts": len(rows)}, metrics={"reward": 0.5}, timings=timings),
        )
    # Things the catalog must ignore: a torn temporary file of an atomic write, and folders that are not tables.
    store.fs.pipe_file(store.full(f"{layout.rollouts_dir(0)}/.shard=00009.parquet.tmp-dead"), b"partial")
    store.write_bytes(f"{layout.policy_dir(0)}/config.json", b"{}")
    store.write_bytes(f"{layout.checkpoint_dir(0, 1)}/model.safetensors", b"weights")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    store = Store(str(tmp_path / "runs"))
    write_run(store, "grpo", skill=0.25)
    write_run(store, "mugrpo", skill=0.5, run_json=False)
    return tmp_path / "runs"


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def make_cli() -> typer.Typer:
    app = typer.Typer()
    register_cli(app)

    @app.command("noop", hidden=True)
    def _noop() -> None:  # a second command keeps typer from collapsing the app into `sql` itself
        pass

    return app


def run_cli(*args: str, input: str | None = None):
    return CliRunner().invoke(make_cli(), ["sql", *args], input=input)


# ---------------------------------------------------------------------------------------------------------- views


def test_root_catalog_has_every_view_typed_and_skips_non_table_files(root: Path):
    with connect(str(root)) as cat:
        assert cat.run_ids == ["grpo", "mugrpo"]
        counts = cat.arrow(
            "SELECT (SELECT count(*) FROM rollouts) AS r, (SELECT count(*) FROM train_steps) AS t, "
            "(SELECT count(*) FROM evals) AS e, (SELECT count(*) FROM stages) AS s, (SELECT count(*) FROM runs) AS n"
        ).to_pylist()[0]
        # 2 runs x 2 stages x (3 prompts x G=4); the torn temp shard is not read
        assert counts == {"r": 48, "t": 2 * STAGES * UPDATES, "e": 2 * STAGES * EVAL_PROMPTS * 2, "s": 4, "n": 2}
        types = dict(cat.views()["rollouts"])
        assert types["stage"] == "INTEGER"
        assert types["response_token_ids"] == "INTEGER[]" and types["behavior_logprobs"] == "FLOAT[]"
        assert types["reward_components"] == "MAP(VARCHAR, FLOAT)"
        row = cat.arrow("SELECT response_token_ids, num_tokens FROM rollouts WHERE stage = 1 LIMIT 1").to_pylist()[0]
        assert isinstance(row["response_token_ids"], list) and len(row["response_token_ids"]) == row["num_tokens"]
        by_stage = cat.arrow("SELECT stage, avg(reward) AS r FROM rollouts GROUP BY stage ORDER BY stage")
        assert by_stage.column("stage").type == pa.int32()
        assert by_stage.column("r").to_pylist() == [0.375, 0.625]
        runs = {r["run_id"]: r for r in cat.arrow("SELECT * FROM runs").to_pylist()}
        assert runs["grpo"]["code_version"] == "abc123" and json.loads(runs["grpo"]["config"]) == {"mu": 8}
        assert runs["grpo"]["created_at"] == T0
        assert runs["mugrpo"]["created_at"] is None and runs["mugrpo"]["config"] is None  # no run.json
        assert runs["grpo"]["stages_committed"] == STAGES and runs["grpo"]["rollout_files"] == 2 * STAGES
        stages = cat.arrow("SELECT t_gen, counts['rollouts'] AS n FROM stages WHERE run_id = 'grpo' ORDER BY stage")
        assert stages.to_pylist() == [{"t_gen": 10.0, "n": 12}, {"t_gen": 11.0, "n": 12}]


def test_run_target_sees_only_that_run(root: Path):
    with connect(str(root / "grpo")) as cat:
        assert cat.run_ids == ["grpo"] and cat.target.single_run
        assert cat.arrow("SELECT DISTINCT run_id FROM rollouts").column(0).to_pylist() == ["grpo"]
        assert cat.arrow("SELECT count(*) FROM runs").column(0).to_pylist() == [1]
        # DuckDB's allowed_directories keeps even a raw read_parquet inside the run.
        with pytest.raises(SqlError, match="disabled by configuration"):
            cat.arrow("SELECT count(*) FROM read_parquet('mugrpo://mugrpo/rollouts/stage=0/shard=00000.parquet')")


def test_empty_views_exist_with_the_columns_of_filled_ones(root: Path, tmp_path: Path):
    fresh = Store(str(tmp_path / "fresh"))
    fresh.write_json(RunLayout("new-run").run_json, {"created_at": T0.isoformat()})
    with connect(str(tmp_path / "fresh" / "new-run")) as empty, connect(str(root)) as full:
        assert empty.views() == full.views()
        assert empty.arrow("SELECT count(*) AS n, avg(reward) AS r FROM rollouts").to_pylist() == [{"n": 0, "r": None}]
        assert empty.arrow("SELECT run_id, stages_committed FROM runs").to_pylist() == [
            {"run_id": "new-run", "stages_committed": 0}
        ]


def test_target_errors_are_clear_and_create_nothing(tmp_path: Path):
    missing = tmp_path / "nope"
    with pytest.raises(TargetError, match="does not exist"):
        connect(str(missing))
    assert not missing.exists()
    (tmp_path / "empty-root" / "notes").mkdir(parents=True)
    with pytest.raises(TargetError, match="holds no run"):
        connect(str(tmp_path / "empty-root"))
    result = run_cli(str(missing), "SELECT 1")
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_python_api_returns_a_relation_and_an_arrow_table(root: Path):
    with connect(str(root)) as cat:
        rel = cat.sql("SELECT run_id, stage, count(*) AS n FROM rollouts GROUP BY ALL ORDER BY ALL")
        assert isinstance(rel, duckdb.DuckDBPyRelation) and rel.columns == ["run_id", "stage", "n"]
        assert rel.fetchall()[0] == ("grpo", 0, 12)
        table = cat.arrow('SELECT * FROM train_steps ORDER BY run_id, "update"')
        assert isinstance(table, pa.Table) and table.num_rows == 12
        with pytest.raises(SqlError, match="one statement"):
            cat.sql("SELECT 1; SELECT 2")
        with pytest.raises(SqlError, match="syntax error"):
            cat.sql("SELEC 1")
        with pytest.raises(SqlError, match="no_such_column"):
            cat.arrow("SELECT no_such_column FROM rollouts")


# ------------------------------------------------------------------------------------------------------ read-only

WRITE_ATTEMPTS = {
    "COPY": "COPY (SELECT * FROM rollouts) TO '{run}/rollouts/stage=0/copy.parquet' (FORMAT parquet)",
    "COPY out": "COPY rollouts TO '{tmp}/out.csv'",
    "ATTACH": "ATTACH '{tmp}/writable.duckdb' AS w",
    "CREATE": "CREATE TABLE stolen AS SELECT * FROM read_parquet('{run}/rollouts/stage=0/shard=00000.parquet')",
    "EXPORT": "EXPORT DATABASE '{tmp}/export'",
    "LOAD": "INSTALL httpfs",
    "SET": "SET enable_external_access = true",
    "DROP": "DROP VIEW rollouts",
    # EXPLAIN ANALYZE executes what it wraps: every wrapper form is judged by the wrapped statement
    "DROP explain-analyze": "EXPLAIN ANALYZE DROP VIEW rollouts",
    "DROP explain-analyse": "explain analyse DROP VIEW rollouts",
    "DROP explain": "EXPLAIN DROP VIEW rollouts",
    "DROP explain-options": "EXPLAIN (ANALYZE, FORMAT json) DROP VIEW rollouts",
    "DROP explain-comments": "/* a */ EXPLAIN /* b ( */ ANALYZE /* c */ DROP VIEW rollouts",
    "COPY explain-analyze": "EXPLAIN ANALYZE COPY (SELECT * FROM rollouts) TO '{tmp}/out.csv'",
    "COPY explain-options": "EXPLAIN (ANALYZE, FORMAT json) COPY rollouts TO '{tmp}/out.csv'",
    "CREATE explain-analyze": "EXPLAIN ANALYZE CREATE TABLE stolen AS SELECT 1",
    "INSERT explain-analyze": "EXPLAIN ANALYZE INSERT INTO stages SELECT * FROM stages",
}


@pytest.mark.parametrize("kind", list(WRITE_ATTEMPTS))
def test_cli_refuses_writes_with_a_clear_error_and_leaves_files_unchanged(root: Path, tmp_path: Path, kind: str):
    before = tree_digest(root)
    query = WRITE_ATTEMPTS[kind].format(run=root / "grpo", tmp=tmp_path)
    result = run_cli(str(root), f"SELECT 1 AS harmless; {query}")
    assert result.exit_code == 1
    assert "read-only" in result.stderr and f"statement 2 is a {kind.split()[0]} statement" in result.stderr
    assert result.stdout == ""  # checked before anything ran: not even the harmless SELECT printed
    assert tree_digest(root) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_duckdb_locks_refuse_writes_even_without_the_statement_check(root: Path, tmp_path: Path):
    before = tree_digest(root)
    with connect(str(root)) as cat:
        con = cat.duckdb_connection  # raw connection: only the filesystem and DuckDB's locks stand
        attempts = {
            f"COPY (SELECT 1) TO '{tmp_path}/x.csv'": "disabled by configuration",
            f"COPY (SELECT 1) TO '{root}/grpo/x.csv'": "disabled by configuration",
            "COPY (SELECT 1) TO 'mugrpo://grpo/rollouts/stage=0/shard=00007.parquet'": "read-only",
            f"ATTACH '{tmp_path}/w.duckdb' AS w": "disabled by configuration",
            f"EXPORT DATABASE '{tmp_path}/export'": "disabled by configuration",
            "INSTALL httpfs": "disabled by configuration",
            "SET enable_external_access = true": "configuration has been locked",
            "SET disabled_filesystems = ''": "configuration has been locked",
            "SELECT * FROM read_text('/etc/hostname')": "disabled by configuration",
            "WITH x AS (INSERT INTO stages SELECT * FROM stages RETURNING *) SELECT * FROM x": "is not an table",
        }
        for statement, message in attempts.items():
            with pytest.raises(duckdb.Error, match=re.escape(message)):
                con.execute(statement).fetchall()
        assert cat.arrow("SELECT count(*) FROM rollouts").column(0).to_pylist() == [48]  # reads still work
    assert tree_digest(root) == before
    assert list(tmp_path.iterdir()) == [root]


# ---------------------------------------------------------------------------------------------------------- CLI


def test_cli_formats_table_csv_json(root: Path):
    query = "SELECT run_id, stage, count(*) AS n, avg(reward) AS r FROM rollouts GROUP BY ALL ORDER BY ALL"
    table = run_cli(str(root), query)
    assert table.exit_code == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["run_id", "stage", "n", "r"] and lines[-1] == "(4 rows)"
    assert lines[2].split() == ["grpo", "0", "12", "0.25"]
    assert len({line.index("12") + 2 for line in lines[2:6]}) == 1  # numbers right-aligned in one column

    csv_out = run_cli(str(root), "--format", "csv", query)
    assert csv_out.stdout.splitlines()[:2] == ["run_id,stage,n,r", "grpo,0,12,0.25"]

    lists = run_cli(
        str(root), "-f", "json", "SELECT response_token_ids, reward_components, created_at FROM rollouts LIMIT 2"
    )
    records = json.loads(lists.stdout)
    assert records[0]["response_token_ids"] == [0, 7, 14, 21, 28]
    assert records[0]["reward_components"] == {"correctness": 1.0, "format": 1.0}
    assert datetime.fromisoformat(records[0]["created_at"]) == T0

    short = run_cli(str(root), "--max-rows", "3", "SELECT * FROM rollouts")
    assert short.stdout.splitlines()[-1] == "(48 rows, 3 shown; use --max-rows or --format csv|json for all)"
    assert "... (" in short.stdout  # long token lists are cut in the table

    bad = run_cli(str(root), "-f", "yaml", "SELECT 1")
    assert bad.exit_code == 2 and "yaml" in bad.output


def test_cli_parquet_export_keeps_lists_and_refuses_the_target(root: Path, tmp_path: Path):
    out = tmp_path / "exports" / "worst.parquet"
    query = "SELECT run_id, prompt_id, response_token_ids, reward FROM rollouts WHERE reward = 0 ORDER BY ALL"
    result = run_cli(str(root), "--parquet", str(out), query)
    assert result.exit_code == 0, result.stderr
    exported = pq.read_table(out)
    with connect(str(root)) as cat:
        assert exported.equals(cat.arrow(query))
    assert exported.schema.field("response_token_ids").type == pa.list_(pa.int32())
    assert f"wrote {exported.num_rows} rows" in result.stderr and result.stdout == ""

    before = tree_digest(root)
    inside = run_cli(str(root), "--parquet", str(root / "grpo" / "x.parquet"), query)
    assert inside.exit_code == 2 and "read-only" in inside.stderr
    assert tree_digest(root) == before


def test_cli_runs_statements_in_order_and_reports_the_failing_one(root: Path):
    result = run_cli(str(root), "SELECT 41 + 1 AS answer; SELECT no_such_column FROM rollouts; SELECT 2 AS never")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[2].strip() == "42" and "never" not in result.stdout
    assert "no_such_column" in result.stderr
    two = run_cli(str(root), "--parquet", str(root.parent / "x.parquet"), "SELECT 1; SELECT 2")
    assert two.exit_code == 1 and "one statement" in two.stderr and not (root.parent / "x.parquet").exists()


def test_shell_reads_piped_statements(root: Path):
    script = (
        ".tables\n"
        "SELECT count(*) AS n\n  FROM rollouts;\n"
        "COPY rollouts TO '/tmp/never.csv';\n"
        ".schema stages\n"
        ".format csv\n"
        "SELECT stage, count(*) AS n FROM stages GROUP BY stage ORDER BY stage;\n"
        "SELECT 'last without semicolon' AS s\n"
    )
    result = run_cli(str(root), input=script)
    out = result.stdout
    assert out.splitlines()[0] == (
        "rollouts  train_steps  evals  replay  stages  runs  lineage  eval_problems  eval_scores  "
        "verifier_audit_samples  verifier_audit  stage_corrections  rescores  reward_flips"
    )
    assert " n\n--\n48\n(1 row)\n" in out
    assert "stages(\n  run_id VARCHAR,\n  stage INTEGER," in out
    assert "stage,n\n0,2\n1,2\n" in out and out.endswith("s\nlast without semicolon\n")
    assert "read-only" in result.stderr and not Path("/tmp/never.csv").exists()
    assert result.exit_code == 1  # one statement failed


def test_every_query_of_the_docs_page_runs(root: Path):
    text = (REPO / "docs" / "sql.md").read_text()
    blocks = re.findall(r"```sql\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 10
    with connect(str(root)) as cat:
        for block in blocks:
            try:
                result = cat.arrow(block)
            except SqlError as e:
                pytest.fail(f"docs/sql.md query failed: {e}\n{block}")
            assert result.num_rows > 0, f"docs/sql.md query returned nothing:\n{block}"


# ----------------------------------------------------------------------------------------------------------- S3

SECRET = "s3cr3t-Do-Not-Leak-9f8e7d"


def test_s3_root_is_queried_through_s3fs_and_credentials_never_leak(s3_root, caplog, tmp_path: Path):
    url, opts = s3_root
    opts = {**opts, "key": "AKIAMUGRPOTEST", "secret": SECRET}
    store = Store(url, opts)
    write_run(store, "grpo", skill=0.25)
    caplog.set_level(logging.DEBUG)
    with connect(url, opts) as cat:
        assert cat.target.url == url and cat.run_ids == ["grpo"]
        got = cat.arrow("SELECT stage, count(*) AS n, avg(reward) AS r FROM rollouts GROUP BY ALL ORDER BY ALL")
        assert got.to_pylist() == [{"stage": 0, "n": 12, "r": 0.25}, {"stage": 1, "n": 12, "r": 0.5}]
        assert cat.arrow("SELECT count(*) FROM stages").column(0).to_pylist() == [2]
    secret_opts = ["-o", "key=AKIAMUGRPOTEST", "-o", f"secret={SECRET}"]
    endpoint = ["-o", f"endpoint_url={opts['endpoint_url']}"]
    single = run_cli(f"{url}/grpo", *endpoint, *secret_opts, "-f", "csv", "SELECT count(*) AS n FROM rollouts")
    assert single.exit_code == 0, single.stderr
    assert single.stdout == "n\n24\n"

    # A corrupted shard (not Parquet) is never read, and named but never with the credentials: over the root it is
    # skipped with a warning and the rest is served; its run is refused.
    layout = RunLayout("grpo")
    store.write_bytes(layout.rollout_shard(1, 0), b"not parquet at all" * 10)
    with connect(url, opts) as cat:
        assert [m.rel for m in cat.misfits] == [layout.rollout_shard(1, 0)]
        assert cat.arrow("SELECT count(*) FROM rollouts").column(0).to_pylist() == [24 - GROUP]
    with pytest.raises(TargetError) as failure:
        connect(f"{url}/grpo", opts)
    assert "shard=00000.parquet: not a readable Parquet file" in str(failure.value)
    assert SECRET not in str(failure.value)
    config = tmp_path / "run.yaml"  # storage options from a run config (credentials stay in the environment)
    config.write_text(f"run:\n  storage_options:\n    endpoint_url: {opts['endpoint_url']}\n")
    skipped = run_cli(url, "--config", str(config), *secret_opts, "SELECT avg(reward) FROM rollouts")
    assert skipped.exit_code == 0 and "Warning: skipped s3://" in skipped.stderr
    assert "shard=00000.parquet" in skipped.stderr
    broken = run_cli(f"{url}/grpo", "--config", str(config), *secret_opts, "SELECT avg(reward) FROM rollouts")
    assert broken.exit_code == 2 and "shard=00000.parquet" in broken.stderr
    assert SECRET not in skipped.output + broken.output and SECRET not in caplog.text


def test_redactor_blanks_nested_and_environment_credentials(monkeypatch):
    from mugrpo.sql.redact import Redactor

    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-session-token-123")
    redact = Redactor({"endpoint_url": "http://x", "client_kwargs": {"aws_secret_access_key": SECRET}})
    text = redact(f"failed at http://x with {SECRET} and env-session-token-123")
    assert text == "failed at http://x with *** and ***"


# -------------------------------------------------------------------------------------------------------- bench


def test_bench_runs_at_small_scale(tmp_path: Path):
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "sql_scale.py"), "--rows", "2000", "--out", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    assert "aggregation by stage" in out.stdout and "rows written" in out.stdout
    with connect(str(tmp_path / "b" / "bench")) as cat:
        assert cat.arrow("SELECT count(*) FROM rollouts").column(0).to_pylist() == [2000]


def test_repeated_queries_read_the_same_bytes_as_duckdbs_native_reader(tmp_path: Path):
    """Regression: DuckDB shares one file handle between threads; through a plain fsspec file about one query in
    seven read bytes from another thread's offset and failed ("don't know what type", "Out of buffer"...)."""
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "sql_scale.py"), "--rows", "2000", "--out", str(tmp_path / "b")],
        check=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    run_dir = tmp_path / "b" / "bench"
    # Exact, order-independent aggregates over every byte of the big columns (float sums would depend on order).
    query = (
        "SELECT stage, count(*) AS n, sum(reward) AS reward, bit_xor(hash(response_token_ids)) AS tokens, "
        "bit_xor(hash(behavior_logprobs)) AS logprobs, bit_xor(hash(response_text)) AS text "
        "FROM {src} GROUP BY stage ORDER BY stage"
    )
    native = duckdb.sql(
        query.format(
            src=f"read_parquet('{run_dir}/rollouts/*/*.parquet', hive_partitioning = true, "
            "hive_types = {'stage': INTEGER})"
        )
    ).to_arrow_table()
    assert native.num_rows == 4
    with connect(str(run_dir)) as cat:
        for _ in range(40):
            assert cat.arrow(query.format(src="rollouts")).equals(native)


def test_positional_reader_keeps_a_position_per_thread(tmp_path: Path):
    """A seek on one thread must not move the offset another thread reads from (the race DuckDB runs into)."""
    data = bytes(range(256)) * 4
    (tmp_path / "f.bin").write_bytes(data)
    fs = ReadOnlyFileSystem(path=str(tmp_path), fs=fsspec.filesystem("file"))
    f = fs.open("f.bin", "rb")
    assert isinstance(f, PositionalReader) and f.size == len(data)
    seeked, other_done = threading.Event(), threading.Event()
    got = {}

    def first() -> None:
        f.seek(10)
        seeked.set()
        other_done.wait(5)
        got["first"] = f.read(5)

    def second() -> None:
        seeked.wait(5)
        f.seek(700)
        got["second"] = f.read(3)
        other_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == {"first": data[10:15], "second": data[700:703]}
    assert f.seek(-4, io.SEEK_END) == len(data) - 4 and f.read() == data[-4:] and f.tell() == len(data)
    f.close()
    with pytest.raises(PermissionError, match="read-only"):
        fs.open("f.bin", "wb")


def test_explain_of_a_read_still_runs_and_leaves_the_views(root: Path):
    with connect(str(root)) as cat:
        for query in (
            "EXPLAIN SELECT count(*) FROM rollouts",
            "EXPLAIN ANALYZE SELECT count(*) FROM rollouts",
            "/* plan */ EXPLAIN (ANALYZE, FORMAT json) SELECT count(*) FROM rollouts",
            "EXPLAIN ANALYZE SUMMARIZE rollouts",
        ):
            assert cat.arrow(query).num_rows >= 1, query
        with pytest.raises(ReadOnlyQueryError, match="DROP statement wrapped in EXPLAIN"):
            cat.arrow("EXPLAIN ANALYZE DROP VIEW rollouts")
        assert cat.arrow("SELECT count(*) FROM rollouts").column(0).to_pylist() == [48]  # the view is intact
