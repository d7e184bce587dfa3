"""The run report: one self-contained HTML file (inline SVG plots, no scripts, no network).

It holds a per-stage table in the style of the Mu-GRPO paper's Table 1 (accuracy per benchmark, T_roll, T_train,
T_total), reward and accuracy against wall-clock time and against updates, E[ratio | A<0] and the veto fraction
against updates, response-length statistics, and the paths of the Parquet files. Data comes through the read-only
SQL catalog (:mod:`mugrpo.sql`), the same views users query.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass, field
from datetime import UTC, datetime

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mugrpo.algorithms import excluding_columns  # noqa: E402
from mugrpo.commits.exclusion import training_rows_sql  # noqa: E402
from mugrpo.inspection.lineage import ForkInfo, collect_fork, lineage_section  # noqa: E402
from mugrpo.sql import connect  # noqa: E402
from mugrpo.sql.catalog import correctness_sql  # noqa: E402
from schemas.tables import TRAIN_STEP_V4_COLUMNS  # noqa: E402

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222}
h1{font-size:1.6rem} h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem} td,th{border:1px solid #ccc;padding:.25rem .5rem}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums}
.plots{display:flex;flex-wrap:wrap;gap:1rem} figure{margin:0} figcaption{font-size:.85rem;color:#555}
code{font-size:.85rem} h1 code{font-size:inherit} .muted{color:#777}
"""


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
#: its reward has, :data:`mugrpo.sql.catalog.CORRECTNESS_COMPONENTS`).
CORRECTNESS = correctness_sql()
#: Example rollouts shown per stage (the first sample of the stage's first prompts by prompt id).
EXAMPLES_PER_STAGE = 3


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


def _ci(low, high) -> str:
    return f"[{low:.3f}, {high:.3f}]" if low is not None and high is not None else "[-]"


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


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Creator": None, "Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _plot(title: str, series: list[tuple[str, list[float], list[float]]], xlabel: str, ylabel: str) -> str:
    fig, ax = plt.subplots(figsize=(5.0, 3.2))
    drawn = 0
    for label, xs, ys in series:
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
            drawn += 1
    if not drawn:
        ax.text(
            0.5,
            0.5,
            "no data yet (e.g. no optimizer update ran)",
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="#777",
        )
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if drawn > 1:
        ax.legend(fontsize=7)
    return f'<figure class="plot" aria-label="{html.escape(title)}">{_svg(fig)}</figure>'


