"""The eval contract's derived views, over ``evals`` (their definitions are the formulas of
:mod:`mugrpo.evaluation.metrics`, which computes the same figures for the eval manifests).

- ``eval_problems``: one row per evaluated problem (run, policy stage, benchmark, prompt): its k samples, how many
  were correct, its score (avg@k of the problem) and whether its majority answer is correct (maj@k's vote: on the
  stripped extracted answer, ties to the lowest sample index).
- ``eval_scores``: one row per run, policy stage and benchmark: avg@k with its 95% CI clustered by problem
  (Miller 2024, arXiv 2411.00640; mean +- 1.96 stddev_samp(score) / sqrt(problems)), pass@1 and maj@k.
"""

from __future__ import annotations

from mugrpo.sql.views.base import Build

QUERIES = {
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
}
NAMES = tuple(QUERIES)


def create(build: Build) -> None:
    for name, query in QUERIES.items():
        build.view(name, query)
