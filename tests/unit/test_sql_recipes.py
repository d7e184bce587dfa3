"""Every recipe of docs/sql.md runs against runs whose stages were written by two schema versions: stage
0's rollouts and train steps in the oldest versions kept in ``schemas.OLDER_SCHEMAS``, stage 1's in the current
ones, as a run started by an older mugrpo and resumed by this one holds. The recipes are read from the page itself
(so what a user copies is what runs): the `mugrpo sql` command lines, the Python API block, every SQL query, the
DuckDB CLI line (run with DuckDB's Python API: the same engine) and the pandas / polars / pyarrow block. The plain
recipes also run on a run of the current version only. ``top_k`` / ``min_p`` of version-1 files read the same in
``mugrpo sql`` and in mugrpo's own reader.

Real Parquet files written with the real schemas, real DuckDB, pandas, polars and pyarrow, the real command line.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mugrpo.commits.manifest import new_manifest, write_manifest
from mugrpo.commits.tables import read_table
from mugrpo.sql import connect
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import META_TABLE, META_VERSION, OLDER_SCHEMAS, SCHEMA_VERSIONS, TABLES, FileRecord, StageTimings

REPO = Path(__file__).resolve().parents[2]
PAGE = (REPO / "docs" / "sql.md").read_text()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
PROMPTS, GROUP, UPDATES = 3, 4, 3
#: The oldest version of each table that has older versions: what stage 0 of a mixed run is written in.
OLDEST = {t: min(v for name, v in OLDER_SCHEMAS if name == t) for t, _ in OLDER_SCHEMAS}


def rollout_rows(run_id: str, stage: int) -> list[dict]:
    rows = []
    for p in range(PROMPTS):
        for i in range(GROUP):
            n = 5 + 7 * i + p
            correct = (i + p + stage) % 2 == 0
            rows.append(
                dict(
                    run_id=run_id, stage=stage, policy_version=stage * UPDATES, prompt_id=f"p{p}", sample_idx=i,
                    group_size=GROUP, prompt_text=f"What is {p} + {p}?", prompt_token_ids=list(range(10 + p)),
                    response_text=f"\\boxed{{{2 * p if correct else p}}}", response_token_ids=list(range(n)),
                    behavior_logprobs=[-0.1 * (j % 5) for j in range(n)], finish_reason="stop", num_tokens=n,
                    reward=float(correct), reward_components={"math_correctness": float(correct)},
                    reward_status="ok", ground_truth=str(2 * p), extracted_answer=str(p), advantage=0.5 - correct,
                    zero_variance=False, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=stage * 100 + i,
                    engine="transformers", created_at=T0 + timedelta(hours=stage), is_probe=False,
                )
            )  # fmt: skip
    return rows


def train_rows(run_id: str, stage: int) -> list[dict]:
    return [
        dict(
            run_id=run_id, stage=stage, update=stage * UPDATES + u, stage_update=u, policy_loss=0.1 / u, loss=0.1 / u,
            clip_frac_low=0.0, clip_frac_high=0.01, veto_token_frac=0.01 * u, veto_response_frac=0.1,
            trigger_count=1.0, ratio_mean=1.0, ratio_max=1.5, ratio_mean_neg_adv=0.9, approx_kl_behavior=0.001,
            kl_ref=None, entropy=0.8, grad_norm=1.0, lr=1e-5, num_sequences=4, num_tokens=4 * (20 + u), seconds=1.0,
            tokens_per_second=80.0, staleness=u - 1, mean_reward=0.5, created_at=T0 + timedelta(hours=stage, minutes=u),
            loss_metrics={"x": 1.0}, num_fresh=4, num_replayed=2, replay_age_mean=1.0, replay_age_max=2,
            replay_buffer_size=8, replay_evicted_age=0, replay_evicted_capacity=0,
            ess=1.0 - 0.1 * u, kl_sampler=0.001 * u, sampler_ratio_p1=0.9, sampler_ratio_p99=1.1, sampler_ratio_max=1.5,
            sampler_clip_frac=0.01, logit_var=2.0, s_eta=(u - 1) * 1e-5, t_eta=(stage * UPDATES + u) * 1e-5,
            batch_id=f"{stage:08x}{u:08x}",
        )
        for u in range(1, UPDATES + 1)
    ]  # fmt: skip


def eval_rows(run_id: str, stage: int) -> list[dict]:
    return [
        dict(
            run_id=run_id, stage=stage, benchmark="gsm8k", prompt_id=f"e{p}", sample_idx=0, k=1, prompt_text="q",
            response_text="\\boxed{1}", num_tokens=10, finish_reason="stop", ground_truth="1", extracted_answer="1",
            correct=p % 2 == 0, reward_status="ok", temperature=0.0, top_p=1.0, created_at=T0 + timedelta(hours=stage),
        )
        for p in range(4)
    ]  # fmt: skip


def replay_rows(run_id: str, stage: int) -> list[dict]:
    return [
        dict(
            run_id=run_id, stage=stage, update=stage * UPDATES + 1, stage_update=1, rollout_stage=stage - replayed,
            prompt_id="p0", sample_idx=0, replayed=bool(replayed), birth_update=(stage - replayed) * UPDATES,
            age=UPDATES * replayed, advantage=0.5, priority=0.7 if replayed else None,
        )
        for replayed in (0, 1)
    ]  # fmt: skip


def write_version(store: Store, rel: str, rows: list[dict], table: str, version: int) -> FileRecord:
    """Rows written as version ``version`` of ``table`` (an older one from ``schemas.OLDER_SCHEMAS``): the columns
    that version has, stamped with it, as that version's writer wrote them."""
    schema = TABLES[table] if version == SCHEMA_VERSIONS[table] else OLDER_SCHEMAS[(table, version)]
    data = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)
    data = data.replace_schema_metadata({META_TABLE: table.encode(), META_VERSION: str(version).encode()})
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, compression="zstd")
    raw = sink.getvalue().to_pybytes()
    return FileRecord(path=RunLayout(rel.split("/")[0]).rel(rel), sha256=store.write_bytes(rel, raw), bytes=len(raw))