def _table(headers: list[str], rows: list[list]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f'<td class="num">{v:.3f}</td>'
        if isinstance(v, int):
            return f'<td class="num">{v}</td>'
        return f"<td>{html.escape(str(v))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(v) for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


@dataclass
class _Axes:
    """What the table and the plots of a report share: per-stage timings, benchmarks, accuracies, the policies
    evaluated, each policy's wall clock and optimizer updates."""

    timing: dict[int, dict]
    benches: list[str]
    acc: dict[tuple[int, str], dict]  # rows of a fork's parent carry from_parent
    policies: list[int]
    clock: dict[int, float]
    updates: dict[int, int]
    per_stage_updates: float

    def policy_updates(self, k: int) -> float:
        return self.updates.get(k, k * self.per_stage_updates)


def _axes(data: ReportData) -> _Axes:
    timing = {s["stage"]: s for s in data.stages}
    # Cumulative wall clock: the policy of stage k exists once stages 0..k-1 are done.
    clock, t = {}, 0.0
    for k in sorted(timing):
        clock[k] = t
        t += timing[k]["t_total"] or 0.0
    clock.setdefault(max(timing) + 1 if timing else 0, t)
    return _Axes(
        timing=timing,
        benches=sorted({e["benchmark"] for e in data.evals}),
        acc={(e["stage"], e["benchmark"]): e for e in data.evals},
        policies=sorted({e["stage"] for e in data.evals} | set(timing)),
        clock=clock,
        updates={r["stage"]: r["policy_version"] for r in data.rollouts_by_stage},
        per_stage_updates=(max(s["update"] for s in data.steps) / max(len(timing), 1)) if data.steps else 0,
    )


def _stage_table(ax: _Axes) -> str:
    """Mu-GRPO's Table 1: accuracy per benchmark and timings of each stage's policy."""
    rows = []
    for k in ax.policies:
        tm = ax.timing.get(k, {})
        row = [f"stage {k}" if k in ax.timing else f"final (policy {k})"]
        row[0] += " (parent)" if any(ax.acc.get((k, b), {}).get("from_parent") for b in ax.benches) else ""
        for b in ax.benches:
            e = ax.acc.get((k, b))
            row.append(f"{e['avg_at_k']:.3f} {_ci(e['ci95_low'], e['ci95_high'])}" if e else "-")
            gain = e.get("gain") if e else None
            row.append(f"{gain:+.3f} {_ci(e['gain_low'], e['gain_high'])}" if gain is not None else "-")
        row += [tm.get("t_gen", "-"), tm.get("t_train", "-"), tm.get("t_switch", "-"), tm.get("t_total", "-")]
        rows.append(row)
    per_bench = [h for b in ax.benches for h in (f"{b} avg@k [95% CI]", f"{b} gain over stage 0 [paired 95% CI]")]
    head = ["policy", *per_bench, "T_gen s", "T_train s", "T_switch s", "T_total s"]
    return _table(head, rows)


def _accuracy_series(ax: _Axes, x) -> list:
    """Per benchmark (and, for a fork, per source: the parent's stages <= K, then the fork's) the avg@k curve."""
    sources = sorted({bool(e.get("from_parent")) for e in ax.acc.values()}, reverse=True)
    return [
        (
            f"{b} (parent)" if parent else b,
            [x(k) for k in ax.policies if (k, b) in ax.acc and bool(ax.acc[(k, b)].get("from_parent")) == parent],
            [
                ax.acc[(k, b)]["avg_at_k"]
                for k in ax.policies
                if (k, b) in ax.acc and bool(ax.acc[(k, b)].get("from_parent")) == parent
            ],
        )
        for b in ax.benches
        for parent in sources
    ]


def _plots(data: ReportData, ax: _Axes) -> list[str]:
    """Reward and accuracy against wall clock and updates, E[ratio | A<0], the veto fraction, response lengths."""
    rs, steps = data.rollouts_by_stage, data.steps
    updates = [s["update"] for s in steps]
    return [
        _plot(
            "Training reward vs wall clock",
            [("mean reward", [ax.clock.get(r["stage"], 0) for r in rs], [r["mean_reward"] for r in rs])],
            "seconds",
            "reward",
        ),
        _plot(
            "Training reward vs updates",
            [
                ("rollouts (per stage)", [ax.policy_updates(r["stage"]) for r in rs], [r["mean_reward"] for r in rs]),
                ("minibatch", updates, [s["mean_reward"] for s in steps]),
            ],
            "optimizer updates",
            "reward",
        ),
        _plot("Accuracy vs wall clock", _accuracy_series(ax, lambda k: ax.clock.get(k, 0)), "seconds", "avg@k"),
        _plot("Accuracy vs updates", _accuracy_series(ax, ax.policy_updates), "optimizer updates", "avg@k"),
        _plot(
            "E[ratio | A<0] vs updates",
            [("E[ratio | A<0]", updates, [s["ratio_mean_neg_adv"] for s in steps])],
            "optimizer updates",
            "ratio",
        ),
        _plot(
            "Veto fraction vs updates",
            [
                ("tokens", updates, [s["veto_token_frac"] for s in steps]),
                ("responses", updates, [s["veto_response_frac"] for s in steps]),
            ],
            "optimizer updates",
            "fraction vetoed",
        ),
        _plot(
            "Health vs updates (against the sampler q)",
            [
                (
                    name,
                    [u for u, v in zip(updates, vals, strict=True) if v is not None],
                    [v for v in vals if v is not None],
                )
                for name in ("ess", "sampler_clip_frac")
                for vals in [[s[name] for s in steps]]
            ],
            "optimizer updates",
            "ESS / fraction",
        ),
        _plot(
            "Response length by stage",
            [
                ("mean", [r["stage"] for r in rs], [r["mean_len"] for r in rs]),
                ("p90", [r["stage"] for r in rs], [r["p90_len"] for r in rs]),
            ],
            "stage",
            "tokens",
        ),
    ]


#: Columns of the rollouts table (header, rollouts_by_stage key).
_LENGTH_COLUMNS = [
    ("stage", "stage"),
    ("rollouts", "rollouts"),
    ("mean reward", "mean_reward"),
    ("correctness", "correctness"),
    ("correct", "accuracy"),
    ("boxed rate", "boxed_rate"),
    ("mean len", "mean_len"),
    ("p50", "p50_len"),
    ("p90", "p90_len"),
    ("max", "max_len"),
    ("truncated", "truncated"),
    ("zero-var groups", "zero_var_frac"),
]


#: train_steps columns of the health panel the report shows (docs/sql.md, "Health panel").
HEALTH_COLUMNS = TRAIN_STEP_V4_COLUMNS
#: Updates listed in the report's health table (the latest ones).
HEALTH_TABLE_ROWS = 30


def _health_table(steps: list[dict]) -> str:
    """The health panel of the latest :data:`HEALTH_TABLE_ROWS` updates; NULL (older files, no clip range) as -."""

    def fmt(v):
        return "-" if v is None else v if isinstance(v, str) else f"{v:.4g}"

    shown = steps[-HEALTH_TABLE_ROWS:]
    return _table(["update", *HEALTH_COLUMNS], [[s["update"], *(fmt(s[c]) for c in HEALTH_COLUMNS)] for s in shown])


def render(data: ReportData) -> str:
    """The report's HTML for collected data."""
    ax = _axes(data)
    lengths = _table(
        [h for h, _ in _LENGTH_COLUMNS], [[r[k] for _, k in _LENGTH_COLUMNS] for r in data.rollouts_by_stage]
    )
    files = "".join(f"<li><code>{html.escape(f)}</code></li>" for f in data.files)
    examples = _table(
        ["stage", "prompt", "response", "gold", "correctness", "reward"],
        [
            [
                e["stage"],
                e["prompt_text"][-300:],
                e["response_text"][:300],
                e["ground_truth"],
                e["correctness"],
                e["reward"],
            ]
            for e in data.examples
        ],
    )
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mugrpo report: {html.escape(data.run_id)}</title>
<style>{CSS}</style></head><body>
<h1>mugrpo run <code>{html.escape(data.run_id)}</code></h1>
<p class="muted">Stored at <code>{html.escape(data.uri)}</code>; created {html.escape(str(data.created_at))};
report generated {now}.</p>
<h2>Per-stage summary (Mu-GRPO Table 1 style)</h2>
<p>Held-out accuracy (avg@k) of the behavior policy of each stage (stage 0: the base model) and of the final policy,
with its 95% confidence interval clustered by problem, and the paired gain over the base policy on the same problems
with its 95% CI (Miller 2024, arXiv 2411.00640): a gain whose interval excludes 0 is beyond the eval's noise. T_gen
is the generation wall time (the paper's T_roll), T_switch the job start, engine start and weight-load overhead
inside all the jobs.</p>
{_stage_table(ax)}
{lineage_section(data.fork, _table)}
<h2>Plots</h2>
<div class="plots">{"".join(_plots(data, ax))}</div>
<h2>Health panel</h2>
<p>Per update, the importance weights w = pi_theta / q against the sampler's log-probs q: normalized ESS, KL(q || pi)
(k3), ratio percentiles, the clip fraction against the loss's clip range, the mean logit variance, S*eta and T*eta,
and the batch identity (docs/sql.md, "Health panel"). The latest {HEALTH_TABLE_ROWS} updates:</p>
{_health_table(data.steps)}
{_corrections_section(data)}
<h2>Rollouts and response lengths</h2>
{lengths}
<p>mean reward = the weighted sum of the components; correctness = the mean correctness component
(math_correctness, reasoning_gym_exact or the reasoning-gym task's score); correct = share of rollouts with
correctness 1; boxed rate =
share with a boxed answer (the format component).</p>
<h2>Example rollouts</h2>
<p>The first sample of {EXAMPLES_PER_STAGE} prompts per stage.</p>
{examples}
{_verifier_section(data)}
{_audit_section(data)}
<h2>Parquet files</h2>
<p>Plain Hive-partitioned Parquet: query them with <code>mugrpo sql</code>, the DuckDB CLI, pandas, polars or
pyarrow.</p>
<ul>{files}</ul>
</body></html>
"""


#: Columns of the per-stage corrections table (header, ``stage_corrections`` column).
_CORRECTION_COLUMNS = [
    ("stage", "stage"),
    ("updates", "updates"),
    ("clip frac", "clip_frac"),
    ("veto frac", "veto_token_frac"),
    ("masked frac", "masked_frac"),
    ("weights truncated", "weight_clipped_frac"),
    ("ESS", "correction_ess"),
    ("min ESS", "correction_ess_min"),
    ("ESS vs sampler", "sampler_ess"),
]


def _corrections_section(data: ReportData) -> str:
    """Per stage, what the loss's correction of stale data did (the ``stage_corrections`` view): clip and veto
    fractions, the fraction a stale-data correction masked or truncated and the ESS of its weights."""
    if not data.corrections:
        return ""

    def fmt(v):
        return "-" if v is None else v if isinstance(v, int | str) else f"{v:.4g}"

    loss = data.corrections[0]["loss"] or "?"
    rows = [[fmt(r[k]) for _, k in _CORRECTION_COLUMNS] for r in data.corrections]
    return (
        f"<h2>Stale-data correction by stage</h2>\n<p>Loss <code>{html.escape(str(loss))}</code>, per stage averaged "
        "over its updates: the fraction of tokens clipped (PPO-style clip) or vetoed (Mu-GRPO), the fraction of units "
        "a stale-data correction masked and of weights it truncated, and the normalized ESS of the weights it applied "
        "((sum w)^2 / (n sum w^2); - where the loss reports none), beside the ESS against the sampler "
        "(docs/algorithms/stale-corrections.md; the <code>stage_corrections</code> view of "
        "<code>mugrpo sql</code>).</p>\n" + _table([h for h, _ in _CORRECTION_COLUMNS], rows)
    )


def _verifier_section(data: ReportData) -> str:
    """The verifier false-negative audit per stage (the ``verifier_audit`` view; arXiv 2505.22203)."""
    if not data.verifier_audit:
        return ""
    rows = [
        [r["source"], r["stage"], r["wrong"], r["numeric_gold"], r["loose_accepts"], r["loose_accept_rate"] or 0.0]
        for r in data.verifier_audit
    ]
    return (
        "<h2>Verifier audit: wrong by the reward, right by a looser reading</h2>\n<p>Responses the reward called "
        "wrong whose last number equals a numeric gold (rule-based verifiers' false negatives grow as the policy "
        "improves: arXiv 2505.22203). The strict format policy refuses unboxed answers on purpose (docs/rewards.md): "
        "read the rows (<code>SELECT * FROM verifier_audit_samples WHERE loose_accepts</code>) before changing "
        "anything.</p>\n" + _table(["source", "stage", "wrong", "numeric gold", "loose reading accepts", "share"], rows)
    )


def _audit_section(data: ReportData) -> str:
    if not data.audit:
        return ""
    rows = [[r["check"], r["status"], r["detail"]] for r in data.audit]
    return (
        "<h2>Harness audit</h2>\n<p>The checklist of Probe the Harness (arXiv 2610.02911) over this run's committed "
        "data, as <code>mugrpo audit</code> prints it (docs/audit.md).</p>\n"
        + _table(["check", "status", "detail"], rows)
    )


def table1_markdown(data: ReportData) -> str:
    """The per-stage summary as a Markdown table (for Prefect artifacts and terminals)."""
    timing = {s["stage"]: s for s in data.stages}
    acc = {(e["stage"], e["benchmark"]): e for e in data.evals}
    benches = sorted({b for _, b in acc})
    rewards = {r["stage"]: r["mean_reward"] for r in data.rollouts_by_stage}
    policies = sorted({k for k, _ in acc} | set(timing))
    head = ["policy", "train reward", *[f"{b} avg@k [95% CI]" for b in benches], "T_gen s", "T_train s", "T_total s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in policies:
        t = timing.get(k, {})
        cells = [
            f"stage {k}" if k in timing else f"final ({k})",
            f"{rewards[k]:.3f}" if k in rewards else "-",
            *(
                f"{acc[(k, b)]['avg_at_k']:.3f} {_ci(acc[(k, b)]['ci95_low'], acc[(k, b)]['ci95_high'])}"
                if (k, b) in acc
                else "-"
                for b in benches
            ),
            *(f"{t[c]:.0f}" if t.get(c) is not None else "-" for c in ("t_gen", "t_train", "t_total")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(target: str, storage_options: dict | None = None, out: str | None = None) -> str:
    """Build the report of run folder ``target`` and write it to ``out`` (default: ``{run}/report.html`` in the
    run's storage, written atomically). Returns where it was written."""
    return write_report_data(collect(target, storage_options), target, storage_options, out)


def write_report_data(
    data: ReportData, target: str, storage_options: dict | None = None, out: str | None = None
) -> str:
    """Write already-collected report data (see :func:`write_report`)."""
    from mugrpo.storage.store import Store

    page = render(data).encode()
    if out is not None:
        with open(out, "wb") as f:
            f.write(page)
        return out
    parent, _, run_id = target.rstrip("/").rpartition("/")
    store = Store(parent or ".", storage_options)
    rel = f"{run_id}/report.html"
    store.write_bytes(rel, page)
    return store.uri(rel)
