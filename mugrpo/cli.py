"""The ``mugrpo`` command line. Each command imports its machinery lazily so ``mugrpo --help`` stays fast."""

from __future__ import annotations

import contextlib
import shlex
import sys
from pathlib import Path

import typer
from rich.console import Console

from mugrpo.storage.cli_support import storage_guard

app = typer.Typer(
    help=(
        "mugrpo: staged RL with verifiable rewards (Mu-GRPO). A run is K stages; each stage samples a large rollout "
        "set from the frozen policy, stores it as Parquet, then trains many updates on it.\n\n"
        "Start with `mugrpo config show CONFIG` to see every setting, then `mugrpo run CONFIG`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect and validate configs.", no_args_is_help=True)
data_app = typer.Typer(help="Inspect prompt datasets.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(data_app, name="data")

# soft_wrap: long lines (paths, YAML, commands to copy) are never broken at the terminal width, so piped output
# stays machine-readable.
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

OverridesArg = typer.Argument(None, help="Dotted overrides applied after the file, e.g. train.lr=1e-6 run.id=exp2.")
StorageOptionsOpt = typer.Option(
    None, "--storage-option", "-o", help="fsspec option KEY=VALUE (e.g. endpoint_url=http://127.0.0.1:9000)."
)


def _storage_options(pairs: list[str] | None) -> dict:
    from mugrpo.sql.cli import parse_storage_options

    return parse_storage_options(pairs)


def _load(config: Path | None, overrides: list[str] | None):
    from mugrpo.config import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as e:
        err.print(f"Error: {e}", style="red", markup=False, highlight=False)  # "[gym]" in a pip command: no markup
        raise typer.Exit(2) from None


@config_app.command("show")
def config_show(
    config: Path | None = typer.Argument(None, help="YAML config; omit for the defaults."),
    overrides: list[str] | None = OverridesArg,
):
    """Print the fully resolved config (defaults + file + overrides) as YAML."""
    import yaml

    cfg = _load(config, overrides)
    typer.echo(yaml.safe_dump(cfg.to_json_dict(), sort_keys=False, width=10_000), nl=False)


@config_app.command("reference")
def config_reference_cmd():
    """Print the config reference (every key with type, default and description) as Markdown."""
    from mugrpo.config.docs import config_reference

    typer.echo(config_reference())


@data_app.command("check")
def data_check(
    config: Path | None = typer.Argument(None, help="YAML config whose train and eval datasets to load."),
    overrides: list[str] | None = OverridesArg,
):
    """Load the train set and every eval benchmark; print rows, problems, duplicates and skips."""
    from mugrpo.data.datasets import DatasetError, load_problems

    cfg = _load(config, overrides)
    sets = [cfg.data.train] + [b.dataset for b in cfg.eval.benchmarks]
    for ds in sets:
        try:
            problems, report = load_problems(ds)
        except DatasetError as e:
            err.print(f"[red]{e}[/red]")
            raise typer.Exit(1) from None
        console.print(f"[bold]{ds.name}[/bold] {report.summary()}")
        if problems:
            console.print(f"  first: {problems[0].question[:80]!r} -> gold {problems[0].ground_truth!r}", markup=False)


def _prefect_env() -> None:
    """Defaults for Prefect's temporary local server on a small machine (set before Prefect is imported)."""
    import os

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")


def split_run(run: str, root: str | None) -> tuple[str, str]:
    """``RUN`` is a run id (with --root, default 'runs') or a run folder/URL ``ROOT/RUN_ID``. A run id that is not
    one (``../ref`` with --root) is refused: one block naming it, exit 2."""
    from mugrpo.storage.layout import validate_run_id

    if root is None and "/" in run.rstrip("/"):
        parent, _, run_id = run.rstrip("/").rpartition("/")
    else:
        parent, run_id = root or "runs", run
    try:
        validate_run_id(run_id)
    except ValueError as e:
        given = f"{run!r} with --root {root}" if root is not None else repr(run)
        _refuse(ValueError(f"{given}: {e}; pass a run id with --root, or the run's folder ROOT/RUN_ID without it"))
    return parent, run_id


def _stored_config(run: str, root: str | None, storage_options: dict | None = None):
    """The config in a run's run.json; exits with a clear message when the run or its storage cannot be read."""
    from mugrpo.config import ConfigError
    from mugrpo.orchestration.runs import load_run_config
    from mugrpo.storage.errors import check_store
    from mugrpo.storage.store import Store

    root, run_id = split_run(run, root)
    try:
        with storage_guard(f"{root.rstrip('/')}/{run_id}", storage_options):
            check_store(Store(root, storage_options), f"{root.rstrip('/')}/{run_id}")
            return load_run_config(root, run_id, storage_options)
    except ConfigError as e:  # a key this version no longer has: named with the file
        _refuse(e)
    except FileNotFoundError as e:
        folder = Store(root).listdir(run_id) if Store(root).exists(run_id) else []
        inside = [n for n in folder if Store(root).exists(f"{run_id}/{n}/run.json")]
        if inside:
            err.print(
                f"{root}/{run_id} is a folder of runs; pass one of: "
                + ", ".join(f"{root}/{run_id}/{n}" for n in inside)
            )
        else:
            err.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None


def _refuse(e: Exception) -> None:
    """Print a refusal (:class:`mugrpo.orchestration.resume.RunRefused`, a config error) once, as one block, and exit
    2."""
    err.print(f"Error: {e}", style="red", markup=False, highlight=False)
    raise typer.Exit(2) from None


def _check_resume(store, cfg) -> None:
    """Refuse (exit 2) a run that cannot start or continue with ``cfg``
    (:func:`mugrpo.orchestration.resume.check_resume`)."""
    from mugrpo.config import ConfigError
    from mugrpo.orchestration.resume import RunRefused, check_resume

    try:
        check_resume(store, cfg)
    except (RunRefused, ConfigError) as e:
        _refuse(e)


def _execute(cfg) -> None:
    _prefect_env()
    from mugrpo.coordination.lease import RunLease, RunLeaseHeld, live_holder
    from mugrpo.data.datasets import check_heldout_disjoint
    from mugrpo.inspection.verify import CorruptedRunError, refuse_corrupted
    from mugrpo.orchestration.runs import open_store
    from mugrpo.storage.errors import check_store, check_writable
    from mugrpo.storage.store import StorageError

    try:  # reasoning-gym benchmarks of the training task: no question text shared with training
        check_heldout_disjoint(cfg.data.train, [b.dataset for b in cfg.eval.benchmarks])
    except ValueError as e:
        err.print(f"Error: {e}", style="red", markup=False, highlight=False)
        raise typer.Exit(2) from None
    store = open_store(cfg)
    uri = store.uri(cfg.run.id)
    # Every refusal happens here, before Prefect starts and before anything is written (docs/reliability.md,
    # "Refusals"): one block, printed once, exit 2 (what was asked is wrong) or 3 (the run's state refuses it).
    with storage_guard(uri, cfg.run.storage_options):  # fail fast, before Prefect's server starts
        check_store(store, uri)
        holder = live_holder(store, cfg.run.id)
    if holder is not None and cfg.orchestration.lease_wait_s == 0:  # the flow takes the lease; refuse early here
        _refuse_state(
            f"run {cfg.run.id} at {uri} is being written by {holder}; two writers would commit over each other. "
            "Wait for it to finish or stop it (a dead writer's lease expires after orchestration.lease_ttl_s)."
        )
    with storage_guard(uri, cfg.run.storage_options):
        _check_resume(store, cfg)  # a changed config or input is refused here, once, before Prefect is imported
        _check_epoch(cfg)
        if cfg.orchestration.verify_on_resume:
            try:
                refuse_corrupted(store, cfg.run.id, cfg.run.num_stages)
            except CorruptedRunError as e:
                _refuse_state(str(e))
        check_writable(store, cfg.run.id, uri)  # permission denied, read-only or full: one line, exit 2
    lease = RunLease(
        store, cfg.run.id, ttl_s=cfg.orchestration.lease_ttl_s, wait_s=cfg.orchestration.lease_wait_s
    )  # taken here, so two `mugrpo run` started together never both reach Prefect (the flow runs under it)
    stops = _stop_controller(cfg, uri)  # Ctrl-C / SIGTERM from here on: bounded, clean stop (tasks/stops.py)
    try:
        try:
            with storage_guard(uri, cfg.run.storage_options):
                lease.acquire()
        except RunLeaseHeld as e:
            _refuse_state(str(e))
        except StorageError as e:  # e.g. the disk filled between the probe and the lease: no temporary file is left
            err.print(f"Error: cannot take the run lease of {uri}: {e}", style="red", markup=False, highlight=False)
            raise typer.Exit(2) from None
        stops.add_cleanup("run lease", lease.release)  # fenced: a lease taken over meanwhile is left alone
        try:
            with _prefect_server(stops):
                _run_flow(cfg, uri)
        finally:
            if not stops.stopping:
                lease.release()
    except BaseException:
        if stops.stopping:  # the flow unwound after Ctrl-C / SIGTERM (KeyboardInterrupt, Prefect's TerminationSignal)
            stops.finish()  # (never returns)
        raise
    finally:
        stops.uninstall()  # the run ended (done, failed or refused): signals are this process's again


def _stop_controller(cfg, uri: str):
    """The run's :class:`tasks.stops.StopController`, installed: its grace is ``orchestration.stop_grace_s``."""
    from tasks.stops import StopController

    options = "".join(
        f" -o {k}={v}" for k, v in sorted(cfg.run.storage_options.items()) if k in ("endpoint_url", "anon")
    )

    def hint() -> str:
        """The command that continues the run, as it stands at the stop."""
        from mugrpo.orchestration.runs import open_store
        from mugrpo.storage.layout import RunLayout

        try:
            started = open_store(cfg).exists(RunLayout(cfg.run.id).run_json)
        except Exception:  # storage unreachable: the run may well exist
            started = True
        if started:
            return f"stopped: committed work is kept. Continue with: mugrpo resume {uri}{options}"
        again = shlex.join(["mugrpo", *sys.argv[1:]])
        return f"stopped before run {cfg.run.id} wrote anything. Start it again with: {again}"

    return StopController(
        cfg.orchestration.stop_grace_s, lambda line: err.print(line, markup=False, highlight=False), hint
    ).install()


@contextlib.contextmanager
def _prefect_server(stops):
    """Without ``PREFECT_API_URL``: start the temporary Prefect server in a session of its own
    (:mod:`tasks.prefect_server`: a Ctrl-C to this process group must not kill it under the flow) and point
    Prefect at it for the block; it is stopped at exit, after Prefect's own exit handlers, or by a stop."""
    import os

    from tasks.prefect_server import TEMPORARY_SERVER_ENV, TemporaryPrefectServer

    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    server = TemporaryPrefectServer()
    stops.add_cleanup("temporary Prefect server", server.stop)
    console.print("starting the temporary Prefect server (set PREFECT_API_URL to use a running one)")
    url = server.start(stopping=lambda: stops.stopping)
    in_process = "prefect" in sys.modules  # imported already (the CLI invoked in a test's process): settings read
    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", TEMPORARY_SERVER_ENV)}
    os.environ["PREFECT_API_URL"] = url  # read by Prefect when the flow imports it (and kept for its exit handlers)
    os.environ[TEMPORARY_SERVER_ENV] = url
    with contextlib.ExitStack() as stack:
        if in_process:
            from prefect.settings import PREFECT_API_URL, temporary_settings

            stack.enter_context(temporary_settings(updates={PREFECT_API_URL: url}))
        try:
            yield
        finally:
            if in_process:  # the caller's process goes on: its environment as it was
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v


def _refuse_state(message: str) -> None:
    """Print a refusal the run's state causes (another writer, corrupted committed data) once, exit 3."""
    err.print(f"Error: {message}", style="red", markup=False, highlight=False)
    raise typer.Exit(3)


def _check_epoch(cfg) -> None:
    """Refuse (exit 2) a stage that asks for more prompts than the training set holds: it would sample some prompt
    twice in one stage (:func:`mugrpo.provenance.prompt_plan.check_stage_prompts`)."""
    from mugrpo.data.datasets import DatasetError, load_problems
    from mugrpo.provenance.prompt_plan import PlanError, check_stage_prompts
    from mugrpo.schedules.stages import stage_plan

    try:
        problems, _ = load_problems(cfg.data.train)
        for k in range(cfg.run.num_stages):
            check_stage_prompts(stage_plan(cfg, k).num_prompts, len(problems), k, cfg.data.train)
    except (PlanError, DatasetError) as e:
        _refuse(e)


def _quiet_clean_failures(*classes: type[BaseException]) -> None:
    """Keep Prefect from logging a traceback (and its "Finished in state Failed" lines) for a failure this command
    prints itself as one block: a refusal, a lost lease, corrupted data, a storage write that failed, a failed job.
    Any other exception is logged by Prefect as before."""
    import logging
    import re

    names: set[str] = set()
    todo = list(classes)
    while todo:
        cls = todo.pop()
        if cls.__name__ not in names:
            names.add(cls.__name__)
            todo.extend(cls.__subclasses__())

    def clean(exc: BaseException | None) -> bool:
        while exc is not None:
            if type(exc).__name__ in names:
                return True
            exc = exc.__cause__ or exc.__context__
        return False

    in_error: set[str] = set()

    class _Filter(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.exc_info and clean(record.exc_info[1]):
                return False
            if record.levelno < logging.INFO or not record.name.startswith("prefect"):
                return True
            text = record.getMessage()
            launched = re.match(r"launching (\w+) job", text)
            if launched:  # a new attempt (a retry after an error that exit code 1 allowed): its lines are shown
                in_error.discard(launched.group(1))
            job = re.match(r"\[(\w+)\] ", text)
            if job and text.startswith("error: ", job.end()):  # a job's own error block: this command prints it
                in_error.add(job.group(1))  # once; the job exits right after it, so its next lines are that block
            if job and job.group(1) in in_error:
                return False
            failure = any(
                m in text for m in ("Encountered exception", "Finished in state Failed", "failed with exception")
            )
            return not (failure and any(f"{n}(" in text or f"{n}:" in text for n in names))

    quiet = _Filter()
    for logger in [logging.getLogger(), *map(logging.getLogger, list(logging.root.manager.loggerDict))]:
        for handler in getattr(logger, "handlers", []):  # the console only: Prefect's API keeps every record
            if isinstance(handler, logging.StreamHandler) and quiet not in handler.filters:
                handler.addFilter(quiet)


#: What a fenced job's refusal says (mugrpo.coordination.lease.check_fence).
_FENCED = "refusing to commit"


def _taken_over(cfg, uri: str, detail: str) -> None:
    """Print, as one block with exit code 3, that this writer's run was taken over: by whom (the lease's holder
    now) and whether the run is already complete; never advise a resume of a run another writer holds or finished."""
    from mugrpo.coordination.lease import LeaseRecord
    from mugrpo.orchestration.runs import open_store, run_status
    from mugrpo.storage.layout import RunLayout

    store = open_store(cfg)
    try:
        current = store.read_versioned(RunLayout(cfg.run.id).lease)
        holder = LeaseRecord.from_bytes(current[0], uri).owner if current else "another writer (its lease is gone)"
        complete = run_status(store, cfg).complete
    except Exception:  # noqa: BLE001 - the message below stands without these details
        holder, complete = "another writer", False
    state = (
        "the run is complete: nothing is left to do"
        if complete
        else f"it continues the run; watch it with `mugrpo status {uri}`"
    )
    err.print(
        f"Error: run {cfg.run.id} at {uri} was taken over by {holder} while this writer ran; {state}. This writer "
        f"stopped and committed nothing more. ({detail.splitlines()[0]})",
        style="red",
        markup=False,
        highlight=False,
    )
    raise typer.Exit(3)


def _run_flow(cfg, uri: str) -> None:
    from flows.run import run_flow
    from mugrpo.coordination.lease import LeaseFenced, RunLeaseHeld
    from mugrpo.inspection.verify import CorruptedRunError
    from mugrpo.orchestration.resume import RunRefused
    from mugrpo.storage.store import StorageError
    from tasks.launchers.errors import JobError

    console.print(f"[bold]run {cfg.run.id}[/bold] lives at {uri}")
    console.print(f"  watch it:  mugrpo status {uri}")
    console.print("  (for the Prefect UI, start `prefect server start` and set PREFECT_API_URL before `mugrpo run`)")
    console.print(f'  query it:  mugrpo sql {uri} "SELECT stage, avg(reward) FROM rollouts GROUP BY ALL"')
    from mugrpo.common.progress import quiet_library_bars
    from mugrpo.provenance.refusals import RunRefused as Refused

    _quiet_clean_failures(Refused, RunLeaseHeld, LeaseFenced, CorruptedRunError, StorageError, JobError)
    quiet_library_bars()  # the flow process converts the initial policy (GGUF -> HF): no bar frames in a log
    try:
        result = run_flow(config=cfg.to_json_dict())
    except RunRefused as e:
        _refuse(e)
    except LeaseFenced as e:
        _taken_over(cfg, uri, str(e))
    except (RunLeaseHeld, CorruptedRunError) as e:
        err.print(f"Error: {e}", style="red", markup=False, highlight=False)
        raise typer.Exit(3) from None
    except JobError as e:
        refusal = getattr(e, "refusal", None)
        if refusal is not None and _FENCED in refusal:  # a job of this writer was fenced: the run was taken over
            _taken_over(cfg, uri, refusal)
        if refusal is not None:  # the job refused (a changed input, a plan): its block, once, with the table's code
            err.print(
                f"Error: run {cfg.run.id} stopped: {e.kind} job refused: {refusal}",
                style="red",
                markup=False,
                highlight=False,
            )
            raise typer.Exit(2) from None
        err.print(f"run {cfg.run.id} stopped: {e}", style="red", markup=False, highlight=False)
        err.print(f"committed work is kept; after fixing the cause, continue with `mugrpo resume {uri}`.")
        raise typer.Exit(1) from None
    except StorageError as e:  # a write of the flow itself failed (a full disk): it names the file
        err.print(
            f"Error: run {cfg.run.id} stopped: {e}\ncommitted work is kept and no temporary file is left; after "
            f"fixing the cause (free space), continue with `mugrpo resume {uri}`.",
            style="red",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(1) from None
    console.print(f"[green]run {cfg.run.id} complete[/green] in {result['seconds']:.0f} s: {uri}")
    if result["final_eval"]:
        console.print("  final policy: " + "  ".join(f"{k}={v:.3f}" for k, v in sorted(result["final_eval"].items())))
    console.print(f"  report:    {result['report']}")


@app.command("run")
def run_cmd(
    config: Path = typer.Argument(..., help="YAML config, e.g. configs/gsm8k-smollm2.yaml."),
    overrides: list[str] | None = OverridesArg,
):
    """Start a run, or continue it if its run.id already exists (committed work is skipped).

    Each stage is a Prefect flow: generate -> train -> eval -> manifest. Prefect's temporary local server starts by
    itself unless PREFECT_API_URL points at a server.
    """
    _execute(_load(config, overrides))


@app.command("resume")
def resume_cmd(
    run: str = typer.Argument(..., help="Run id (with --root) or run folder/URL ROOT/RUN_ID."),
    overrides: list[str] | None = typer.Argument(
        None, help="Operational key=value overrides, e.g. generation.workers=2 (semantic keys are refused)."
    ),
    root: str | None = typer.Option(None, help="Storage root holding the run (default: runs)."),
    storage_option: list[str] | None = StorageOptionsOpt,
):
    """Continue a run with the config stored in its run.json.

    Operational settings (where and how it runs: workers, interpreters, timeouts, retries, storage, lease,
    tracking) may be changed with key=value overrides; each change is recorded in run.json's history with the
    stage it took effect. Semantic settings (model, data, seeds, algorithm, sizes) are fixed for the life of a run:
    an override of one is refused (exit 2). `mugrpo config reference` shows each key's class.
    """
    from mugrpo.config import ConfigError
    from mugrpo.orchestration.resume import RunRefused, resume_config
    from mugrpo.orchestration.runs import open_store

    stored = _stored_config(run, root, _storage_options(storage_option))
    try:
        cfg = resume_config(stored, overrides or [], open_store(stored).uri(stored.run.id))
    except (RunRefused, ConfigError) as e:
        _refuse(e)
    _execute(cfg)


@app.command("status")
def status_cmd(
    run: str = typer.Argument(..., help="Run id (with --root) or run folder/URL ROOT/RUN_ID."),
    root: str | None = typer.Option(None, help="Storage root holding the run (default: runs)."),
    storage_option: list[str] | None = StorageOptionsOpt,
):
    """Show what a run has committed, what is left, and the timings of each stage."""
    from rich.table import Table

    from mugrpo.orchestration.runs import health_line, open_store, run_status

    cfg = _stored_config(run, root, _storage_options(storage_option))
    with storage_guard(open_store(cfg).uri(cfg.run.id), cfg.run.storage_options):
        st = run_status(open_store(cfg), cfg)
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
            "committed" if s.committed else "pending",
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
    if st.latest_update is not None:
        console.print(health_line(st.latest_update))
    left = [s.stage for s in st.stages if not s.committed]
    console.print(
        "complete"
        if st.complete
        else f"left: stages {left or 'none'}{'' if st.final_eval else ' + final eval'} -> mugrpo resume {st.uri}"
    )


@app.command("verify")
def verify_cmd(
    run: str = typer.Argument(..., help="Run id (with --root) or run folder/URL ROOT/RUN_ID."),
    root: str | None = typer.Option(None, help="Storage root holding the run (default: runs)."),
    storage_option: list[str] | None = StorageOptionsOpt,
):
    """Re-hash every committed file of a run against its manifests; per stage: intact, corrupted or missing.

    Exit code 0 when every committed file is intact, 1 when a file is corrupted or missing (the lines name them
    and how to recover), 2 when the run cannot be read.
    """
    from rich.table import Table

    from mugrpo.inspection.verify import verify_run
    from mugrpo.orchestration.runs import open_store

    cfg = _stored_config(run, root, _storage_options(storage_option))
    store = open_store(cfg)
    with storage_guard(store.uri(cfg.run.id), cfg.run.storage_options):
        report = verify_run(store, cfg.run.id, cfg.run.num_stages)
    table = Table(title=f"verify {store.uri(cfg.run.id)}")
    for col in ("stage", "committed", "files", "intact", "corrupted", "missing"):
        table.add_column(col, justify="right", no_wrap=True)
    for s in report.stages:
        table.add_row(
            s.label,
            (", ".join(s.holds) or "not yet") if s.label == "final" else ("yes" if s.committed else "no"),
            str(s.files),
            str(len(s.intact)),
            str(len(s.corrupted)),
            str(len(s.missing)),
        )
    Console(width=max(console.width, 120)).print(table)
    for line in report.problems():
        err.print(line, markup=False, highlight=False)
    if not report.ok:
        raise typer.Exit(1)
    console.print(f"intact: {report.total_files} files, {report.total_bytes / 2**20:.1f} MiB re-hashed")


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
    given = _storage_options(storage_option)
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
        raise typer.Exit(2) from None
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

    opts = _storage_options(storage_option)
    opened = []
    for run in runs:
        run_root, run_id = split_run(run, root)
        try:
            with storage_guard(f"{run_root.rstrip('/')}/{run_id}", opts):
                opened.append(open_run(run_root, run_id, opts))
        except (FileNotFoundError, ConfigError, TargetError) as e:
            _refuse(e)
    if len({r.run_id for r in opened}) != len(opened):
        _refuse(ValueError("two runs given share a run id; audit runs with distinct ids"))
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
    if not report.ok:
        raise typer.Exit(1)


def _register_subsystems() -> None:
    from mugrpo.inspection.environment import register_cli as register_env
    from mugrpo.lab.cli import register_cli as register_lab
    from mugrpo.sql.cli import register_cli as register_sql

    register_sql(app)
    register_lab(app)
    register_env(app)


_register_subsystems()


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
