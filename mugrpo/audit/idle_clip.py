"""Idle clip ("Probe the Harness", arXiv 2610.02911): a ratio taken against the learner's own recompute is always 1,
so the clip never acts and a healthy-looking log hides an on-policy run.

Rule, over the run's ``train_steps`` (ratio = pi_theta / pi_behavior, logged per update as ``ratio_mean`` and
``ratio_max``; TOL = 1e-4, MAX_TOL = 1e-3):

1. At stage update 1 of every stage, ``|ratio_mean - 1| <= TOL`` and ``|ratio_max - 1| <= MAX_TOL``: the policy
   being updated is the behavior policy. Updates that train on replayed rollouts (``num_replayed > 0``, whose
   behavior policy is older) are left out of this part. The largest ratio gets the looser bound because it is one
   token's fp32 mismatch between the sampler (incremental decoding with a KV cache) and the learner (one forward
   over the whole sequence), which grows with sharper logits: on the lab policy it reached 1.6e-4 at a stage's
   first update (ratio_mean - 1 = 2.4e-7, approx KL to the behavior policy 1.5e-11) after 64 updates of
   ``geo_mask`` (bench/staleness.py's frontier, docs/benchmarks.md). A policy that is not the behavior policy is far
   beyond it: after one update, ratio_max - 1 was at least 2.4e-2 in every one of 102 stages measured there.
2. In every stage with mu > 1 (more than one update) whose updates before the last took a step (some
   ``grad_norm > 1e-8`` with ``lr > 0``), the updates after the first are not all at ratio 1: at least one has
   ``|ratio_mean - 1| > TOL`` or ``|ratio_max - 1| > TOL``. A stage that never stepped (e.g. every advantage 0: the
   policy cannot move) and a run whose stages all have mu = 1 are not checked.
3. The clip acts when a token it bounds leaves the clip range: on every update whose ``ratio_max_pos_adv`` (the
   largest ratio among kept tokens with A > 0, a loss metric in ``loss_metrics``) exceeds the loss's upper clip
   bound (the clip range the loss declares in its registry, :func:`mugrpo.losses.loss_clip_range`: ``1 + eps_high``
   for grpo, ``ratio_max`` for mu_grpo; per-group ranges such as AGPO's are not checked) by more than CLIP_TOL,
   ``clip_frac_high`` is > 0. This is exact, not evidence: the upper clip acts on exactly those tokens. A run in
   which no A > 0 token reached the bound is too short to clip, and a run written before the metric existed (NULL)
   cannot tell its A > 0 tokens from the rest (``ratio_max`` above the bound may be A < 0 tokens only, which the
   upper bound never clips): that part is then not checked (the row says so).

A run whose learner temperature differs from its sampling temperature (``train.learner_temperature``, arXiv
2609.36953) has update-1 ratios off 1 by design: part 1 is not checked for it (the row says so).
"""

from __future__ import annotations

from mugrpo.audit.result import FAIL, NOT_CHECKED, PASS, AuditRun, CheckResult

NAME = "idle-clip"
TOL = 1e-4
#: Bound on ``|ratio_max - 1|`` at a stage's first update: one token's fp32 sampler/learner mismatch (module docstring).
MAX_TOL = 1e-3
#: A step smaller than this gradient norm cannot be told from no step.
STEP_EPS = 1e-8
#: Slack above the clip bound: the loss compares fp32 ratios with an fp32 bound, the audit float64 values.
CLIP_TOL = 1e-5


def _upper_clip(loss) -> float | None:
    """The loss's declared upper clip bound as one number, or None (no clip range, or per-group ranges)."""
    from mugrpo.losses import loss_clip_range

    bounds = loss_clip_range(loss)
    return bounds[1] if bounds is not None and isinstance(bounds[1], float) else None


def _cooled_learner(cfg) -> bool:
    """The learner's temperature differs from the sampler's, so stage-first ratios are not 1 by design."""
    learner = cfg.train.learner_temperature
    return learner is not None and learner != cfg.generation.sampling.temperature


def _off(row: dict) -> float:
    return max(abs(row["ratio_mean"] - 1.0), abs(row["ratio_max"] - 1.0))


def _not_behavior(row: dict) -> bool:
    """A stage's first update whose ratios say the policy updated is not the behavior policy (rule 1)."""
    return abs(row["ratio_mean"] - 1.0) > TOL or abs(row["ratio_max"] - 1.0) > MAX_TOL


