"""``mugrpo status``, ``verify``, ``report`` and ``audit``: read a run's committed files; nothing is written but the
report and the audit's JSON."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from mugrpo.cli.app import StorageOptionsOpt, app, console, err, refuse, split_run, storage_options, stored_config
from mugrpo.common.exit_codes import ExitCode, exit_code_of
from mugrpo.storage.cli_support import storage_guard


@app.command("status")
def status_cmd(
    run: str = typer.Argument(..., help="Run id (with --root) or run folder/URL ROOT/RUN_ID."),
    root: str | None = typer.Option(None, help="Storage root holding the run (default: runs)."),
    storage_option: list[str] | None = StorageOptionsOpt,
):
    """Show what a run has committed, what is left, the timings of each stage, and the bytes it holds per stage
    with the total projected for its configured stages."""
    from rich.table import Table

    from mugrpo.commits.manifest import read_preemption_record
    from mugrpo.inspection.storage_use import storage_use
    from mugrpo.orchestration.runs import health_line, open_store, run_status
    from mugrpo.sql.schema_check import unhealthy

    cfg = stored_config(run, root, storage_options(storage_option))
    with storage_guard(open_store(cfg).uri(cfg.run.id), cfg.run.storage_options):
        st = run_status(open_store(cfg), cfg)
        use = storage_use(open_store(cfg), cfg, [s.stage for s in st.stages if s.committed])  # one listing
        not_healthy = unhealthy(open_store(cfg), cfg.run.id)  # table files that do not fit their schema (footers)
        preempted = {  # a train job stopped on SIGTERM and not yet re-run to its commit: what it saved
            s.stage: record
            for s in st.stages
            if not s.jobs["train"] and (record := read_preemption_record(open_store(cfg), cfg.layout, s.stage))
        }
    table = Table(title=f"run {st.run_id} ({st.uri}), {cfg.orchestration.execution} execution")
    for col in (
        "stage",
        "state",
        "jobs done",
        "shards",
        "ckpts",
        "reward",
        "verify t/o",
        "gen tok",
        "excl tok",
        "T_gen",
        "T_train",
        "T_eval",
        "T_switch",
        "T_sync",
        "T_total",
    ):
        table.add_column(col, justify="right", no_wrap=True)
    for s in st.stages:
        m = s.manifest
        t = m.timings if m else None
        reward = m.metrics.get("generate/mean_reward") if m else None
        table.add_row(
            str(s.stage),
            "committed" if s.committed else ("preempted" if s.stage in preempted else "pending"),
            " ".join(j for j in ("generate", "train", "eval") if s.jobs[j]) or "-",
            str(s.shards_written),
            str(s.checkpoints),
            f"{reward:.3f}" if reward is not None else "-",
            str(m.counts.get("generate/reward_timeouts", "-")) if m else "-",
            *(
                str(m.counts[k]) if m and k in m.counts else "-"
                for k in ("generate/tokens", "generate/excluded_tokens")
            ),
            *((f"{getattr(t, f):.0f}s" if t else "-") for f in ("t_gen", "t_train", "t_eval")),
            f"{t.t_switch:.1f}s" if t else "-",
            f"{t.t_sync:.3f}s" if t else "-",  # warm weight sync: milliseconds matter
            f"{t.t_total:.0f}s" if t else "-",
        )
    Console(width=max(console.width, 180)).print(table)
    _print_storage(use)
    if cfg.run.parent is not None:  # a fork: its parent, K and what changed (run.json's lineage block)
        from mugrpo.inspection.lineage import fork_line

        lineage = open_store(cfg).read_json(cfg.layout.run_json).get("lineage")
        if lineage:
            console.print(fork_line(lineage), markup=False, highlight=False, soft_wrap=True)
    if st.latest_update is not None:
        console.print(health_line(st.latest_update))
    for line in not_healthy:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for record in preempted.values():
        console.print(f"preempted: {record['message']}", markup=False, highlight=False, soft_wrap=True)
    left = [s.stage for s in st.stages if not s.committed]
    console.print(
        "complete"
        if st.complete
        else f"left: stages {left or 'none'}{'' if st.final_eval else ' + final eval'} -> mugrpo resume {st.uri}"
    )


def _print_storage(use) -> None:
    """The bytes table of ``mugrpo status`` (:func:`mugrpo.inspection.storage_use.storage_use`) and its projection."""
    from rich.table import Table

    from mugrpo.inspection.storage_use import KINDS, human

    table = Table(title="storage (bytes per stage: what it wrote, the policy it published included)")
    for col in ("stage", "policies", "ckpt weights", "ckpt optimizer", "rollouts", "other", "total"):
        table.add_column(col, justify="right", no_wrap=True)
    rows = [(str(k), b) for k, b in use.stages.items()] + [("run", use.run), ("all", use.total)]
    for label, b in rows:
        table.add_row(label, *(human(getattr(b, k)) for k in KINDS), human(b.total))
    Console(width=max(console.width, 120)).print(table)
    own, s = len(use.own_stages), lambda n: "" if n == 1 else "s"
    if use.projected is None:
        line = f"projected: - (no stage committed yet); retention: {use.retention}"
    else:
        line = (
            f"projected for {own} stage{s(own)}: {human(use.projected)} ({human(use.per_stage)} per committed stage "
            f"without optimizer state x {own}, + {human(use.optimizer_per_stage)} of optimizer state x {use.kept} "
            f"stage{s(use.kept)} keeping it, + {human(use.run.total)} for the run); retention: {use.retention}, "
            f"prunes {human(use.pruned)} over the run"
        )
    console.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command("verify")
def verify_cmd(
    run: str = typer.Argument(..., help="Run id (with --root) or run folder/URL ROOT/RUN_ID."),
    root: str | None = typer.Option(None, help="Storage root holding the run (default: runs)."),
    storage_option: list[str] | None = StorageOptionsOpt,
    quick: bool = typer.Option(
        False,
        "--quick",
        help="Check as a start does: re-hash what the next work reads (the first stage not committed, the "
        "checkpoints it resumes from) and check every other file by what the store says without reading it (size, "
        "S3's SHA-256 checksum or the commit's ETag, the local hash cache).",
    ),
):
    """Re-hash every committed file of a run against its manifests; per stage: intact, corrupted or missing.

    Exit code 0 when every committed file is intact, 1 when a file is corrupted or missing (the lines name them
    and how to recover), 2 when the run cannot be read.
    """
    from rich.table import Table

    from mugrpo.commits.verify import verify_run
    from mugrpo.orchestration.runs import open_store

    cfg = stored_config(run, root, storage_options(storage_option))
    store = open_store(cfg)
    with storage_guard(store.uri(cfg.run.id), cfg.run.storage_options):
        report = verify_run(store, cfg.run.id, cfg.run.num_stages, cfg.layout, quick=quick)
    table = Table(title=f"verify{' --quick' if quick else ''} {store.uri(cfg.run.id)}")
    for col in ("stage", "committed", "files", "intact", "corrupted", "missing", "MiB hashed"):
        table.add_column(col, justify="right", no_wrap=True)
    for s in report.stages:
        table.add_row(
            s.label,
            (", ".join(s.holds) or "not yet") if s.label == "final" else ("yes" if s.committed else "no"),
            str(s.files),
            str(len(s.intact)),
            str(len(s.corrupted)),
            str(len(s.missing)),
            f"{s.hashed_bytes / 2**20:.1f}",
        )
    Console(width=max(console.width, 120)).print(table)
    for line in report.problems():
        err.print(line, markup=False, highlight=False)
    if not report.ok:  # the check found a problem
        raise typer.Exit(ExitCode.FAILED)
    console.print(f"intact: {report.summary()}")


@app.command("report")
def report_cmd(
    run: str = typer.Argument(..., help="Run folder or URL ROOT/RUN_ID (or a run id with --root)."),
    root: str | None = typer.Option(None, help="Storage root holding the run (default: runs)."),
    out: Path | None = typer.Option(None, help="Write the HTML here instead of {run}/report.html in storage."),
    storage_option: list[str] | None = StorageOptionsOpt,
):
    """Write the run's self-contained HTML report: Table-1-style stage summary, plots, lengths, file paths."""
    from mugrpo.inspection.report import write_report
    from mugrpo.orchestration.runs import load_run_config
    from mugrpo.sql import TargetError
    from mugrpo.storage.errors import check_store
    from mugrpo.storage.store import Store

    root, run_id = split_run(run, root)
    given = storage_options(storage_option)
    url = f"{root.rstrip('/')}/{run_id}"
    with storage_guard(url, given):
        check_store(Store(root, given), url)
        try:
            opts = {**load_run_config(root, run_id, given).run.storage_options, **given}
        except FileNotFoundError:
            opts = given
    try:
        with storage_guard(url, opts):
            where = write_report(url, opts, str(out) if out else None)
    except (TargetError, ValueError) as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(exit_code_of(e)) from None
    console.print(f"report: {where}")


