"""What the report shows, queried once through the read-only SQL catalog (:mod:`mugrpo.sql`): :func:`collect`."""

from __future__ import annotations

from dataclasses import dataclass, field

from mugrpo.algorithms import excluding_columns
from mugrpo.commits.exclusion import training_rows_sql
from mugrpo.inspection.lineage import ForkInfo, collect_fork
from mugrpo.sql import connect
from mugrpo.sql.correctness import correctness_sql
from schemas.tables import TRAIN_STEP_V4_COLUMNS


@dataclass
class ReportData:
    run_id: str
    uri: str
    created_at: str | None
    stages: list[dict]
    rollouts_by_stage: list[dict]
    steps: list[dict]
    evals: list[dict]
    files: list[str]
    examples: list[dict] = field(default_factory=list)
    audit: list[dict] = field(default_factory=list)  # `mugrpo audit` rows of the run (mugrpo.audit)
    verifier_audit: list[dict] = field(default_factory=list)  # the `verifier_audit` SQL view (false negatives)
    corrections: list[dict] = field(default_factory=list)  # the `stage_corrections` SQL view (per stage)
    fork: ForkInfo | None = None  # a fork's parent and its paired differences (evals: the parent's for stages <= K)


#: The correctness of a rollout: its math_correctness, reasoning_gym_exact or reasoning_gym component (the first one
#: its reward has, :data:`mugrpo.sql.correctness.CORRECTNESS_COMPONENTS`).
CORRECTNESS = correctness_sql()
#: Example rollouts shown per stage (the first sample of the stage's first prompts by prompt id).
EXAMPLES_PER_STAGE = 3
#: train_steps columns of the health panel the report shows (docs/sql.md, "Health panel").
HEALTH_COLUMNS = TRAIN_STEP_V4_COLUMNS


def _rows(cat, query: str) -> list[dict]:
    return cat.arrow(query).to_pylist()


def collect(target: str, storage_options: dict | None = None) -> ReportData:
    """Query everything the report shows from one run folder (local path or URL).

    Raises:
        TargetError: the target is not one readable run, e.g. a table file of it does not fit its table's schema
            (:func:`mugrpo.sql.connect` refuses the run: the block names each file, what differs, how to recover).
    """
    with connect(target, storage_options) as cat:
        if len(cat.run_ids) != 1:
            raise ValueError(f"{target} holds {len(cat.run_ids)} runs; give one run folder (ROOT/RUN_ID)")
        run_id = cat.run_ids[0]
        runs = _rows(cat, "SELECT * FROM runs")
        # the training figures count only rows trained on (mugrpo.commits.exclusion: the declared excludes columns)
        trained = training_rows_sql(excluding_columns(), cat.sql("SELECT * FROM rollouts LIMIT 0").columns)
        stages = _rows(cat, "SELECT stage, t_gen, t_train, t_eval, t_switch, t_total FROM stages ORDER BY stage")
        by_stage = _rows(
            cat,
            f"""SELECT stage, count(*) AS rollouts, avg(reward) AS mean_reward,
                      avg(CASE WHEN {CORRECTNESS} >= 1 THEN 1 ELSE 0 END) AS accuracy,
                      avg({CORRECTNESS}) AS correctness,
                      avg(CASE WHEN reward_components['format'] > 0 THEN 1 ELSE 0 END) AS boxed_rate,
                      avg(num_tokens) AS mean_len, quantile_cont(num_tokens, 0.5) AS p50_len,
                      quantile_cont(num_tokens, 0.9) AS p90_len, max(num_tokens) AS max_len,
                      avg(CASE WHEN finish_reason = 'length' THEN 1 ELSE 0 END) AS truncated,
                      avg(CASE WHEN zero_variance THEN 1 ELSE 0 END) AS zero_var_frac,
                      min(policy_version) AS policy_version
               FROM rollouts WHERE {trained} GROUP BY stage ORDER BY stage""",
        )
        examples = _rows(
            cat,
            f"""SELECT stage, prompt_text, response_text, reward, ground_truth, {CORRECTNESS} AS correctness
               FROM rollouts WHERE {trained} AND sample_idx = 0
               QUALIFY row_number() OVER (PARTITION BY stage ORDER BY prompt_id) <= {EXAMPLES_PER_STAGE}
               ORDER BY stage, prompt_id""",
        )
        steps = _rows(
            cat,
            """SELECT "update", stage, loss, ratio_mean, ratio_mean_neg_adv, veto_token_frac, veto_response_frac,
                      clip_frac_high, approx_kl_behavior, grad_norm, mean_reward, tokens_per_second, staleness,
                      """
            + ", ".join(HEALTH_COLUMNS)
            + """ FROM train_steps ORDER BY "update" """,
        )
        evals = _rows(cat, EVALS_QUERY)
        verifier = _rows(cat, "SELECT * FROM verifier_audit ORDER BY source, stage")
        corrections = _rows(cat, "SELECT * FROM stage_corrections ORDER BY stage")
        uri = cat.target.url
    files = _parquet_files(target, storage_options, run_id)
    fork = collect_fork(target, storage_options, evals, EVALS_QUERY)
    if fork is not None:
        evals = fork[0]
    return ReportData(
        run_id,
        uri,
        str(runs[0].get("created_at")) if runs else None,
        stages,
        by_stage,
        steps,
        evals,
        files,
        examples,
        _audit_rows(target, storage_options, run_id),
        verifier,
        corrections,
        fork[1] if fork else None,
    )