def check_run(run: AuditRun) -> CheckResult:
    """The idle-clip rule (module docstring) on one run."""
    columns = run.columns("train_steps")
    rows = run.rows(
        'SELECT stage, stage_update, "update", ratio_mean, ratio_max, '
        "coalesce(clip_frac_high, 0) AS clip_frac_high, grad_norm, lr, "
        + ("loss_metrics['ratio_max_pos_adv']" if "loss_metrics" in columns else "NULL")
        + " AS ratio_max_pos_adv, "
        + ("coalesce(num_replayed, 0)" if "num_replayed" in columns else "0")
        + " AS num_replayed FROM train_steps WHERE ratio_mean IS NOT NULL AND ratio_max IS NOT NULL "
        'ORDER BY "update"'
    )
    if not rows:
        return CheckResult(NAME, run.run_id, NOT_CHECKED, "no train_steps rows with ratio_mean/ratio_max")
    problems, notes = [], []
    firsts = [r for r in rows if r["stage_update"] == 1 and r["num_replayed"] == 0]
    if _cooled_learner(run.cfg):
        notes.append(
            f"learner temperature {run.cfg.train.learner_temperature:g} != sampling temperature "
            f"{run.cfg.generation.sampling.temperature:g}: update-1 ratio not 1 by design, not checked"
        )
        firsts = []
    for r in firsts:
        if _not_behavior(r):
            problems.append(
                f"stage {r['stage']} update 1: ratio_mean={r['ratio_mean']:.6g} ratio_max={r['ratio_max']:.6g} "
                f"(not 1 +- {TOL:g} / {MAX_TOL:g}: the policy updated is not the behavior policy)"
            )
    stages = sorted({r["stage"] for r in rows})
    moved_checked = 0
    for stage in stages:
        later = [r for r in rows if r["stage"] == stage and r["stage_update"] > 1]
        if not later:
            continue
        last = later[-1]["stage_update"]
        stepped = [
            r
            for r in rows
            if r["stage"] == stage and r["stage_update"] < last and r["grad_norm"] > STEP_EPS and r["lr"] > 0
        ]
        if not stepped:
            notes.append(f"stage {stage} took no step before its last update (grad_norm 0): ratio movement not checked")
            continue
        moved_checked += 1
        if all(_off(r) <= TOL for r in later):
            problems.append(
                f"stage {stage}: ratio identically 1 (+- {TOL:g}) over updates 2..{later[-1]['stage_update']}"
                " (idle clip: ratio taken against the learner's own recompute?)"
            )
    if not moved_checked:
        notes.append("no stage with mu > 1 that stepped: ratio movement not checked")
    bound = _upper_clip(run.cfg.loss)
    if bound is None:
        notes.append(f"loss {run.cfg.loss.name!r} has no single clip bound: clip fraction not checked")
    elif all(r["ratio_max_pos_adv"] is None for r in rows):
        notes.append("no ratio_max_pos_adv (run written before it was logged): clip fraction not checked")
    else:
        above = [r for r in rows if r["ratio_max_pos_adv"] is not None and r["ratio_max_pos_adv"] > bound + CLIP_TOL]
        if not above:
            notes.append(f"no A > 0 token above the clip bound {bound:g}: too short to clip, clip fraction not checked")
        idle = [r for r in above if r["clip_frac_high"] == 0]
        if idle:
            problems.append(
                f"clip_frac_high 0 at {len(idle)} update(s) where a token with A > 0 had a ratio above the clip "
                f"bound {bound:g} (first: update {idle[0]['update']}, ratio_max_pos_adv="
                f"{idle[0]['ratio_max_pos_adv']:.6g})"
            )
    values = {"updates": len(rows), "first_updates_checked": len(firsts)}
    if problems:
        return CheckResult(NAME, run.run_id, FAIL, "; ".join(problems + notes), values)
    if not firsts and not moved_checked:
        return CheckResult(NAME, run.run_id, NOT_CHECKED, "; ".join(notes) or "nothing to check", values)
    done = f"{len(firsts)} stage-first update(s) at ratio 1, ratio moves in {moved_checked} stage(s)"
    return CheckResult(NAME, run.run_id, PASS, "; ".join([done, *notes]), values)


def check(runs: list[AuditRun], options) -> list[CheckResult]:
    """One idle-clip row per run."""
    return [check_run(r) for r in runs]
