"""The verifier false-negative audit, over ``rollouts`` and ``evals``.

- ``verifier_audit``: per source (``rollouts`` of each stage, ``evals`` of each policy), the responses the reward
  called wrong and how many of those a looser reading would accept: the last number anywhere in the response equals
  a numeric gold (arXiv 2505.22203: rule-based verifiers' false negatives grow as the policy improves). A rise is a
  reason to read the responses (``verifier_audit_samples``), not a verdict: the strict format policy refuses an
  unboxed answer on purpose (docs/rewards.md).
- ``verifier_audit_samples``: those responses, one row each, with the loose reading.
"""

from __future__ import annotations

from mugrpo.sql.correctness import correctness_sql
from mugrpo.sql.views.base import Build

QUERIES = {
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
NAMES = tuple(QUERIES)


def create(build: Build) -> None:
    for name, query in QUERIES.items():
        build.view(name, query)
