"""``stage_corrections``, over ``train_steps`` and ``runs``: per run and stage, what the policy loss's correction of
stale data did, averaged over the stage's updates: the loss (``runs.config``), the PPO-style clip fraction
(``clip_frac_low + clip_frac_high``), the veto's token fraction, the stale-data corrections' generic metrics
(``loss_metrics``: the fraction of units they masked and of weights they truncated, and the ESS of the weights they
applied, w_mean^2 / w_sq_mean per update, mugrpo.losses.stale.common; NULL for a loss that reports none) and the
health panel's ESS against the sampler (``ess``).
"""

from __future__ import annotations

from mugrpo.sql.views.base import Build

NAMES = ("stage_corrections",)

QUERY = """
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
        GROUP BY s.run_id, s.stage"""


def create(build: Build) -> None:
    build.view("stage_corrections", QUERY)
