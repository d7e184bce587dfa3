"""Normalizers ("Probe the Harness", arXiv 2610.02911, the rogue normalizer: a loss divided by a different
normalizer than its equation).

The loss of a stage's first update is recomputed from stored rows and compared with the logged one. At stage
update 1 the policy being updated is the behavior policy, so every importance ratio is 1 (the idle-clip check
verifies it from the log) and the per-token term of a clipped surrogate (grpo, mu_grpo) is
``-min(1 * A_i, clip(1) * A_i) = -A_i`` for every response token t of response i: no clip, no veto. The update's
minibatch is rebuilt with the trainer's own data-order functions (:mod:`mugrpo.audit.plan`), the advantages are
the stored rollouts' ``advantage`` column, and the per-token terms are aggregated here, independently of
:mod:`mugrpo.losses`, by the equation of the config's ``loss.agg_mode`` (:data:`EQUATIONS`).

Rule: ``|logged - recomputed| <= 1e-3 * agg(|A|) + 1e-6`` for ``loss`` (``policy_loss`` when ``loss.kl_coef > 0``,
whose KL term needs the reference policy's log-probs, which are not stored). The tolerance covers the numeric
difference between the sampler's and the learner's log-probs at the first update (a ratio within 1e-3 of 1); a
wrong normalizer is off by a count (tokens, responses, a length), far beyond it. Not checked: losses that are not a
clipped token surrogate (ConSPO, GSPO, AGPO), first updates that train on replayed rollouts, first updates whose
advantages are all 0 (every normalizer gives 0).
"""

from __future__ import annotations

from collections.abc import Callable

from mugrpo.audit.plan import stage_plan
from mugrpo.audit.result import FAIL, NOT_CHECKED, PASS, AuditRun, CheckResult

NAME = "normalizer"
REL_TOL = 1e-3
ABS_TOL = 1e-6

# (per-response token values [[l_it for t] for i], L_max) -> aggregate. Empty responses count in no normalizer.
Equation = Callable[[list[list[float]], int], float]


def _n_seqs(values: list[list[float]]) -> int:
    return max(1, sum(1 for v in values if v))


#: The aggregation equations by ``loss.agg_mode`` (docs/audit.md).
EQUATIONS: dict[str, Equation] = {
    # DAPO (arXiv 2503.14476): sum_{i,t} l_it / sum_i |o_i|
    "token-mean": lambda v, _: sum(map(sum, v)) / max(1, sum(map(len, v))),
    # GRPO (arXiv 2402.03300, Eq. 3): (1/N) sum_i (1/|o_i|) sum_t l_it
    "seq-mean-token-mean": lambda v, _: sum(sum(x) / len(x) for x in v if x) / _n_seqs(v),
    # (1/N) sum_i sum_t l_it
    "seq-mean-token-sum": lambda v, _: sum(map(sum, v)) / _n_seqs(v),
    # Dr. GRPO (arXiv 2503.20783): (1/N) sum_i sum_t l_it / L_max
    "seq-mean-token-sum-norm": lambda v, lmax: sum(map(sum, v)) / (_n_seqs(v) * lmax),
}


def recompute_first_update(run: AuditRun, stage: int) -> tuple[float, float]:
    """(recomputed loss of stage ``stage``'s update 1, the same aggregation of |A|: the tolerance's scale).

    Raises:
        KeyError: the config's agg_mode has no equation here.
    """
    plan = stage_plan(run, stage)
    equation = EQUATIONS[run.cfg.loss.agg_mode]
    lmax = plan.spec.max_response_len or max(1, max((r.num_tokens for r in plan.data.rollouts), default=1))
    rows = plan.rollouts(1)
    terms = [[-r.advantage] * r.num_tokens for r in rows]
    scale = [[abs(r.advantage)] * r.num_tokens for r in rows]
    return equation(terms, lmax), equation(scale, lmax)


def check_run(run: AuditRun) -> CheckResult:
    """The normalizer rule (module docstring) on one run."""
    loss = run.cfg.loss
    from mugrpo.losses import is_token_surrogate

    if not is_token_surrogate(loss.name):
        return CheckResult(NAME, run.run_id, NOT_CHECKED, f"loss {loss.name!r} is not a clipped token surrogate")
    learner = run.cfg.train.learner_temperature
    if learner is not None and learner != run.cfg.generation.sampling.temperature:
        return CheckResult(NAME, run.run_id, NOT_CHECKED, "learner temperature differs: update-1 ratio is not 1")
    if loss.agg_mode not in EQUATIONS:
        return CheckResult(NAME, run.run_id, NOT_CHECKED, f"agg_mode {loss.agg_mode!r} has no equation here")
    column = "loss" if loss.kl_coef == 0 else "policy_loss"
    replayed = "coalesce(num_replayed, 0)" if "num_replayed" in run.columns("train_steps") else "0"
    firsts = run.rows(
        f'SELECT stage, "update", {column} AS logged, {replayed} AS num_replayed FROM train_steps '
        "WHERE stage_update = 1 ORDER BY stage"
    )
    checked, problems, skipped, zero = [], [], [], []
    for r in firsts:
        if r["num_replayed"]:
            skipped.append(r["stage"])
            continue
        recomputed, scale = recompute_first_update(run, r["stage"])
        if scale == 0:  # every advantage 0: every normalizer gives 0
            zero.append(r["stage"])
            continue
        tol = REL_TOL * scale + ABS_TOL
        diff = abs(r["logged"] - recomputed)
        checked.append({"stage": r["stage"], "update": r["update"], "logged": r["logged"], "recomputed": recomputed})
        if diff > tol:
            problems.append(
                f"stage {r['stage']} update {r['update']}: logged {column} {r['logged']:.6g} != "
                f"{recomputed:.6g} recomputed with {loss.agg_mode} (|diff| {diff:.3g} > {tol:.3g})"
            )
    values = {"column": column, "agg_mode": loss.agg_mode, "updates": checked}
    note = f"; first updates with replayed rollouts not checked (stages {skipped})" if skipped else ""
    if zero:
        note += f"; first updates whose advantages are all 0 tell no normalizer apart (stages {zero})"
    if problems:
        return CheckResult(NAME, run.run_id, FAIL, "; ".join(problems) + note, values)
    if not checked:
        return CheckResult(NAME, run.run_id, NOT_CHECKED, "no informative stage-first update" + note, values)
    return CheckResult(
        NAME,
        run.run_id,
        PASS,
        f"{column} of {len(checked)} stage-first update(s) = {loss.agg_mode} of -A over the rebuilt minibatch{note}",
        values,
    )


def check(runs: list[AuditRun], options) -> list[CheckResult]:
    """One normalizer row per run."""
    return [check_run(r) for r in runs]