#: Per policy and benchmark: the eval contract (``eval_scores``: avg@k with its 95% CI clustered by problem, pass@k,
#: maj@k) and the paired gain over the base policy (stage 0) on the same problems, with its 95% CI (arXiv 2411.00640).
EVALS_QUERY = """
    WITH diff AS (
        SELECT p.stage, p.benchmark, p.score - b.score AS d
        FROM eval_problems p JOIN eval_problems b USING (run_id, benchmark, prompt_id)
        WHERE b.stage = 0 AND p.stage > 0
    ), gains AS (
        SELECT stage, benchmark, avg(d) AS gain,
               avg(d) - 1.959963984540054 * stddev_samp(d) / sqrt(count(*)) AS gain_low,
               avg(d) + 1.959963984540054 * stddev_samp(d) / sqrt(count(*)) AS gain_high
        FROM diff GROUP BY ALL
    )
    SELECT s.stage, s.benchmark, s.problems, s.k, s.avg_at_k, s.ci95_low, s.ci95_high, s.pass_at_k, s.maj_at_k,
           g.gain, g.gain_low, g.gain_high
    FROM eval_scores s LEFT JOIN gains g USING (stage, benchmark)
    ORDER BY s.stage, s.benchmark"""


def _audit_rows(target: str, storage_options: dict | None, run_id: str) -> list[dict]:
    """The run's `mugrpo audit` rows (docs/audit.md); none for a folder whose run.json is missing or unreadable."""
    from mugrpo.audit import audit_runs, open_run
    from mugrpo.config import ConfigError
    from mugrpo.sql import TargetError

    parent = target.rstrip("/").rpartition("/")[0] or "."
    try:
        run = open_run(parent, run_id, storage_options)
    except (FileNotFoundError, KeyError, ConfigError, TargetError):  # no run.json, or no config it can load
        return []
    try:
        return [r.to_json() for r in audit_runs([run]).results]
    finally:
        run.catalog.close()


def _parquet_files(target: str, storage_options: dict | None, run_id: str) -> list[str]:
    """URIs of every committed Parquet file of the run (rollouts, train steps, evals), in layout order."""
    from mugrpo.storage.layout import RunLayout
    from mugrpo.storage.store import Store

    parent = target.rstrip("/").rpartition("/")[0] or "."
    store = Store(parent, storage_options)
    layout = RunLayout(run_id)
    out = []
    for table in ("rollouts", "train_steps", "evals"):
        folder = f"{layout.run_dir}/{table}"
        for part in store.listdir(folder):
            names = [n for n in store.listdir(f"{folder}/{part}") if n.endswith(".parquet")]
            out += [store.uri(f"{folder}/{part}/{n}") for n in names]
    return out
