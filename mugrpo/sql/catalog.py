"""Read-only DuckDB views over the Parquet tables and manifests of one run or a root of runs.

    from mugrpo.sql import connect
    with connect("runs/exp1") as cat:                       # or connect("s3://bucket/runs", {"endpoint_url": ...})
        cat.arrow("SELECT stage, avg(reward) FROM rollouts GROUP BY stage ORDER BY stage")

Views (one set per connection, over the files committed when it was opened; :func:`connect` again to see new ones):

- ``rollouts``, ``train_steps``, ``evals``: the Parquet files as written (``schemas.tables``), read with Hive
  partitioning so ``stage`` is an INTEGER column; token lists stay ``INTEGER[]``/``FLOAT[]`` lists.
- ``replay``: with the replay buffer on (``replay.enabled``), one row per rollout used by an update, fresh or
  replayed (``schemas.tables.REPLAY_SCHEMA``): which rollout was used by which update, at what age.
- ``stages``: one row per committed stage manifest (``schemas.STAGE_VIEW_SCHEMA``).
- ``eval_problems``: one row per evaluated problem (run, policy stage, benchmark, prompt): its k samples, how many
  were correct, its score (avg@k of the problem) and whether its majority answer is correct (maj@k's vote).
- ``eval_scores``: one row per run, policy stage and benchmark: avg@k with its 95% CI clustered by problem
  (Miller 2024, arXiv 2411.00640), pass@1 and maj@k (:mod:`mugrpo.evaluation.metrics` computes the same figures
  for the eval manifests).
- ``verifier_audit``: per source (``rollouts`` of each stage, ``evals`` of each policy), the responses the reward
  called wrong and how many of those a looser reading would accept: the last number anywhere in the response equals
  a numeric gold (arXiv 2505.22203: rule-based verifiers' false negatives grow as the policy improves). A rise is a
  reason to read the responses (``verifier_audit_samples``), not a verdict: the strict format policy refuses an
  unboxed answer on purpose (docs/rewards.md).
- ``verifier_audit_samples``: those responses, one row each, with the loose reading.
- ``runs``: one row per run: ``run.json`` fields (NULL when it is absent) and counts of committed stages and files.
- ``rescores``: one row per rollout re-scored by ``mugrpo rescore`` (:mod:`mugrpo.orchestration.rescore`): the
  re-scoring's ``name``, its reward, components, status, extracted answer, group advantage, and the stored
  ``old_reward``.
- ``reward_flips``: each re-scored rollout beside its stored row (response, gold, both extracted answers) and its
  ``flip``: ``false_negative`` (new reward higher), ``false_positive`` (lower), NULL (equal).
- ``lineage``: one row per run: a fork's parent, fork stage and changed keys (:mod:`mugrpo.sql.lineage`; NULL for
  a run of its own).

A view over a table with no file yet is empty but has the table's columns, so queries never fail for lack of data.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any

import duckdb
import pyarrow as pa
from pydantic import TypeAdapter, ValidationError

from mugrpo.sql.discover import TABLE_FILES, Target, TargetError, resolve_target
from mugrpo.sql.lineage import lineage_rows
from mugrpo.sql.readonly import (
    PROTOCOL,
    ReadOnlyFileSystem,
    SqlError,
    check_statements,
    lock_down,
    sql_string,
)
from mugrpo.sql.redact import Redactor
from mugrpo.sql.schema_check import Misfit, misfit_files, refusal
from schemas import OLDER_DEFAULTS, OLDER_SCHEMAS, STAGE_VIEW_SCHEMA, TABLES, StageManifest

log = logging.getLogger(__name__)

#: One row per run (the ``runs`` view; ``config`` is exposed as DuckDB JSON).
#: The reward components that say whether a rollout's answer is right, most exact first: math-verify's
#: ``math_correctness``, the reasoning-gym task's ``reasoning_gym_exact`` (1 only when exact), then its
#: ``reasoning_gym`` score (partial credit below 1). A run's reward has one of them (mugrpo.rewards registers them).
CORRECTNESS_COMPONENTS = ("math_correctness", "reasoning_gym_exact", "reasoning_gym")


def correctness_sql(default: str | None = None) -> str:
    """The SQL expression of a rollout's correctness: the first of :data:`CORRECTNESS_COMPONENTS` its
    ``reward_components`` map holds, else ``default`` (a SQL literal; None: NULL)."""
    terms = [f"reward_components['{name}']" for name in CORRECTNESS_COMPONENTS]
    return f"coalesce({', '.join(terms + ([default] if default is not None else []))})"


RUNS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("uri", pa.string()),  # the run folder's URL (no credentials)
        pa.field("created_at", pa.timestamp("us", tz="UTC")),  # run.json "created_at"
        pa.field("code_version", pa.string()),  # run.json "code_version"
        pa.field("config", pa.string()),  # run.json "config" (else the whole document), JSON text
        pa.field("stages_committed", pa.int32()),  # stage manifests present
        pa.field("last_stage", pa.int32()),  # highest committed stage, NULL if none
        pa.field("rollout_files", pa.int32()),
        pa.field("train_step_files", pa.int32()),
        pa.field("eval_files", pa.int32()),
    ]
)

#: Every view a catalog defines, in the order ``.tables`` lists them.
VIEWS = (
    *TABLE_FILES,
    "stages",
    "runs",
    "lineage",
    "eval_problems",
    "eval_scores",
    "verifier_audit_samples",
    "verifier_audit",
    "stage_corrections",
    "rescores",
    "reward_flips",
)

#: ``reward_flips``: each re-scored rollout beside its stored row. A flip is a changed reward: ``false_negative``
#: where the re-scoring's reward is higher (the run's verifier under-credited the rollout), ``false_positive`` where
#: it is lower, NULL where they are equal (:func:`mugrpo.orchestration.rescore.flip_kind`).
REWARD_FLIPS_VIEW = """
    SELECT s.run_id, s.stage, s.name, s.prompt_id, s.sample_idx, s.old_reward, s.reward AS new_reward,
           CASE WHEN s.reward > s.old_reward THEN 'false_negative'
                WHEN s.reward < s.old_reward THEN 'false_positive' END AS flip,
           r.response_text, r.ground_truth, r.extracted_answer, s.extracted_answer AS new_extracted_answer
    FROM rescores s LEFT JOIN rollouts r
      ON r.run_id = s.run_id AND r.stage = s.stage AND r.prompt_id = s.prompt_id AND r.sample_idx = s.sample_idx
     AND coalesce(r.is_probe, false) = s.excluded"""

#: The eval contract's derived views, over ``evals`` (their definitions are the formulas of
#: :mod:`mugrpo.evaluation.metrics`: maj@k votes on the stripped extracted answer, ties to the lowest sample index;
#: the CI is mean +- 1.96 stddev_samp(score) / sqrt(problems)).
EVAL_VIEWS = {
    "eval_problems": """
        WITH votes AS (
            SELECT run_id, stage, benchmark, prompt_id, trim(extracted_answer) AS answer, count(*) AS n,
                   min(sample_idx) AS first, bool_or(correct) AS correct
            FROM evals WHERE coalesce(trim(extracted_answer), '') <> ''
            GROUP BY ALL
        ), winners AS (
            SELECT run_id, stage, benchmark, prompt_id, arg_max(correct, n * 1000000 - first) AS maj_correct
            FROM votes GROUP BY ALL
        )
        SELECT e.run_id, e.stage, e.benchmark, e.prompt_id, count(*) AS k,
               sum(CASE WHEN e.correct THEN 1 ELSE 0 END) AS num_correct,
               avg(CASE WHEN e.correct THEN 1.0 ELSE 0.0 END) AS score,
               coalesce(any_value(w.maj_correct), false) AS maj_correct
        FROM evals e LEFT JOIN winners w USING (run_id, stage, benchmark, prompt_id)
        GROUP BY ALL""",
    "eval_scores": """
        SELECT run_id, stage, benchmark, count(*) AS problems, max(k) AS k, avg(score) AS avg_at_k,
               greatest(avg(score) - 1.959963984540054 * stddev_samp(score) / sqrt(count(*)), 0.0) AS ci95_low,
               least(avg(score) + 1.959963984540054 * stddev_samp(score) / sqrt(count(*)), 1.0) AS ci95_high,
               avg(CASE WHEN maj_correct THEN 1.0 ELSE 0.0 END) AS maj_at_k,
               avg(CASE WHEN num_correct > 0 THEN 1.0 ELSE 0.0 END) AS pass_at_k
        FROM eval_problems GROUP BY ALL""",
    # Wrong by the reward (its correctness component < 1, the verifier answered), right by a looser reading: the
    # last number of the response text (thousands separators dropped) equals the numeric gold within 1e-6 relative.
    "verifier_audit_samples": """
        WITH wrong AS (
            SELECT 'rollouts' AS source, run_id, stage, prompt_id, sample_idx, response_text, ground_truth,
                   extracted_answer
            FROM rollouts
            WHERE reward_status = 'ok'
              AND {correctness} < 1.0
            UNION ALL
            SELECT 'evals', run_id, stage, prompt_id, sample_idx, response_text, ground_truth, extracted_answer
            FROM evals WHERE reward_status = 'ok' AND NOT correct
        ), readings AS (
            SELECT *,
                   TRY_CAST(replace(list_last(regexp_extract_all(response_text, '-?[0-9][0-9,]*(?:[.][0-9]+)?')),
                                    ',', '') AS DOUBLE) AS loose_answer,
                   TRY_CAST(replace(trim(ground_truth), ',', '') AS DOUBLE) AS numeric_gold
            FROM wrong
        )
        SELECT *, coalesce(numeric_gold IS NOT NULL AND loose_answer IS NOT NULL
                           AND abs(loose_answer - numeric_gold) <= 1e-6 * greatest(1.0, abs(numeric_gold)), false)
                  AS loose_accepts
        FROM readings""".replace("{correctness}", correctness_sql("1.0")),
    "verifier_audit": """
        SELECT source, run_id, stage, count(*) AS wrong, count(numeric_gold) AS numeric_gold,
               count(*) FILTER (WHERE loose_accepts) AS loose_accepts,
               count(*) FILTER (WHERE loose_accepts) / nullif(count(numeric_gold), 0) AS loose_accept_rate
        FROM verifier_audit_samples GROUP BY ALL""",
}
#: Derived views over ``train_steps``. ``stage_corrections``: per run and stage, what the policy loss's correction of
#: stale data did, averaged over the stage's updates: the loss (``runs.config``), the PPO-style clip fraction
#: (``clip_frac_low + clip_frac_high``), the veto's token fraction, the stale-data corrections' generic metrics
#: (``loss_metrics``: the fraction of units they masked and of weights they truncated, and the ESS of the weights
#: they applied, w_mean^2 / w_sq_mean per update, mugrpo.losses.stale.common; NULL for a loss that reports none) and
#: the health panel's ESS against the sampler (``ess``).
TRAIN_VIEWS = {
    "stage_corrections": """
        WITH steps AS (
            SELECT run_id, stage, clip_frac_low + clip_frac_high AS clip_frac, veto_token_frac, ess,
                   loss_metrics['correction_masked_frac'] AS masked_frac,
                   loss_metrics['correction_clipped_frac'] AS weight_clipped_frac,
                   CASE WHEN loss_metrics['correction_w_sq_mean'] > 0
                        THEN loss_metrics['correction_w_mean'] ^ 2 / loss_metrics['correction_w_sq_mean']
                        WHEN loss_metrics['correction_w_sq_mean'] = 0 THEN 0.0 END AS correction_ess
            FROM train_steps
        )
        SELECT s.run_id, s.stage, any_value(json_extract_string(r.config, '$.loss.name')) AS loss,
               count(*) AS updates, avg(s.clip_frac) AS clip_frac, avg(s.veto_token_frac) AS veto_token_frac,
               avg(s.masked_frac) AS masked_frac, avg(s.weight_clipped_frac) AS weight_clipped_frac,
               avg(s.correction_ess) AS correction_ess, min(s.correction_ess) AS correction_ess_min,
               avg(s.ess) AS sampler_ess
        FROM steps s LEFT JOIN runs r USING (run_id)
        GROUP BY s.run_id, s.stage""",
}
#: Prefix of the registered Arrow tables behind the manifest views and empty placeholders. The database holds no
#: base table at all, so even a data-modifying CTE (``WITH x AS (INSERT ...) SELECT``) has nothing to write to.
_INTERNAL = "_mugrpo"
_datetime = TypeAdapter(datetime | None)


def _read_all(target: Target, rels: list[str]) -> dict[str, bytes]:
    """Bytes of each file (one concurrent batch on S3)."""
    if not rels:
        return {}
    store = target.store
    full = {store.full(r): r for r in rels}
    data = store.fs.cat(list(full), on_error="raise")
    return {full[p]: b for p, b in data.items()}


def _stage_rows(target: Target) -> pa.Table:
    owners = {rel: run_id for run_id, files in target.runs.items() for rel in files.manifests.values()}
    rows = []
    for rel, data in sorted(_read_all(target, list(owners)).items()):
        try:
            m = StageManifest.model_validate_json(data)
        except ValidationError as e:
            raise TargetError(f"{target.store.uri(rel)} is not a valid stage manifest: {e}") from None
        rows.append(
            {
                "run_id": owners[rel],  # a fork's inherited stage is its stage too (the manifest names the parent)
                "inherited_from": m.run_id if m.run_id != owners[rel] else None,
                "stage": m.stage,
                "status": m.status,
                "created_at": m.created_at,
                "num_files": len(m.files),
                "counts": list(m.counts.items()),
                "metrics": list(m.metrics.items()),
                **m.timings.model_dump(),
                "code_version": m.code_version,
                "job_code_versions": list(m.job_code_versions.items()),
            }
        )
    return pa.Table.from_pylist(rows, schema=STAGE_VIEW_SCHEMA)


def _run_docs(target: Target) -> dict[str, dict[str, Any]]:
    """Run id -> its parsed run.json (``{}`` when absent), for the ``runs`` and ``lineage`` views."""
    run_json = _read_all(target, [f.run_json for f in target.runs.values() if f.run_json])
    docs: dict[str, dict[str, Any]] = {}
    for run_id, files in target.runs.items():
        docs[run_id] = {}
        if files.run_json:
            try:
                docs[run_id] = json.loads(run_json[files.run_json])
                _datetime.validate_python(docs[run_id].get("created_at"))
            except (json.JSONDecodeError, AttributeError, ValidationError) as e:
                raise TargetError(
                    f"{target.store.uri(files.run_json)} is not a valid run.json (a JSON object with an ISO "
                    f"created_at): {e}"
                ) from None
    return docs


def _run_rows(target: Target, docs: dict[str, dict[str, Any]]) -> pa.Table:
    rows = []
    for run_id, files in target.runs.items():
        doc = docs[run_id]
        created_at = _datetime.validate_python(doc.get("created_at"))
        code_version = doc.get("code_version")
        config = doc.get("config", doc) if doc else None
        stages = sorted(files.manifests)
        rows.append(
            {
                "run_id": run_id,
                "uri": target.store.uri(run_id),
                "created_at": created_at,
                "code_version": None if code_version is None else str(code_version),
                "config": None if config is None else json.dumps(config, sort_keys=True),
                "stages_committed": len(stages),
                "last_stage": stages[-1] if stages else None,
                "rollout_files": len(files.tables["rollouts"]),
                "train_step_files": len(files.tables["train_steps"]),
                "eval_files": len(files.tables["evals"]),
            }
        )
    return pa.Table.from_pylist(rows, schema=RUNS_SCHEMA)


def _create_rescore_views(con: duckdb.DuckDBPyConnection, target: Target) -> None:
    """``rescores`` (every ``rescores/NAME/stage=k/shard=*.parquet`` of the target's runs, written by ``mugrpo
    rescore``; empty with its columns when there is none) and ``reward_flips`` over it and ``rollouts``."""
    from mugrpo.orchestration.rescore import RESCORE_SCHEMA

    paths = [p for files in target.runs.values() for p in files.rescores]
    empty = _register(con, "empty_rescores", RESCORE_SCHEMA.empty_table())
    source = empty
    if paths:  # the `stage` folder is the only key=value one: the name folder is a column of the files
        files = ", ".join(sql_string(f"{PROTOCOL}://{p}") for p in paths)
        source = f"read_parquet([{files}], hive_partitioning = true, hive_types = {{'stage': INTEGER}})"
    con.execute(f"CREATE VIEW rescores AS SELECT * FROM {source}")
    con.execute(f"CREATE VIEW reward_flips AS {REWARD_FLIPS_VIEW}")


def _register(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> str:
    """Expose an Arrow table to SQL under an internal name (read-only: DuckDB cannot insert into it); returns it."""
    internal = f"{_INTERNAL}_{name}"
    con.register(internal, table)
    return internal


def _parquet_source(paths: list[str], table: str) -> str:
    files = ", ".join(sql_string(f"{PROTOCOL}://{p}") for p in paths)
    # The files also hold a `stage` column; Hive partitioning types the folder's value the same way. A table with
    # readable older versions (schemas.OLDER_SCHEMAS) is read by column name, so an older file's missing columns are
    # NULL; that reads every file's footer when the view is created, so only those tables pay for it.
    by_name = ", union_by_name = true" if _has_older_versions(table) else ""
    return f"read_parquet([{files}], hive_partitioning = true, hive_types = {{'stage': INTEGER}}{by_name})"


def _has_older_versions(table: str) -> bool:
    return any(t == table for t, _ in OLDER_SCHEMAS)


_DUCKDB_TYPES = {pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE"}


def _with_older_defaults(source: str, table: str) -> str:
    """``source`` with the columns older files lack filled as mugrpo's own reader fills them
    (``schemas.OLDER_DEFAULTS``: v1 rollouts' ``top_k`` / ``min_p`` are 0, off), so ``mugrpo sql`` and
    :func:`mugrpo.commits.tables.read_table` agree. Current files hold no NULL there (the columns are not nullable)."""
    fills = [
        f"coalesce({col}, CAST({value!r} AS {_DUCKDB_TYPES[TABLES[table].field(col).type]})) AS {col}"
        for (name, col), value in OLDER_DEFAULTS.items()
        if name == table
    ]
    return f"(SELECT * REPLACE ({', '.join(fills)}) FROM {source})" if fills else source


class RunCatalog:
    """A locked, read-only DuckDB connection with the views of one target. Build it with :func:`connect`.

    Attributes:
        target: the resolved target (store, runs and their files).
        misfits: table files of a root's runs left out of the views because they do not fit their table's schema
            (:mod:`mugrpo.sql.schema_check`; over one run, :func:`connect` refuses them instead).
        duckdb_connection: the underlying connection. Using it directly skips the statement check, but DuckDB's
            own locks (see :mod:`mugrpo.sql.readonly`) still refuse every write.
    """

    def __init__(
        self, target: Target, con: duckdb.DuckDBPyConnection, redact: Redactor, misfits: list[Misfit] | None = None
    ):
        self.target = target
        self.duckdb_connection = con
        self.misfits = list(misfits or [])
        self._redact = redact

    @property
    def run_ids(self) -> list[str]:
        """Runs in the target, sorted."""
        return list(self.target.runs)

    def views(self) -> dict[str, list[tuple[str, str]]]:
        """``{view: [(column, DuckDB type), ...]}`` for every view."""
        out = {}
        for view in VIEWS:
            rel = self.duckdb_connection.sql(f"SELECT * FROM {view}")
            out[view] = [(c, str(t)) for c, t in zip(rel.columns, rel.types, strict=True)]
        return out

    def _error(self, e: BaseException) -> SqlError:
        return SqlError(self._redact(str(e)))

    def statements(self, query: str) -> list[duckdb.Statement]:
        """The statements of ``query``, after the read-only check (raises ReadOnlyQueryError / SqlError)."""
        return check_statements(self.duckdb_connection, query)

    def sql(self, query: str) -> duckdb.DuckDBPyRelation:
        """Run one read-only statement; returns DuckDB's relation (lazy: rows are read when fetched).

        Raises:
            ReadOnlyQueryError: the statement is not a query.
            SqlError: several statements, or it does not parse or bind. Messages never contain credentials.
        """
        statements = self.statements(query)
        if len(statements) != 1:
            raise SqlError(f"expected one statement, got {len(statements)}; run them one at a time")
        return self._relation(statements[0])

    def _relation(self, statement: duckdb.Statement) -> duckdb.DuckDBPyRelation:
        try:
            return self.duckdb_connection.sql(statement)
        except (duckdb.Error, OSError) as e:
            raise self._error(e) from None

    def arrow(self, query: str) -> pa.Table:
        """Run one read-only statement and return its result as an Arrow table (same errors as :meth:`sql`)."""
        return self._fetch(self.sql(query))

    def _fetch(self, rel: duckdb.DuckDBPyRelation) -> pa.Table:
        try:
            return rel.to_arrow_table()
        except (duckdb.Error, OSError) as e:
            raise self._error(e) from None

    def run_script(self, query: str) -> Iterator[tuple[str, pa.Table]]:
        """Check every statement of ``query`` now (raises as :meth:`sql`), then run them in order as iterated.

        Yields:
            (statement text, result) per statement; a failing one raises SqlError when reached.
        """
        statements = self.statements(query)
        return ((st.query.strip(), self._fetch(self._relation(st))) for st in statements)

    def close(self) -> None:
        self.duckdb_connection.close()

    def __enter__(self) -> RunCatalog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunCatalog({self.target.url!r}, runs={self.run_ids})"


def connect(target: str, storage_options: dict[str, Any] | None = None) -> RunCatalog:
    """Open a read-only SQL catalog over a run folder or a root of runs (local path or fsspec URL).

    Args:
        target: ``ROOT/RUN_ID`` (one run) or ``ROOT`` (every run below it), e.g. ``runs/exp1``, ``s3://bucket/runs``.
        storage_options: fsspec options for S3 etc. (``endpoint_url``, ``key``, ``secret``...). Credentials are
            never written into SQL, errors or logs; prefer the environment (``AWS_ACCESS_KEY_ID``...).

    Returns:
        a :class:`RunCatalog` whose views are ``rollouts``, ``train_steps``, ``evals``, ``replay``, ``stages``,
        ``runs``, ``lineage`` and the derived views of :data:`VIEWS`.

    Raises:
        TargetError: the target is missing, holds no run, a manifest/run.json is invalid, or it is one run with a
            table file that does not fit its table's schema (names each such file, what differs, how to recover).
    """
    redact = Redactor(storage_options)
    try:
        tgt = resolve_target(target, storage_options)
    except TargetError as e:
        raise TargetError(redact(str(e))) from None
    except (OSError, ValueError) as e:
        raise TargetError(redact(f"cannot open {target}: {e}")) from None
    # A table file that does not fit its table's schema is never read (docs/sql.md, "Files that do not fit their
    # table"): one run is refused, naming each; a root leaves them out of its views (the command line warns).
    misfits = [replace(m, reason=redact(m.reason)) for m in misfit_files(tgt.store, tgt.runs)]
    if misfits and tgt.single_run:
        raise TargetError(redact(refusal(misfits, tgt.store.uri(tgt.scope))))
    # Every file read goes through ReadOnlyFileSystem, whose file handles keep a position per thread: DuckDB shares
    # one handle between its threads (see readonly.PositionalReader), so the default thread count is safe.
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    try:
        con.register_filesystem(ReadOnlyFileSystem(path=tgt.store.root, fs=tgt.store.fs))
        con.execute("SET parquet_metadata_cache = true")  # files are immutable once committed
        left_out = {m.rel for m in misfits}
        for table in TABLE_FILES:
            paths = [p for files in tgt.runs.values() for p in files.tables[table] if p not in left_out]
            empty = _register(con, f"empty_{table}", TABLES[table].empty_table())
            source = _parquet_source(paths, table) if paths else empty
            if paths and _has_older_versions(table):  # files of older versions only: still the current columns
                source = f"(SELECT * FROM {empty} UNION ALL BY NAME SELECT * FROM {source})"
                source = _with_older_defaults(source, table)
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM {source}")
        _create_rescore_views(con, tgt)
        con.execute(f"CREATE VIEW stages AS SELECT * FROM {_register(con, 'stages', _stage_rows(tgt))}")
        docs = _run_docs(tgt)
        runs = _register(con, "runs", _run_rows(tgt, docs))
        con.execute(f"CREATE VIEW runs AS SELECT * REPLACE (config::JSON AS config) FROM {runs}")
        try:
            family = lineage_rows(docs, {r: tgt.store.uri(f.run_json or r) for r, f in tgt.runs.items()})
        except ValueError as e:
            raise TargetError(str(e)) from None
        con.execute(f"CREATE VIEW lineage AS SELECT * FROM {_register(con, 'lineage', family)}")
        for name, query in {**EVAL_VIEWS, **TRAIN_VIEWS}.items():
            con.execute(f"CREATE VIEW {name} AS {query}")
        lock_down(con, f"{PROTOCOL}://{tgt.scope}/" if tgt.scope else f"{PROTOCOL}://")
    except TargetError:
        con.close()
        raise
    except (duckdb.Error, OSError) as e:
        con.close()
        raise TargetError(redact(f"cannot open {target}: {e}")) from None
    log.debug("sql catalog over %s: runs %s, files that do not fit %s", tgt.url, list(tgt.runs), misfits)
    return RunCatalog(tgt, con, redact, misfits)