def write_run(store: Store, run_id: str, *, mixed: bool) -> None:
    """Two committed stages; with ``mixed``, stage 0's rollouts and train steps in their oldest schema versions."""
    layout = RunLayout(run_id)
    store.write_json(layout.run_json, {"created_at": T0.isoformat(), "code_version": "0.0.9", "config": {"mu": 8}})
    for k in (0, 1):
        old = mixed and k == 0
        version = {t: (OLDEST.get(t, SCHEMA_VERSIONS[t]) if old else SCHEMA_VERSIONS[t]) for t in TABLES}
        rows = rollout_rows(run_id, k)
        shards = [(layout.rollout_shard(k, s), rows[s * GROUP : (s + 1) * GROUP]) for s in range(PROMPTS)]
        files = [write_version(store, rel, part, "rollouts", version["rollouts"]) for rel, part in shards]
        steps = train_rows(run_id, k)
        files.append(write_version(store, layout.train_steps_part(k, 0), steps, "train_steps", version["train_steps"]))
        files.append(write_version(store, layout.eval_file(k, "gsm8k"), eval_rows(run_id, k), "evals", 1))
        if k > 0:
            write_version(store, layout.table_part("replay", k, 1), replay_rows(run_id, k), "replay", 1)
        timings = StageTimings(t_gen=10.0, t_train=20.0, t_eval=5.0, t_switch=1.0, t_total=36.0)
        manifest = new_manifest(run_id, k, files, counts={"rollouts": len(rows)}, timings=timings)
        write_manifest(store, manifest.model_copy(update={"code_version": "0.0.9" if old else "0.1.0"}))


@pytest.fixture
def mixed_root(tmp_path: Path) -> Path:
    store = Store(str(tmp_path / "runs"))
    for run_id in ("grpo", "mugrpo"):
        write_run(store, run_id, mixed=True)
    return tmp_path / "runs"


@pytest.fixture
def current_root(tmp_path: Path) -> Path:
    store = Store(str(tmp_path / "current"))
    write_run(store, "exp1", mixed=False)
    return tmp_path / "current"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", PAGE, flags=re.S)


def plain_parquet_section() -> str:
    return PAGE[PAGE.index("## The files are plain Parquet") : PAGE.index("## Read-only")]


def test_the_mixed_run_really_mixes_versions(mixed_root: Path):
    versions = {
        (f.parent.name, pq.read_schema(f).metadata[META_VERSION].decode())
        for f in (mixed_root / "grpo" / "rollouts").rglob("*.parquet")
    }
    assert versions == {("stage=0", str(OLDEST["rollouts"])), ("stage=1", str(SCHEMA_VERSIONS["rollouts"]))}
    assert "top_k" not in pq.read_schema(next((mixed_root / "grpo/rollouts/stage=0").glob("*.parquet"))).names


def test_every_sql_query_of_the_page_runs_on_a_mixed_version_run(mixed_root: Path):
    queries = blocks("sql")
    assert len(queries) >= 15
    with connect(str(mixed_root)) as cat:
        for query in queries:
            assert cat.arrow(query).num_rows > 0, f"docs/sql.md query returned nothing on a mixed run:\n{query}"
        stages = cat.arrow("SELECT run_id, stage, code_version FROM stages ORDER BY ALL").to_pylist()
        assert [s["code_version"] for s in stages] == ["0.0.9", "0.1.0"] * 2


