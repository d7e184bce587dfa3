"""The plots (inline SVG): reward and accuracy against wall clock and updates, E[ratio | A<0], the veto fraction,
the health panel's ESS and response lengths."""

from __future__ import annotations

import html
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mugrpo.inspection.report.axes import Axes  # noqa: E402
from mugrpo.inspection.report.data import ReportData  # noqa: E402


def section(data: ReportData, ax: Axes) -> str:
    return f"""<h2>Plots</h2>
<div class="plots">{"".join(plots(data, ax))}</div>"""


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Creator": None, "Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def plot(title: str, series: list[tuple[str, list[float], list[float]]], xlabel: str, ylabel: str) -> str:
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


def _accuracy_series(ax: Axes, x) -> list:
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


def plots(data: ReportData, ax: Axes) -> list[str]:
    """Reward and accuracy against wall clock and updates, E[ratio | A<0], the veto fraction, response lengths."""
    rs, steps = data.rollouts_by_stage, data.steps
    updates = [s["update"] for s in steps]
    return [
        plot(
            "Training reward vs wall clock",
            [("mean reward", [ax.clock.get(r["stage"], 0) for r in rs], [r["mean_reward"] for r in rs])],
            "seconds",
            "reward",
        ),
        plot(
            "Training reward vs updates",
            [
                ("rollouts (per stage)", [ax.policy_updates(r["stage"]) for r in rs], [r["mean_reward"] for r in rs]),
                ("minibatch", updates, [s["mean_reward"] for s in steps]),
            ],
            "optimizer updates",
            "reward",
        ),
        plot("Accuracy vs wall clock", _accuracy_series(ax, lambda k: ax.clock.get(k, 0)), "seconds", "avg@k"),
        plot("Accuracy vs updates", _accuracy_series(ax, ax.policy_updates), "optimizer updates", "avg@k"),
        plot(
            "E[ratio | A<0] vs updates",
            [("E[ratio | A<0]", updates, [s["ratio_mean_neg_adv"] for s in steps])],
            "optimizer updates",
            "ratio",
        ),
        plot(
            "Veto fraction vs updates",
            [
                ("tokens", updates, [s["veto_token_frac"] for s in steps]),
                ("responses", updates, [s["veto_response_frac"] for s in steps]),
            ],
            "optimizer updates",
            "fraction vetoed",
        ),
        plot(
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
        plot(
            "Response length by stage",
            [
                ("mean", [r["stage"] for r in rs], [r["mean_len"] for r in rs]),
                ("p90", [r["stage"] for r in rs], [r["p90_len"] for r in rs]),
            ],
            "stage",
            "tokens",
        ),
    ]
