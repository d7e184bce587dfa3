"""The staleness frontier on the lab task: at a fixed total number of optimizer updates, sweep mu (updates per stage)
across five loss regimes and two learning rates, 3 seeds per cell, and find where each regime collapses.

    python bench/staleness.py --jobs 2 --out /tmp/staleness     # the full grid (docs/benchmarks.md: its wall time)
    python bench/staleness.py --quick --out /tmp/staleness-q    # CI: every regime, tiny budget; structure + audit
    python bench/staleness.py --jobs 2 --out OUT --stop-after 3000 [--resume]   # the grid in parts, resumed
    python bench/staleness.py --frontier --jobs 2 --out OUT --stop-after 3000 [--resume]  # the staleness frontier

``--frontier`` (:data:`FRONTIER`): the nine arms of :data:`FRONTIER_ARMS` x mu 16/64/256 x lr 1e-4/3e-4 x 3 seeds, 162
runs, ~91 min at --jobs 2 on a quiet 2-core CPU (docs/benchmarks.md, "Stale-data corrections side by side").

Regimes (:data:`REGIMES`; every other config key is configs/lab/mu-grpo.yaml's):
- ``ppo``: PPO/GRPO clip [0.8, 1.2], no veto (arXiv 2402.03300);
- ``relaxed``: Mu-GRPO's relaxed clip [0, 5] with the veto off (arXiv 2605.17570, its ablation);
- ``mu-grpo``: relaxed [0, 5] + the negative-advantage veto, suffix scope S_kappa (the default);
- ``tis``: PPO clip with token-level truncated importance sampling, cap 2 (``loss.tis_cap``; Yao et al. 2025);
- ``cooled``: ``tis`` with the sampler at T = 0.8 and the learner at T = 1.0 (``train.learner_temperature``), the
  behavior log-probs those of the tempered sampler ("Cool the Sampler, Not the Learner", arXiv 2609.36953).
- the stale-data corrections (docs/algorithms/stale-corrections.md), each at its published defaults:
  ``seq-is`` (sequence-level truncated IS, cap 2), ``snis`` (self-normalised sequence IS), ``geo-mask`` (SkyRL's
  geometric sequence mask [0.99, 1.01]), ``icepop`` (token mask [0.5, 2]), ``m2po`` (second-moment mask, tau 0.04),
  ``a3po`` (decoupled PPO with an interpolated proximal policy).

The arms' resolved configs must differ only in the arms' own keys (:func:`audit_arm_configs`, checked before any
run; a difference refuses the grid). Per arm and lr (``arms`` in the JSON, the printed arm table and
staleness.html): the largest stable mu, final held-out greedy and avg@8 with 95% paired CIs against mu-grpo, the
correction's ESS and mask/clip fraction (also by update-entropy tercile), grad-norm spikes before collapse, extra
forward passes per update and T_total; frontier.png plots final greedy accuracy against mu, one line per arm.

Every run has the same budget: ``updates`` optimizer updates of ``rollouts_per_update`` rollouts (G = 8), so the same
prompts in the same seed-fixed order; mu only changes how many updates share one behavior policy (a stage of mu
updates samples mu x rollouts_per_update / G prompts, each rollout trained on once). Held-out greedy accuracy is
evaluated at the same update counts for every mu (0, E, 2E, ..., updates with E = the grid's largest mu: every
``E / mu`` stages), so the collapse update does not depend on mu's stage boundaries. Execution is warm (one segment
job per run, ``orchestration.execution: warm``), then one evaluation of the final policy, both in one child process
per run (``--jobs N`` runs N at once, each pinned to one core with one torch thread).

Per cell (regime x mu x lr, over seeds):
- final held-out greedy accuracy (mean and per seed, in seed order);
- collapse update: the first evaluated update u after the best one such that accuracy at u and at every later
  evaluation is more than ``--margin`` below the run's best (None: no collapse);
- E[ratio | A<0]: train_steps.ratio_mean_neg_adv (ratio against the stage's behavior policy over the tokens of
  negative-advantage responses), mean over the run's updates that have such tokens (an update without any logs 0)
  and its maximum;
- ESS (train_steps.ess) and S*eta (train_steps.s_eta) at the collapse update (the row of that update).

The claims tested (``claims`` in the JSON), each reproduced or not with its numbers:
- naive clipping degrades as mu grows while Mu-GRPO holds: at some lr, ppo's mean final accuracy at the largest mu is
  more than ``margin`` below its smallest mu's, and mu-grpo's is not;
- collapse tracks S*eta: over all runs, the Spearman correlation of mu*lr (S*eta at a stage's last update) with the
  collapse update (runs that never collapse counted at updates + E) is <= -0.5. Beside it, not part of the verdict:
  the same correlation with lr alone, and with mu within each lr (a collapse governed by S*eta moves with mu at a
  fixed lr; one governed by the learning rate alone does not);
- cooling moves the cliff: the cooled regime's cliff (smallest mu*lr at which most seeds collapse; inf when none)
  is larger than tis's.

Every run is audited (mugrpo.audit, the seeds of a cell together: data order differs by seed, configs differ only in
``run.seed``); a failed audit refuses the table: exit 1 naming the run and the check. Outputs under --out:
staleness.json (cells, runs, claims, audit), heatmap-REGIME.png (mu x lr -> mean final accuracy; heatmaps.png: all
regimes side by side) and the run logs.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import hashlib
import itertools
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.support.audit import audit_seeds  # noqa: E402
from bench.support.pinned import run_pinned  # noqa: E402

BASE_CONFIG = REPO / "configs" / "lab" / "mu-grpo.yaml"
HELDOUT = "lab-heldout"
#: Loss regime -> config overrides on top of configs/lab/mu-grpo.yaml (module docstring).
REGIMES: dict[str, tuple[str, ...]] = {
    "ppo": ("loss.name=grpo", "loss.eps_low=0.2", "loss.eps_high=0.2"),
    "relaxed": ("loss.name=mu_grpo", "loss.ratio_min=0.0", "loss.ratio_max=5.0", "loss.veto_enabled=false"),
    "mu-grpo": ("loss.name=mu_grpo", "loss.ratio_min=0.0", "loss.ratio_max=5.0", "loss.veto_scope=suffix"),
    "tis": ("loss.name=grpo", "loss.eps_low=0.2", "loss.eps_high=0.2", "loss.tis_cap=2.0"),
    "cooled": (
        "loss.name=grpo",
        "loss.eps_low=0.2",
        "loss.eps_high=0.2",
        "loss.tis_cap=2.0",
        "generation.sampling.temperature=0.8",
        "train.learner_temperature=1.0",
    ),
    # the stale-data corrections (docs/algorithms/stale-corrections.md), each at its published default
    "seq-is": ("loss.name=seq_is", "loss.seq_is.cap=2.0"),
    "snis": ("loss.name=seq_snis",),
    "geo-mask": ("loss.name=geo_mask", "loss.geo_mask.low=0.99", "loss.geo_mask.high=1.01"),
    "icepop": ("loss.name=icepop", "loss.icepop.low=0.5", "loss.icepop.high=2.0"),
    "m2po": ("loss.name=m2po", "loss.m2po.tau=0.04"),
    "a3po": ("loss.name=a3po", "loss.eps_low=0.2", "loss.eps_high=0.2", "loss.a3po.weight_cap=5.0"),
}
#: The arm every other is compared with (paired CIs of held-out accuracy).
BASELINE_ARM = "mu-grpo"
SAMPLED = "lab-heldout-t1"


@dataclass(frozen=True)
class Grid:
    """The sweep: every regime x mu x lr x seed at ``updates`` updates of ``rollouts_per_update`` rollouts."""

    mus: tuple[int, ...] = (4, 16, 64)
    lrs: tuple[float, ...] = (1e-4, 5e-4)
    seeds: tuple[int, ...] = (0, 1, 2)
    regimes: tuple[str, ...] = tuple(REGIMES)
    updates: int = 256
    rollouts_per_update: int = 32
    group_size: int = 8
    max_new_tokens: int = 40
    eval_prompts: int = 200
    margin: float = 0.08
    sampled_eval_prompts: int = 100  # avg@8 at T = 1 on the lab's second held-out benchmark; 0: greedy only

    @property
    def eval_every(self) -> int:
        """E: updates between held-out evaluations, the same for every mu (the grid's largest mu)."""
        return max(self.mus)

    def check(self) -> None:
        """Raises ValueError when a mu cannot share the budget and the evaluation points exactly."""
        for mu in self.mus:
            if self.eval_every % mu or self.updates % self.eval_every:
                raise ValueError(f"mu={mu}: every mu must divide E={self.eval_every}, and E the updates {self.updates}")
        if (self.rollouts_per_update * min(self.mus)) % self.group_size:
            raise ValueError("a stage must hold whole groups: mu x rollouts_per_update must be a multiple of G")
        unknown = set(self.regimes) - set(REGIMES)
        if unknown:
            raise ValueError(f"unknown regime(s) {sorted(unknown)}: one of {', '.join(REGIMES)}")

    def cells(self) -> list[tuple[str, int, float]]:
        return list(itertools.product(self.regimes, self.mus, self.lrs))


#: CI: every regime at a tiny budget, 1 seed, 1 lr, 2 mu values (structure and audit, never accuracy).
QUICK = Grid(
    mus=(2, 4), lrs=(1e-4,), seeds=(0,), updates=4, rollouts_per_update=8, group_size=4, max_new_tokens=40,
    eval_prompts=8, sampled_eval_prompts=4,
)  # fmt: skip


#: The arms of the frontier: uncorrected PPO clipping, TIS, each stale-data correction, and Mu-GRPO.
FRONTIER_ARMS = ("ppo", "tis", "seq-is", "snis", "geo-mask", "icepop", "m2po", "a3po", "mu-grpo")

#: The frontier grid (``--frontier``): every arm at mu in {16, 64, 256}, 3 paired seeds, at the lab's stable lr
#: (1e-4) and at the collapse edge, 3e-4: there PPO at seed 0 ended below the lab policy (0.325 at mu 16, 0.305 at
#: mu 256, from 0.360) without collapsing, while at 5e-4 every regime collapsed at every mu (docs/benchmarks.md).
FRONTIER = Grid(mus=(16, 64, 256), lrs=(1e-4, 3e-4), regimes=FRONTIER_ARMS)


def run_id(regime: str, mu: int, lr: float, seed: int) -> str:
    return f"stale-{regime}-mu{mu}-lr{lr:g}-s{seed}"


def run_config(grid: Grid, regime: str, mu: int, lr: float, seed: int, root: Path):
    """The resolved Config of one run (module docstring: same budget and evaluation points for every mu)."""
    from mugrpo.config import config_from_dict, load_config

    stages = grid.updates // mu
    mb = min(grid.rollouts_per_update, 64)
    overrides = [
        f"run.root={root}",
        f"run.id={run_id(regime, mu, lr, seed)}",
        f"run.seed={seed}",
        f"run.num_stages={stages}",
        f"generation.prompts_per_stage={mu * grid.rollouts_per_update // grid.group_size}",
        f"generation.sampling.n={grid.group_size}",
        f"generation.sampling.max_new_tokens={grid.max_new_tokens}",
        f"train.updates_per_stage={mu}",
        f"train.rollouts_per_update={grid.rollouts_per_update}",
        f"train.micro_batch_size={mb}",
        f"train.checkpoint_every={mu}",
        f"train.lr={lr}",
        "train.skip_zero_variance_groups=false",  # every run does exactly `updates` updates of equal size
        "eval.every_stage=true",
        f"eval.every_n_stages={grid.eval_every // mu}",
        "tracking.sinks=[]",
        "orchestration.execution=warm",
        f"orchestration.segment_stages={stages}",
        *REGIMES[regime],
    ]
    data = load_config(BASE_CONFIG, overrides).to_json_dict()
    greedy = [b for b in data["eval"]["benchmarks"] if b["dataset"]["name"] == HELDOUT]
    for b in greedy:
        b.update(num_prompts=grid.eval_prompts, max_new_tokens=grid.max_new_tokens)
    sampled = [b for b in data["eval"]["benchmarks"] if b["dataset"]["name"] == SAMPLED and grid.sampled_eval_prompts]
    for b in sampled:
        b.update(num_prompts=grid.sampled_eval_prompts, max_new_tokens=grid.max_new_tokens)
    data["eval"]["benchmarks"] = greedy + sampled
    return config_from_dict(data, source=f"staleness bench {regime} mu={mu} lr={lr:g} seed={seed}")


def _flatten(value, prefix: str = "") -> dict:
    """A resolved config (its JSON dict) as dotted key -> leaf value (lists are leaves)."""
    if isinstance(value, dict):
        out: dict = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def arm_keys(regime: str) -> set[str]:
    """The config keys an arm sets (its overrides in :data:`REGIMES`)."""
    return {o.split("=", 1)[0] for o in REGIMES[regime]}


def audit_arm_configs(cfgs: dict) -> list[str]:
    """The arms' resolved configs must differ only in the arms' own keys: for every (mu, lr, seed), each arm's config
    against the baseline arm's (:data:`BASELINE_ARM`, else the first arm), ``run.id`` aside.

    Args:
        cfgs: (regime, mu, lr, seed) -> resolved Config.

    Returns:
        One line per key in which two arms differ beyond their keys ([]: the comparison is fair).
    """
    problems = []
    for (regime, mu, lr, seed), cfg in sorted(cfgs.items(), key=lambda kv: str(kv[0])):
        arms = [k[0] for k in cfgs if k[1:] == (mu, lr, seed)]
        ref = BASELINE_ARM if BASELINE_ARM in arms else arms[0]
        if regime == ref:
            continue
        mine, base = _flatten(cfg.to_json_dict()), _flatten(cfgs[(ref, mu, lr, seed)].to_json_dict())
        allowed = arm_keys(regime) | arm_keys(ref) | {"run.id"}
        for key in sorted(set(mine) | set(base)):
            if mine.get(key) != base.get(key) and key not in allowed:
                problems.append(
                    f"{run_id(regime, mu, lr, seed)} vs {ref}: {key} = {mine.get(key)!r} vs {base.get(key)!r} "
                    "(not one of the arms' keys)"
                )
    return problems


def extra_forward_passes(cfg) -> float:
    """Forward passes per optimizer update beyond the update's own (in units of one forward over the update's
    rollouts), read from the resolved config: the recompute of the behavior log-probs
    (``train.recompute_behavior_logprobs``, on with ``loss.tis_cap``: one no-grad forward over each of the stage's
    rollouts, each trained on once: 1 per update) and the reference policy of a KL penalty (1 per update). A-3PO's
    interpolated proximal policy costs none (decoupled PPO's recomputed one would cost 1)."""
    recompute = cfg.train.recompute_behavior_logprobs is True or cfg.loss.tis_cap is not None
    return float(recompute) + float(cfg.loss.kl_coef > 0)


def _child(config_json: Path) -> None:
    """One run in this process: its warm segment (all stages), then the evaluation of its final policy."""
    from mugrpo.config import config_from_dict
    from mugrpo.execution.warm import SegmentSpec
    from mugrpo.jobs import eval as eval_job
    from mugrpo.jobs import segment as segment_job
    from mugrpo.orchestration.job_specs import write_final_eval_spec
    from mugrpo.orchestration.runs import attach_run, init_run

    cfg = config_from_dict(json.loads(config_json.read_text()), source=str(config_json))
    init_run(cfg)
    spec = config_json.with_suffix(".segment.json")
    spec.write_text(SegmentSpec.from_config(cfg, 0, cfg.run.num_stages).model_dump_json())
    segment_job.main([str(spec)])
    final = write_final_eval_spec(attach_run(cfg))
    if final is not None:
        eval_job.main([final])


def launch(cfg, work: Path, core: int | None, in_process: bool = False) -> float:
    """Run one config in a child process (pinned to ``core`` with one torch thread when given), or in this process
    with ``in_process`` (no interpreter start and imports per run: what --quick does); its wall seconds.

    Raises:
        RuntimeError: the child failed (the message names the run and the tail of its log).
    """
    path = work / f"{cfg.run.id}.config.json"
    path.write_text(json.dumps(cfg.to_json_dict()))
    log = work / f"{cfg.run.id}.log"
    if in_process:
        t0 = time.monotonic()
        _child(path)
        return time.monotonic() - t0
    return run_pinned(Path(__file__).resolve(), ["--child", str(path)], log, core, cfg.run.id)


def collapse_update(curve: list[tuple[int, float]], margin: float) -> int | None:
    """First evaluated update after the best one from which held-out accuracy stays more than ``margin`` below
    the best (at it and at every later evaluation); None when the run never collapses.

    Args:
        curve: (update, accuracy) pairs, sorted by update; accuracy in [0, 1].
        margin: accuracy points (0.08 = 8 points).
    """
    if not curve:
        return None
    best = max(a for _, a in curve)
    first_best = next(i for i, (_, a) in enumerate(curve) if a == best)
    for i in range(first_best + 1, len(curve)):
        if all(a < best - margin for _, a in curve[i:]):
            return curve[i][0]
    return None


@dataclass
class RunResult:
    """One run's figures (module docstring)."""

    regime: str
    mu: int
    lr: float
    seed: int
    run: str
    curve: list[tuple[int, float]]
    final: float
    collapse: int | None
    ratio_neg_adv_mean: float | None
    ratio_neg_adv_max: float | None
    ess_at_collapse: float | None
    s_eta_at_collapse: float | None
    updates: int
    wall_s: float
    extra: dict = field(default_factory=dict)


def read_run(cfg, regime: str, mu: int, lr: float, grid: Grid, wall: float) -> RunResult:
    """The run's held-out curve (by update) and train_steps figures, read back from its committed tables."""
    from mugrpo.sql import connect

    base = str(Path(cfg.run.root) / cfg.run.id)
    with connect(base) as cat:
        evals = cat.arrow(
            "SELECT stage, avg(CASE WHEN correct THEN 1.0 ELSE 0.0 END) AS acc FROM evals "
            f"WHERE benchmark = '{HELDOUT}' GROUP BY stage ORDER BY stage"
        ).to_pylist()
        steps = cat.arrow('SELECT "update", ratio_mean_neg_adv, ess, s_eta FROM train_steps ORDER BY "update"')
        steps = steps.to_pylist()
    curve = [(int(r["stage"]) * mu, float(r["acc"])) for r in evals]  # stage k's policy has had k x mu updates
    col = collapse_update(curve, grid.margin)
    at = next((s for s in steps if s["update"] == col), {}) if col else {}
    # an update without negative-advantage tokens logs the empty mean as 0 (mugrpo.losses.metrics): left out
    neg = [s["ratio_mean_neg_adv"] for s in steps if s["ratio_mean_neg_adv"]]
    return RunResult(
        regime=regime,
        mu=mu,
        lr=lr,
        seed=cfg.run.seed,
        run=cfg.run.id,
        curve=curve,
        final=curve[-1][1] if curve else float("nan"),
        collapse=col,
        ratio_neg_adv_mean=sum(neg) / len(neg) if neg else None,
        ratio_neg_adv_max=max(neg) if neg else None,
        ess_at_collapse=at.get("ess"),
        s_eta_at_collapse=at.get("s_eta"),
        updates=len(steps),
        wall_s=wall,
        extra={**read_arm_figures(base, col), "extra_forward_passes": extra_forward_passes(cfg)},
    )


#: A grad-norm spike: an update whose gradient norm exceeds SPIKE_FACTOR x the median of the run's earlier updates
#: (counted from the SPIKE_WARMUP-th update on).
SPIKE_FACTOR = 5.0
SPIKE_WARMUP = 4


def grad_norm_spikes(norms: list[float], before: int | None = None) -> int:
    """Updates (1-based index into ``norms``) before ``before`` (None: all) whose grad norm exceeds
    :data:`SPIKE_FACTOR` x the median of the earlier ones, from update :data:`SPIKE_WARMUP` + 1 on."""
    spikes = 0
    for i, g in enumerate(norms):
        if before is not None and i + 1 >= before:
            break
        if i >= SPIKE_WARMUP:
            spikes += g > SPIKE_FACTOR * statistics.median(norms[:i])
    return spikes


def entropy_bins(steps: list[dict], key: str, bins: int = 3) -> list[float | None]:
    """Mean of ``key`` over the run's updates binned by the update's mean token entropy (``bins`` equal-count bins,
    lowest entropy first). Per-token entropies are not stored, so this bins updates, not tokens."""
    rows = sorted(
        (s for s in steps if s.get("entropy") is not None and s.get(key) is not None), key=lambda s: s["entropy"]
    )
    if not rows:
        return [None] * bins
    cut = [rows[len(rows) * b // bins : len(rows) * (b + 1) // bins] for b in range(bins)]
    return [sum(s[key] for s in c) / len(c) if c else None for c in cut]


def read_arm_figures(base: str, collapse: int | None) -> dict:
    """The per-arm figures of one run: final held-out scores per problem (greedy and avg@8, for paired
    CIs), the correction's mask/clip fraction and ESS (``stage_corrections``), the fraction binned by update entropy
    and grad-norm spikes before the collapse. T_total is the run's measured wall (``RunResult.wall_s``: its segment
    and final evaluation). The stages' ``t_total`` is not read: in the smoke cell's warm runs made one after
    another in one process (--quick) it grew run after run (5.9 s to 49 s over 11 runs of 3-7 s each)."""
    from mugrpo.sql import connect

    with connect(base) as cat:
        problems = cat.arrow(
            "SELECT benchmark, stage, prompt_id, score FROM eval_problems "
            "QUALIFY stage = max(stage) OVER (PARTITION BY benchmark)"
        ).to_pylist()
        corr = cat.arrow(
            "SELECT sum(updates) AS n, sum(updates * clip_frac) / sum(updates) AS clip_frac, "
            "sum(updates * veto_token_frac) / sum(updates) AS veto_frac, "
            "sum(updates * masked_frac) / sum(updates) AS masked_frac, "
            "sum(updates * correction_ess) / sum(updates) AS correction_ess, min(correction_ess_min) AS ess_min, "
            "sum(updates * sampler_ess) / sum(updates) AS sampler_ess FROM stage_corrections"
        ).to_pylist()[0]
        steps = cat.arrow(
            'SELECT "update", grad_norm, entropy, clip_frac_low + clip_frac_high AS clip_frac, veto_token_frac, '
            "loss_metrics['correction_masked_frac'] AS masked_frac FROM train_steps ORDER BY \"update\""
        ).to_pylist()
    by_bench: dict[str, dict[str, float]] = {}
    for r in problems:
        by_bench.setdefault(r["benchmark"], {})[r["prompt_id"]] = float(r["score"])
    masked_key = "masked_frac" if any(s["masked_frac"] is not None for s in steps) else "clip_frac"
    return {
        "greedy_by_problem": by_bench.get(HELDOUT, {}),
        "avg8_by_problem": by_bench.get(SAMPLED, {}),
        "clip_frac": corr["clip_frac"],
        "veto_frac": corr["veto_frac"],
        "masked_frac": corr["masked_frac"],
        "correction_ess": corr["correction_ess"],
        "correction_ess_min": corr["ess_min"],
        "sampler_ess": corr["sampler_ess"],
        "entropy_binned_key": masked_key,
        "entropy_binned": entropy_bins(steps, masked_key),
        "grad_norm_spikes": grad_norm_spikes([s["grad_norm"] for s in steps], collapse),
    }


def _spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None with fewer than 3 points or a constant input."""

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(x) < 3:
        return None
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else None


def summarize(results: list[RunResult], grid: Grid) -> tuple[list[dict], dict]:
    """Per-cell aggregates and the three claims (module docstring), from the runs' figures."""
    cells = []
    for regime, mu, lr in grid.cells():
        rs = sorted((r for r in results if (r.regime, r.mu, r.lr) == (regime, mu, lr)), key=lambda r: r.seed)
        if not rs:
            continue
        collapsed = [r for r in rs if r.collapse is not None]

        def mean(v):
            v = [x for x in v if x is not None]
            return sum(v) / len(v) if v else None

        cells.append(
            {
                "regime": regime,
                "mu": mu,
                "lr": lr,
                "mu_lr": mu * lr,
                "final_mean": mean([r.final for r in rs]),
                "final_per_seed": [r.final for r in rs],
                "collapse_per_seed": [r.collapse for r in rs],
                "collapsed_seeds": len(collapsed),
                "ratio_neg_adv_mean": mean([r.ratio_neg_adv_mean for r in rs]),
                "ratio_neg_adv_max": max((r.ratio_neg_adv_max or 0.0) for r in rs),
                "ess_at_collapse": mean([r.ess_at_collapse for r in collapsed]),
                "s_eta_at_collapse": mean([r.s_eta_at_collapse for r in collapsed]),
            }
        )
    return cells, claims(cells, results, grid)


def claims(cells: list[dict], results: list[RunResult], grid: Grid) -> dict:
    """The three claims, each ``{"reproduced": bool | None, ...numbers}`` (None: the grid cannot test it)."""
    cell = {(c["regime"], c["mu"], c["lr"]): c for c in cells}
    lo, hi = min(grid.mus), max(grid.mus)
    out: dict = {}
    per_lr = []  # stays empty (not testable) when the grid has one mu
    for lr in grid.lrs if lo < hi else ():
        ppo_lo, ppo_hi = cell.get(("ppo", lo, lr)), cell.get(("ppo", hi, lr))
        mu_lo, mu_hi = cell.get(("mu-grpo", lo, lr)), cell.get(("mu-grpo", hi, lr))
        if not (ppo_lo and ppo_hi and mu_lo and mu_hi):
            continue
        d_ppo, d_mu = ppo_hi["final_mean"] - ppo_lo["final_mean"], mu_hi["final_mean"] - mu_lo["final_mean"]
        per_lr.append({"lr": lr, "ppo_change": d_ppo, "mu_grpo_change": d_mu, "mu_low": lo, "mu_high": hi})
    out["naive_degrades_mu_grpo_holds"] = {
        "rule": f"ppo final(mu={hi}) - final(mu={lo}) < -{grid.margin} and mu-grpo's >= -{grid.margin}, at some lr",
        "reproduced": any(p["ppo_change"] < -grid.margin <= p["mu_grpo_change"] for p in per_lr) if per_lr else None,
        "per_lr": per_lr,
    }
    horizon = grid.updates + grid.eval_every
    x = [r.mu * r.lr for r in results]
    y = [float(r.collapse if r.collapse is not None else horizon) for r in results]
    rho = _spearman(x, y)
    # diagnostics beside the rule (the verdict is the rule's): does the collapse follow S (mu at a fixed lr), or the
    # learning rate alone? A collapse governed by S*eta moves with mu at a fixed lr, not only with lr.
    within = {}
    for lr in grid.lrs:
        pairs = [(float(r.mu), v) for r, v in zip(results, y, strict=True) if r.lr == lr]
        within[f"{lr:g}"] = _spearman([p[0] for p in pairs], [p[1] for p in pairs])
    out["collapse_tracks_s_eta"] = {
        "rule": f"Spearman(mu*lr, collapse update; no collapse = {horizon}) <= -0.5 over all runs",
        "spearman": rho,
        "spearman_lr_only": _spearman([r.lr for r in results], y),
        "spearman_mu_within_lr": within,
        "runs": len(results),
        "collapsed_runs": sum(r.collapse is not None for r in results),
        "reproduced": None if rho is None else rho <= -0.5,
    }

    def cliff(regime: str) -> float | None:
        rows = [c for c in cells if c["regime"] == regime]
        if not rows:
            return None
        hit = [c["mu_lr"] for c in rows if c["collapsed_seeds"] * 2 > len(c["collapse_per_seed"])]
        return min(hit) if hit else math.inf

    tis, cooled = cliff("tis"), cliff("cooled")
    out["cooling_moves_the_cliff"] = {
        "rule": "cliff (smallest mu*lr where most seeds collapse; inf: none) of cooled > tis's",
        "cliff_tis": tis,
        "cliff_cooled": cooled,
        "reproduced": None if tis is None or cooled is None or tis == cooled == math.inf else cooled > tis,
    }
    return out


def _seed_mean_scores(rs: list[RunResult], key: str) -> dict[str, float]:
    """Per-problem score averaged over the seeds of one cell (problems every seed evaluated)."""
    maps = [r.extra.get(key) or {} for r in rs]
    common = set.intersection(*(set(m) for m in maps)) if maps else set()
    return {p: sum(m[p] for m in maps) / len(maps) for p in common}


def arm_report(results: list[RunResult], grid: Grid) -> list[dict]:
    """Per arm and learning rate: the largest stable mu (most seeds never collapse), and per mu the final
    held-out greedy accuracy and avg@8 with their 95% paired CIs against :data:`BASELINE_ARM` (per-problem scores
    averaged over seeds, paired by problem: :func:`mugrpo.evaluation.metrics.paired_difference_ci`), the
    correction's ESS and mask/clip fraction (also binned by update entropy), grad-norm spikes before collapse,
    extra forward passes per update and T_total."""
    from mugrpo.evaluation.metrics import paired_difference_ci

    def mean(v):
        v = [x for x in v if x is not None]
        return sum(v) / len(v) if v else None

    cell = {}
    for r in results:
        cell.setdefault((r.regime, r.mu, r.lr), []).append(r)
    arms = []
    for regime in grid.regimes:
        for lr in grid.lrs:
            per_mu = []
            for mu in grid.mus:
                rs = sorted(cell.get((regime, mu, lr), []), key=lambda r: r.seed)
                if not rs:
                    continue
                row = {"mu": mu, "seeds": len(rs), "stable": sum(r.collapse is None for r in rs) * 2 > len(rs)}
                for name, key in (("greedy", "greedy_by_problem"), ("avg8", "avg8_by_problem")):
                    mine = _seed_mean_scores(rs, key)
                    row[name] = mean(list(mine.values())) if mine else None
                    base = _seed_mean_scores(cell.get((BASELINE_ARM, mu, lr), []), key)
                    ci = None
                    if regime != BASELINE_ARM and mine and base and set(mine) & set(base):
                        d = paired_difference_ci(mine, base)
                        ci = {"diff": d.mean, "low": d.low, "high": d.high}
                    row[f"{name}_vs_{BASELINE_ARM}"] = ci
                for key in ("correction_ess", "sampler_ess", "masked_frac", "clip_frac", "veto_frac"):
                    row[key] = mean([r.extra.get(key) for r in rs])
                row["t_total_s"] = mean([r.wall_s for r in rs])
                row["extra_forward_passes"] = mean([r.extra.get("extra_forward_passes") for r in rs])
                row["grad_norm_spikes"] = sum(r.extra.get("grad_norm_spikes") or 0 for r in rs)
                bins = [r.extra.get("entropy_binned") or [] for r in rs]
                row["entropy_binned"] = [mean([b[i] for b in bins if len(b) > i]) for i in range(max(map(len, bins)))]
                row["entropy_binned_key"] = next((r.extra.get("entropy_binned_key") for r in rs), None)
                per_mu.append(row)
            if per_mu:
                stable = [row["mu"] for row in per_mu if row["stable"]]
                arms.append({"arm": regime, "lr": lr, "largest_stable_mu": max(stable, default=None), "by_mu": per_mu})
    return arms


def frontier_figure(arms: list[dict], grid: Grid, out: Path) -> Path:
    """Final held-out greedy accuracy against mu, one line per arm, one panel per learning rate (``frontier.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(grid.lrs), figsize=(4.2 * len(grid.lrs) + 1.5, 3.4), dpi=90, squeeze=False)
    for ax, lr in zip(axes[0], grid.lrs, strict=True):
        for arm in (a for a in arms if a["lr"] == lr):
            pts = [(row["mu"], row["greedy"]) for row in arm["by_mu"] if row["greedy"] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=arm["arm"])
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(grid.mus), [str(m) for m in grid.mus])
        ax.set_xlabel("mu (updates per stage)")
        ax.set_title(f"lr {lr:g}", fontsize=9)
    axes[0][0].set_ylabel("final held-out greedy accuracy")
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f"staleness frontier at {grid.updates} updates (mean over seeds)", fontsize=10)
    fig.tight_layout()
    path = out / "frontier.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def _ci_text(ci: dict | None) -> str:
    return "-" if ci is None else f"{ci['diff']:+.3f} [{ci['low']:+.3f}, {ci['high']:+.3f}]"


def arm_table_rows(arms: list[dict]) -> list[list[str]]:
    """The per-arm table (markdown and HTML share it): one row per arm, lr and mu."""
    rows = []
    for a in arms:
        for row in a["by_mu"]:
            bins = ", ".join(_fmt(v) for v in row["entropy_binned"])
            vs = BASELINE_ARM
            rows.append(
                [a["arm"], f"{a['lr']:g}", str(a["largest_stable_mu"]), str(row["mu"]), _fmt(row["greedy"]),
                 _ci_text(row[f"greedy_vs_{vs}"]), _fmt(row["avg8"]), _ci_text(row[f"avg8_vs_{vs}"]),
                 _fmt(row["correction_ess"]), _fmt(row["sampler_ess"]), _fmt(row["masked_frac"]),
                 _fmt(row["clip_frac"]), f"{row['entropy_binned_key']}: {bins}", str(row["grad_norm_spikes"]),
                 _fmt(row["extra_forward_passes"], 1), _fmt(row["t_total_s"], 1)]
            )  # fmt: skip
    return rows


ARM_HEADERS = [
    "arm", "lr", "largest stable mu", "mu", "greedy", f"greedy - {BASELINE_ARM} [95% paired CI]", "avg@8",
    f"avg@8 - {BASELINE_ARM} [95% paired CI]", "ESS (correction)", "ESS (sampler)", "masked frac", "clip frac",
    "frac by update-entropy tercile (low to high)", "grad-norm spikes before collapse", "extra forwards / update",
    "T_total s",
]  # fmt: skip


def write_html(payload: dict, out: Path) -> Path:
    """``staleness.html``: the frontier figure, the per-arm table and the heatmaps, self-contained (inline PNGs)."""
    import base64
    import html as html_lib

    def img(path: str | None) -> str:
        if not path or not Path(path).exists():
            return ""
        data = base64.b64encode(Path(path).read_bytes()).decode()
        return f'<img alt="{html_lib.escape(Path(path).name)}" src="data:image/png;base64,{data}">'

    head = "".join(f"<th>{html_lib.escape(h)}</th>" for h in ARM_HEADERS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html_lib.escape(c)}</td>" for c in row) + "</tr>"
        for row in arm_table_rows(payload["arms"])
    )
    page = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>staleness frontier</title><style>"
        "body{font-family:system-ui,sans-serif;margin:2rem} table{border-collapse:collapse;font-size:.85rem}"
        "td,th{border:1px solid #ccc;padding:.2rem .4rem}</style></head><body>"
        f"<h1>Staleness frontier</h1><p>{payload['runs_done']} of {payload['runs_planned']} runs, "
        f"{payload['wall_s']:.0f} s wall; audit {'ok' if payload['audit_ok'] else 'FAILED'}; the arms' configs differ "
        f"only in their keys: {'yes' if not payload['arm_config_audit'] else 'NO'}.</p>"
        f"<h2>Accuracy against mu</h2>{img(payload.get('frontier'))}"
        f"<h2>Per arm</h2><table><tr>{head}</tr>{body}</table>"
        f"<h2>Final accuracy, mu x lr</h2>{img(payload.get('heatmap_panel'))}</body></html>"
    )
    path = out / "staleness.html"
    path.write_text(page)
    return path


def _final_grid(cells: list[dict], grid: Grid, regime: str) -> list[list[float]]:
    """Mean final accuracy of ``regime`` as rows mu x columns lr (NaN: a cell not run)."""
    by = {(c["mu"], c["lr"]): c["final_mean"] for c in cells if c["regime"] == regime}
    return [[by.get((mu, lr), math.nan) for lr in grid.lrs] for mu in grid.mus]


def _draw_heatmap(ax, z: list[list[float]], grid: Grid, title: str, mu_labels: bool = True):
    im = ax.imshow(z, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(grid.lrs)), [f"{lr:g}" for lr in grid.lrs])
    ax.set_yticks(range(len(grid.mus)), [str(m) for m in grid.mus] if mu_labels else [])
    for i, row in enumerate(z):
        for j, v in enumerate(row):
            ax.text(j, i, "-" if math.isnan(v) else f"{v:.2f}", ha="center", va="center", color="w", fontsize=8)
    ax.set_xlabel("learning rate")
    ax.set_title(title, fontsize=9)
    return im


def heatmaps(cells: list[dict], grid: Grid, out: Path) -> tuple[list[Path], Path]:
    """One PNG per regime (``heatmap-REGIME.png``) and all regimes side by side (``heatmaps.png``, one colour
    scale): mean final held-out greedy accuracy over mu (rows) x lr (columns). matplotlib, Agg backend.

    Returns: (the per-regime paths in ``grid.regimes`` order, the side-by-side panel's path).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for regime in grid.regimes:
        fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(grid.lrs), 1.4 + 0.6 * len(grid.mus)), dpi=90)
        im = _draw_heatmap(ax, _final_grid(cells, grid, regime), grid, f"{regime}: final held-out greedy")
        ax.set_ylabel("mu (updates per stage)")
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        path = out / f"heatmap-{regime}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    n = len(grid.regimes)
    size = (1.4 + 1.0 * n * len(grid.lrs), 1.8 + 0.5 * len(grid.mus))
    fig, axes = plt.subplots(1, n, figsize=size, dpi=90, layout="constrained")
    axes = [axes] if n == 1 else list(axes)
    for i, (ax, regime) in enumerate(zip(axes, grid.regimes, strict=True)):
        im = _draw_heatmap(ax, _final_grid(cells, grid, regime), grid, regime, mu_labels=i == 0)
    axes[0].set_ylabel("mu (updates per stage)")
    fig.suptitle("final held-out greedy accuracy, mean over seeds", fontsize=10)
    fig.colorbar(im, ax=axes, shrink=0.9)
    panel = out / "heatmaps.png"
    fig.savefig(panel)
    plt.close(fig)
    return paths, panel


class _Inline:
    """An executor that runs each job in the calling (main) thread: the jobs install signal handlers."""

    def submit(self, fn, *args) -> futures.Future:
        fut: futures.Future = futures.Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001  (re-raised by fut.result(), as a pool would)
            fut.set_exception(e)
        return fut

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc) -> None:
        return None


PROGRESS = "progress.jsonl"
"""One line per finished run ({"run": RunResult, "config": sha256}) and per audited cell ({"audit": report,
"cell": [regime, mu, lr], "failed": [...]}), appended as they finish: what ``--resume`` continues from."""


def _config_sha(cfg) -> str:
    return hashlib.sha256(json.dumps(cfg.to_json_dict(), sort_keys=True, default=str).encode()).hexdigest()


def load_progress(out: Path, cfgs: dict) -> tuple[list[RunResult], list[dict], list[str], set[tuple]]:
    """Finished runs and audited cells of an earlier invocation (``OUT/progress.jsonl``) that belong to this grid.

    Returns (results, audit reports, audit failures, audited cells). A run is kept only if its resolved config is the
    one this grid gives it (same sha256), so a changed grid or code that changes a config reruns that run.

    Raises:
        ValueError: a line of the file is not JSON (the message names the file and line).
    """
    path = out / PROGRESS
    if not path.exists():
        return [], [], [], set()
    by_id = {cfg.run.id: (p, _config_sha(cfg)) for p, cfg in cfgs.items()}
    results, audits, failures, audited = [], [], [], set()
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {n}: not JSON ({err})") from err
        if "run" in rec:
            r = RunResult(**{**rec["run"], "curve": [tuple(c) for c in rec["run"]["curve"]]})
            if by_id.get(r.run, (None, None))[1] == rec["config"]:
                results = [x for x in results if x.run != r.run] + [r]
        elif tuple(rec["cell"]) not in audited and set(rec["runs"]) <= {x.run for x in results}:
            audited.add(tuple(rec["cell"]))  # only while every run it audited is kept (else its reruns are audited)
            audits.append(rec["audit"])
            failures += rec["failed"]
    return results, audits, failures, audited


def run_grid(
    grid: Grid,
    out: Path,
    root: Path,
    jobs: int,
    keep_runs: bool,
    in_process: bool = False,
    resume: bool = False,
    stop_after_s: float | None = None,
) -> dict:
    """Every run of the grid (``jobs`` at once, seeds of a cell together so each cell is audited when done), then
    the cells, claims and heatmaps. A failed audit raises SystemExit naming the run and the check.

    Each finished run and audited cell is appended to ``OUT/progress.jsonl``. With ``resume`` the runs and audits
    found there (same resolved config) are kept and only the rest run; a run folder left by an interrupted run is
    deleted and the run started again. With ``stop_after_s``, no run starts after that many seconds: the running
    ones finish, and the payload (``complete: false``) holds what is done so far; rerun with ``resume`` to go on.
    """
    grid.check()
    out.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    ncores = os.cpu_count() or 1
    # arms innermost: the arms of one (lr, mu, seed) run side by side in time, so the machine's drifting load falls on
    # every arm alike (T_total is compared across arms), and a cell is complete once its (lr, mu) block is done
    plan = [(rg, mu, lr, s) for lr in grid.lrs for mu in grid.mus for s in grid.seeds for rg in grid.regimes]
    cfgs = {p: run_config(grid, *p, root) for p in plan}
    arm_config_problems = audit_arm_configs(cfgs)
    if arm_config_problems:
        raise SystemExit("the arms' configs differ beyond their keys:\n" + "\n".join(arm_config_problems))
    results: list[RunResult] = []
    audits: list[dict] = []
    failures: list[str] = []
    audited: set[tuple] = set()
    if resume:
        results, audits, failures, audited = load_progress(out, cfgs)
        print(f"resume: {len(results)} run(s) and {len(audited)} audited cell(s) from {out / PROGRESS}", flush=True)
    elif (out / PROGRESS).exists():
        (out / PROGRESS).unlink()
    done_ids = {r.run for r in results}
    progress = (out / PROGRESS).open("a")
    t0 = time.monotonic()
    todo = [p for p in plan if cfgs[p].run.id not in done_ids]
    for p in todo:  # what an interrupted invocation left half-written
        shutil.rmtree(root / cfgs[p].run.id, ignore_errors=True)
    done_by_cell: dict[tuple, list[RunResult]] = {}
    for r in results:
        done_by_cell.setdefault((r.regime, r.mu, r.lr), []).append(r)

    def finish_cell(cell: tuple) -> None:
        if cell in audited or len(done_by_cell.get(cell, [])) != len(grid.seeds):
            return
        report = audit_seeds(root, [x.run for x in done_by_cell[cell]])
        failed = [f"{x.run}: {x.check}: {x.detail}" for x in report.results if x.status == "fail"]
        print(f"audit {cell}: {'FAILED: ' + '; '.join(failed) if failed else 'ok'}", flush=True)
        audits.append(report.to_json())
        failures.extend(failed)
        audited.add(cell)
        runs = [x.run for x in done_by_cell[cell]]
        progress.write(
            json.dumps({"cell": list(cell), "runs": runs, "audit": report.to_json(), "failed": failed}, default=str)
        )
        progress.write("\n")
        progress.flush()
        if not keep_runs:
            for x in done_by_cell[cell]:
                shutil.rmtree(root / x.run, ignore_errors=True)

    for cell in list(done_by_cell):  # every seed done before an interruption, not yet audited
        finish_cell(cell)
    stopped = False
    with _Inline() if in_process else futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        slots = list(range(jobs))
        pending = {}

        def submit(p):
            core = slots.pop(0)
            fut = pool.submit(launch, cfgs[p], out, core % ncores if jobs > 1 else None, in_process)
            pending[fut] = (p, core)

        def may_start() -> bool:
            nonlocal stopped
            stopped = stopped or (stop_after_s is not None and time.monotonic() - t0 > stop_after_s)
            return bool(todo) and not stopped

        while may_start() and slots:
            submit(todo.pop(0))
        while pending:
            finished, _ = futures.wait(pending, return_when=futures.FIRST_COMPLETED)
            for fut in finished:
                p, core = pending.pop(fut)
                slots.append(core)
                wall = fut.result()
                r = read_run(cfgs[p], p[0], p[1], p[2], grid, wall)
                results.append(r)
                progress.write(json.dumps({"run": asdict(r), "config": _config_sha(cfgs[p])}, default=str) + "\n")
                progress.flush()
                print(
                    f"{r.run}: final {r.final:.3f}, collapse {r.collapse}, E[ratio|A<0] "
                    f"{_fmt(r.ratio_neg_adv_mean)}, {wall:.0f} s ({time.monotonic() - t0:.0f} s elapsed)",
                    flush=True,
                )
                done_by_cell.setdefault(p[:3], []).append(r)
                finish_cell(p[:3])
                if may_start():
                    submit(todo.pop(0))
    progress.close()
    complete = len({r.run for r in results}) == len(plan)
    cells, claim = summarize(results, grid)
    payload = {
        "grid": asdict(grid),
        "eval_every": grid.eval_every,
        "regimes": {k: list(REGIMES[k]) for k in grid.regimes},
        "wall_s": time.monotonic() - t0,
        "run_wall_s": sum(r.wall_s for r in results),
        "complete": complete,
        "runs_done": len(results),
        "runs_planned": len(plan),
        "jobs": jobs,
        "audit_ok": not failures,
        "audit_failures": failures,
        "audit": audits,
        "runs": [asdict(r) for r in results],
        "cells": cells,
        "claims": claim,
        "arm_config_audit": arm_config_problems,
        "arms": arm_report(results, grid),
    }
    (out / "staleness.json").write_text(json.dumps(payload, indent=2, default=str))
    if failures:
        raise SystemExit("audit failed; the table is refused:\n" + "\n".join(failures))
    paths, panel = heatmaps(cells, grid, out)
    payload["heatmaps"], payload["heatmap_panel"] = [str(p) for p in paths], str(panel)
    payload["frontier"] = str(frontier_figure(payload["arms"], grid, out))
    payload["html"] = str(write_html(payload, out))
    (out / "staleness.json").write_text(json.dumps(payload, indent=2, default=str))
    return payload


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def print_table(payload: dict) -> None:
    print("\n| regime | mu | lr | final (mean; per seed) | collapse update per seed | E[ratio|A<0] mean / max | "
          "ESS at collapse | S*eta at collapse |")  # fmt: skip
    print("|---|---:|---:|---|---|---|---:|---:|")
    for c in payload["cells"]:
        seeds = ", ".join(f"{v:.3f}" for v in c["final_per_seed"])
        col = ", ".join("-" if v is None else str(v) for v in c["collapse_per_seed"])
        print(
            f"| {c['regime']} | {c['mu']} | {c['lr']:g} | {c['final_mean']:.3f} ({seeds}) | {col} | "
            f"{_fmt(c['ratio_neg_adv_mean'])} / {c['ratio_neg_adv_max']:.3f} | {_fmt(c['ess_at_collapse'])} | "
            f"{_fmt(c['s_eta_at_collapse'], 4)} |"
        )
    print("\n| " + " | ".join(ARM_HEADERS) + " |")
    print("|" + "---|" * len(ARM_HEADERS))
    for row in arm_table_rows(payload["arms"]):
        print("| " + " | ".join(row) + " |")
    for name, claim in payload["claims"].items():
        verdict = {True: "reproduced", False: "not reproduced", None: "not testable on this grid"}[claim["reproduced"]]
        numbers = {k: v for k, v in claim.items() if k not in ("rule", "reproduced")}
        print(f"- {name}: {verdict} ({claim['rule']}): {json.dumps(numbers, default=str)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI: every regime, 2 mu, 1 lr, 1 seed, tiny budget")
    parser.add_argument(
        "--frontier", action="store_true", help="The frontier grid: every arm, mu 16/64/256, lr 1e-4/3e-4, 3 seeds"
    )
    parser.add_argument("--mus", nargs="*", type=int, default=None)
    parser.add_argument("--lrs", nargs="*", type=float, default=None)
    parser.add_argument("--seeds", nargs="*", type=int, default=None)
    parser.add_argument("--regimes", nargs="*", default=None, choices=list(REGIMES))
    parser.add_argument("--updates", type=int, default=None, help="Total optimizer updates of every run.")
    parser.add_argument("--margin", type=float, default=None, help="Collapse margin in accuracy points (0.08).")
    parser.add_argument("--rollouts-per-update", type=int, default=None, help="Rollouts per optimizer update (32).")
    parser.add_argument("--eval-prompts", type=int, default=None, help="Held-out greedy problems (200).")
    parser.add_argument(
        "--sampled-eval-prompts", type=int, default=None, help="Held-out problems of avg@8 at T = 1 (100; 0: none)."
    )
    parser.add_argument("--jobs", type=int, default=1, help="Runs at once, each pinned to one core (taskset).")
    parser.add_argument("--out", type=Path, default=None, help="Output folder (default: a temporary one).")
    parser.add_argument("--root", type=Path, default=None, help="Run folders (default: OUT/runs).")
    parser.add_argument(
        "--in-process", action="store_true", help="Runs one after another in this process (--quick's default)."
    )
    parser.add_argument("--keep-runs", action="store_true", help="Keep the run folders (else deleted once audited).")
    parser.add_argument(
        "--resume", action="store_true", help="Keep the runs and audits in OUT/progress.jsonl; run only the rest."
    )
    parser.add_argument(
        "--stop-after", type=float, default=None, help="Start no run after this many seconds (then rerun --resume)."
    )
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _child(args.child)
        return
    grid = QUICK if args.quick else FRONTIER if args.frontier else Grid()
    given = {
        "mus": tuple(args.mus) if args.mus else None,
        "lrs": tuple(args.lrs) if args.lrs else None,
        "seeds": tuple(args.seeds) if args.seeds else None,
        "regimes": tuple(args.regimes) if args.regimes else None,
        "updates": args.updates,
        "margin": args.margin,
        "rollouts_per_update": args.rollouts_per_update,
        "eval_prompts": args.eval_prompts,
        "sampled_eval_prompts": args.sampled_eval_prompts,
    }
    grid = Grid(**{**asdict(grid), **{k: v for k, v in given.items() if v is not None}})
    out = args.out or Path(tempfile.mkdtemp(prefix="mugrpo-staleness-"))
    in_process = args.in_process or (args.quick and args.jobs == 1)
    jobs = 1 if in_process else max(args.jobs, 1)
    if (args.resume or args.stop_after is not None) and args.out is None:
        parser.error("--resume and --stop-after need --out (where progress.jsonl is kept)")
    payload = run_grid(
        grid, out, args.root or out / "runs", jobs, args.keep_runs, in_process, args.resume, args.stop_after
    )
    print_table(payload)
    print(f"\n{out / 'staleness.json'}; {payload['wall_s']:.0f} s wall, {args.jobs} job(s)")
    if not payload["complete"]:
        print(
            f"incomplete: {payload['runs_done']} of {payload['runs_planned']} runs done (--stop-after); the claims and "
            f"heatmaps cover those only. Continue with the same flags and --resume."
        )


if __name__ == "__main__":
    main()