def test_the_python_api_block_runs(mixed_root: Path):
    block = next(b for b in blocks("python") if "from mugrpo.sql import connect" in b)
    remote = 'connect("s3://bucket/runs", {"endpoint_url": "http://127.0.0.1:9000"})'
    assert remote in block  # the page's example; run here on the local root (S3 is tested in test_sql.py)
    scope: dict = {}
    exec(block.replace(remote, f"connect({str(mixed_root)!r})"), scope)
    assert scope["table"].num_rows == 4 and isinstance(scope["rel"], duckdb.DuckDBPyRelation)


def test_the_command_lines_of_the_page_run(tmp_path: Path):
    """Every local `mugrpo sql` line of the first block (the S3 one is tested against moto in test_sql.py)."""
    lines = [ln.split("  #")[0].strip() for ln in blocks("sh")[0].splitlines() if ln.startswith("mugrpo sql runs")]
    assert len(lines) >= 5
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    work = tmp_path / "cwd"
    write_run(Store(str(work / "runs")), "exp1", mixed=True)  # the page's run id, in ./runs
    for line in lines:
        out = subprocess.run(
            ["bash", "-c", line], cwd=work, env=env, input="SELECT count(*) AS n FROM rollouts;\n",
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, f"{line}\n{out.stdout}\n{out.stderr}"
        assert out.stdout.strip() or (work / "steps.csv").exists(), line
    assert pq.read_table(work / "worst.parquet").num_rows > 0
    assert (work / "steps.csv").read_text().startswith("run_id,stage,")


def plain_recipes(run: Path) -> dict:
    section = plain_parquet_section()
    line = next(ln for ln in section.splitlines() if ln.startswith("duckdb -c"))
    query = shlex.split(line)[2].replace("runs/exp1", str(run))
    by_stage = duckdb.connect().sql(query).fetchall()
    code = next(b for b in blocks("python") if "import pandas as pd" in b).replace("runs/exp1", str(run))
    scope: dict = {}
    exec(code, scope)
    return {"duckdb": by_stage, **scope}


@pytest.mark.parametrize("which", ["mixed", "current"])
def test_the_plain_parquet_recipes_read_every_row_and_every_column(mixed_root: Path, current_root: Path, which):
    run = mixed_root / "grpo" if which == "mixed" else current_root / "exp1"
    got = plain_recipes(run)
    assert [(stage, n) for stage, n, _ in got["duckdb"]] == [(0, PROMPTS * GROUP), (1, PROMPTS * GROUP)]
    every = set(TABLES["rollouts"].names)
    total = 2 * PROMPTS * GROUP
    pandas_frame, polars_frame, arrow_table = got["rollouts_pd"], got["rollouts_pl"], got["rollouts_pa"]
    assert set(pandas_frame.columns) == every and len(pandas_frame) == total
    assert set(polars_frame.columns) == every and polars_frame.height == total
    assert set(arrow_table.column_names) == every and arrow_table.num_rows == total
    assert sorted(set(pandas_frame["stage"])) == [0, 1]
    stage0_top_k = arrow_table.filter(pa.compute.equal(arrow_table["stage"], 0))["top_k"].to_pylist()
    # A plain reader sees NULL where a version-1 file has no top_k (docs/sql.md says so); a current file has 0.
    assert set(stage0_top_k) == ({None} if which == "mixed" else {0})


def test_top_k_and_min_p_of_older_files_read_the_same_in_sql_and_in_mugrpos_reader(mixed_root: Path):
    store = Store(str(mixed_root))
    own = [
        row
        for f in sorted((mixed_root / "grpo" / "rollouts").rglob("*.parquet"))
        for row in read_table(store, f.relative_to(mixed_root).as_posix(), "rollouts")
        .select(["stage", "top_k", "min_p"])
        .to_pylist()
    ]
    assert {(r["top_k"], r["min_p"]) for r in own} == {(0, 0.0)}
    with connect(str(mixed_root / "grpo")) as cat:
        sql = cat.arrow("SELECT stage, top_k, min_p FROM rollouts").to_pylist()
        assert cat.arrow("SELECT count(*) AS n FROM rollouts WHERE top_k = 0 AND min_p = 0").to_pylist() == [
            {"n": len(own)}
        ]
        types = dict(cat.views()["rollouts"])
    assert sorted(map(tuple, (r.values() for r in sql))) == sorted(map(tuple, (r.values() for r in own)))
    assert types["top_k"] == "INTEGER" and types["min_p"] == "FLOAT"