@app.command("audit")
def audit_cmd(
    runs: list[str] = typer.Argument(..., help="Run ids (with --root) or run folders/URLs ROOT/RUN_ID."),
    root: str | None = typer.Option(None, help="Storage root holding the runs (default: runs)."),
    vary: list[str] | None = typer.Option(
        None, "--vary", help="A config key (or section) the runs are meant to differ in; repeat for several."
    ),
    same_order: bool = typer.Option(False, "--same-order", help="The runs are meant to share one data order."),
    max_repeat: int = typer.Option(1, "--max-repeat", min=1, help="Most times one batch may be served in a row."),
    json_path: Path = typer.Option(Path("audit.json"), "--json", help="Write every row here as JSON."),
    storage_option: list[str] | None = StorageOptionsOpt,
):
    """The harness checklist of "Probe the Harness" (arXiv 2610.02911) over runs' committed data (docs/audit.md):
    idle clip, seeds and data order, configs, batches, normalizers.

    Prints one row per check and run; writes the rows to --json (default ./audit.json). Exit code 0 when no check
    fails ("not-checked" rows do not fail), 1 when one fails, 2 when a run cannot be read.
    """
    from rich.table import Table

    from mugrpo.audit import AuditOptions, audit_runs, open_run
    from mugrpo.audit.runner import CHECKS
    from mugrpo.config import ConfigError
    from mugrpo.sql import TargetError

    opts = storage_options(storage_option)
    opened = []
    for run in runs:
        run_root, run_id = split_run(run, root)
        try:
            with storage_guard(f"{run_root.rstrip('/')}/{run_id}", opts):
                opened.append(open_run(run_root, run_id, opts))
        except (FileNotFoundError, ConfigError, TargetError) as e:
            refuse(e)
    if len({r.run_id for r in opened}) != len(opened):
        refuse(ValueError("two runs given share a run id; audit runs with distinct ids"))
    report = audit_runs(opened, AuditOptions(tuple(vary or ()), same_order, max_repeat))
    for r in opened:
        r.catalog.close()
    style = {"pass": "green", "fail": "bold red", "not-checked": "yellow"}
    table = Table(title="audit: Probe the Harness (arXiv 2610.02911)")
    table.add_column("check", no_wrap=True)
    for r in opened:
        table.add_column(r.run_id)
    for name, _ in CHECKS:
        cells = []
        for r in opened:
            res = report.result(name, r.run_id)
            cells.append(f"[{style[res.status]}]{res.status}[/]" if res else "-")
        table.add_row(name, *cells)
    prints = [report.result("data-order", r.run_id) for r in opened]
    table.add_row("order fingerprint", *[(p.values.get("fingerprint") or "-")[:16] if p else "-" for p in prints])
    Console(width=max(console.width, 120)).print(table)
    for res in report.results:
        console.print(f"{res.check} {res.run} {res.status}: {res.detail}", markup=False, highlight=False)
    report.write_json(str(json_path))
    console.print(f"audit: {'ok' if report.ok else 'FAILED'}; rows written to {json_path}")
    if not report.ok:  # the check found a problem
        raise typer.Exit(ExitCode.FAILED)
