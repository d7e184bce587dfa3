"""``mugrpo run`` and ``mugrpo resume``: preflight (:mod:`mugrpo.orchestration.preflight`), the run lease, the stop
controller and the temporary Prefect server around the run flow, and one block for each way it can end."""

from __future__ import annotations

from pathlib import Path

import typer

from mugrpo.cli.app import (
    OverridesArg,
    StorageOptionsOpt,
    app,
    console,
    err,
    load_or_exit,
    refuse,
    storage_options,
    stored_config,
)
from mugrpo.cli.lifecycle import (
    cancel_flow_runs_at_stop,
    prefect_env,
    prefect_server,
    quiet_clean_failures,
    quiet_stop_crashes,
    stop_controller,
)
from mugrpo.storage.cli_support import storage_guard


def execute(cfg) -> None:
    """Preflight, then the run flow under the run lease, the stop controller and the temporary Prefect server.

    A stop (Ctrl-C, SIGTERM: :mod:`tasks.stops`) gives the running jobs their share of
    ``orchestration.stop_grace_s`` to save their work, then releases the lease, marks the flow runs ``Cancelled``
    in the Prefect API, stops the temporary server, prints the resume command and exits 130 / 143."""
    prefect_env()
    from mugrpo.common.exit_codes import exit_code_of
    from mugrpo.config.precision import describe
    from mugrpo.coordination.lease import RunLease, RunLeaseHeld
    from mugrpo.orchestration.preflight import Refusal, preflight
    from mugrpo.storage.store import LocalLockTimeout, StorageError

    # Every refusal happens here, before Prefect starts and before anything is written (docs/reliability.md,
    # "Refusals"): one block, printed once, exit 2 (what was asked is wrong) or 3 (the run's state refuses it), the
    # code the refusal carries (mugrpo.common.exit_codes).
    try:
        cleared = preflight(cfg)
    except Refusal as e:
        err.print(f"Error: {e.message}", style="red", markup=False, highlight=False)
        raise typer.Exit(exit_code_of(e)) from None
    store, uri, precision = cleared.store, cleared.uri, cleared.check.precision
    if precision is not None:  # what the run computes in, and why, said by the preflight that resolved it (once;
        # the flow builds on this check through the lease and does not repeat it)
        console.print(describe(precision.record), markup=False, highlight=False)
        if precision.warning:
            err.print(precision.warning, style="bold yellow", markup=False, highlight=False)
    lease = RunLease(
        store, cfg.run.id, ttl_s=cfg.orchestration.lease_ttl_s, wait_s=cfg.orchestration.lease_wait_s
    )  # taken here, so two `mugrpo run` started together never both reach Prefect (the flow runs under it)
    stops = stop_controller(cfg, uri)  # Ctrl-C / SIGTERM from here on: bounded, clean stop (tasks/stops.py)
    try:
        try:
            with storage_guard(uri, cfg.run.storage_options):
                lease.acquire()
        except (RunLeaseHeld, LocalLockTimeout) as e:  # another writer: live, or frozen inside a commit (3)
            refuse(e)
        except StorageError as e:  # e.g. the disk filled between the probe and the lease: no temporary file is left;
            # before the run starts, a storage fault is a refusal, as preflight's (2)
            refuse(Refusal(f"cannot take the run lease of {uri}: {e}"))
        stops.add_cleanup("run lease", lambda: _release(lease))  # fenced: a lease taken over is left alone
        # a stop is no crash: the flow runs end Cancelled with the resume command (before the server stops)
        stops.add_cleanup("Prefect flow runs", lambda: cancel_flow_runs_at_stop(stops))
        lease.cleared = cleared  # the flow builds on these checks instead of making them again
        try:
            with prefect_server(stops):
                _run_flow(cfg, uri, stops)
        finally:
            if not stops.stopping:
                _release(lease)
    except BaseException:
        if stops.stopping:  # the flow unwound after Ctrl-C / SIGTERM (KeyboardInterrupt, Prefect's TerminationSignal)
            stops.finish()  # (never returns)
        raise
    finally:
        stops.uninstall()  # the run ended (done, failed or refused): signals are this process's again


def _release(lease) -> None:
    """Release the run lease; one line when it cannot be (a root turned read-only): it expires by itself."""
    line = lease.release()
    if line is not None:
        err.print(line, style="yellow", markup=False, highlight=False)


#: What a fenced job's refusal says (mugrpo.coordination.lease.check_fence).
_FENCED = "refusing to commit"


def _taken_over(cfg, uri: str, detail: str) -> None:
    """Print, as one block with exit code 3, that this writer's run was taken over: by whom (the lease's holder
    now) and whether the run is already complete; never advise a resume of a run another writer holds or finished."""
    from mugrpo.common.exit_codes import exit_code_for
    from mugrpo.coordination.lease import LeaseFenced, LeaseRecord
    from mugrpo.orchestration.runs import open_store, run_status

    store = open_store(cfg)
    try:
        current = store.read_versioned(cfg.layout.lease)
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
    raise typer.Exit(exit_code_for(LeaseFenced))


def _run_flow(cfg, uri: str, stops) -> None:
    from flows.run import run_flow
    from mugrpo.commits.verify import CorruptedRunError
    from mugrpo.common.exit_codes import exit_code_for, exit_code_of
    from mugrpo.coordination.lease import LeaseFenced, RunLeaseHeld
    from mugrpo.orchestration.resume import RunRefused
    from mugrpo.storage.store import StorageError
    from tasks.launchers.errors import JobError

    console.print(f"[bold]run {cfg.run.id}[/bold] lives at {uri}")
    console.print(f"  watch it:  mugrpo status {uri}")
    console.print("  (for the Prefect UI, start `prefect server start` and set PREFECT_API_URL before `mugrpo run`)")
    console.print(f'  query it:  mugrpo sql {uri} "SELECT stage, avg(reward) FROM rollouts GROUP BY ALL"')
    from mugrpo.common.progress import quiet_library_bars
    from mugrpo.provenance.refusals import RunRefused as Refused

    quiet_clean_failures(Refused, RunLeaseHeld, LeaseFenced, CorruptedRunError, StorageError, JobError)
    quiet_stop_crashes(stops)  # a stop unwinds the flow: not a crash (tasks/stops.py)
    quiet_library_bars()  # the flow process converts the initial policy (GGUF -> HF): no bar frames in a log
    try:
        result = run_flow(config=cfg.to_json_dict())
    except RunRefused as e:
        refuse(e)
    except LeaseFenced as e:
        _taken_over(cfg, uri, str(e))
    except (RunLeaseHeld, CorruptedRunError) as e:
        refuse(e)
    except JobError as e:
        refusal = getattr(e, "refusal", None)
        if refusal is not None and _FENCED in refusal:  # a job of this writer was fenced: the run was taken over
            _taken_over(cfg, uri, refusal)
        if refusal is not None:  # the job refused (a changed input, a plan): its block, once, as a refusal of the
            # run (a job says only that it refused, with exit 2: the code of a RunRefused in the table)
            refuse(RunRefused(f"run {cfg.run.id} stopped: {e.kind} job refused: {refusal}"))
        # The job's lines reached the console as they came (its traceback, once): the block adds its last line
        # (the error, naming the file), or its own error block, which the console filter kept for this block.
        said = _job_said(e)
        err.print(
            f"Error: run {cfg.run.id} stopped: {getattr(e, 'summary', str(e))}\n{said}\ncommitted work is kept; "
            f"after fixing the cause{_fix_hint(said)}, continue with `mugrpo resume {uri}`.",
            style="red",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(exit_code_of(e)) from None
    except StorageError as e:  # a write of the flow itself failed (a full disk): it names the file
        err.print(
            f"Error: run {cfg.run.id} stopped: {e}\ncommitted work is kept and no temporary file is left; after "
            f"fixing the cause{_fix_hint(str(e))}, continue with `mugrpo resume {uri}`.",
            style="red",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(exit_code_for(StorageError)) from None  # any storage error of the flow's own writes: 1
    console.print(f"[green]run {cfg.run.id} complete[/green] in {result['seconds']:.0f} s: {uri}")
    if result["final_eval"]:
        console.print(f"  final policy: {_final_line(result['final_eval'])}", markup=False, highlight=False)
    console.print(f"  report:    {result['report']}")


def _job_said(e) -> str:
    """What a failed job said last: its own error block (``error: ...`` and what follows, which
    :func:`~mugrpo.cli.lifecycle.quiet_clean_failures` keeps off the console for this block), else its last line
    (a traceback's exception, naming the file)."""
    lines = [line for line in getattr(e, "last_lines", ()) if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    if starts:
        return "\n".join(lines[starts[-1] :])
    return f"its last line: {lines[-1].strip()}" if lines else "it printed nothing"


def _fix_hint(text: str) -> str:
    """`` (free space)`` or `` (make the root writable)`` when ``text`` names that cause."""
    if any(m in text for m in ("No space left on device", "Disk quota exceeded", "File too large")):
        return " (free space)"
    if "Read-only file system" in text:
        return " (make the root writable)"
    return ""


@app.command("run")
def run_cmd(
    config: Path = typer.Argument(..., help="YAML config, e.g. configs/smollm2-arithmetic.yaml."),
    overrides: list[str] | None = OverridesArg,
):
    """Start a run, or continue it if its run.id already exists (committed work is skipped).

    Each stage is a Prefect flow: generate -> train -> eval -> manifest. Prefect's temporary local server starts by
    itself unless PREFECT_API_URL points at a server.
    """
    execute(load_or_exit(config, overrides))


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

    stored = stored_config(run, root, storage_options(storage_option))
    try:
        cfg = resume_config(stored, overrides or [], open_store(stored).uri(stored.run.id))
    except (RunRefused, ConfigError) as e:
        refuse(e)
    execute(cfg)


def _final_line(metrics: dict[str, float]) -> str:
    """``bench avg@k=x [low, high]`` per benchmark (the CI bounds folded in), then the other metrics as they are."""
    shown = []
    for key in sorted(metrics):
        if key.endswith(("_ci95_low", "_ci95_high")):
            continue
        low, high = metrics.get(f"{key}_ci95_low"), metrics.get(f"{key}_ci95_high")
        ci = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        shown.append(f"{key}={metrics[key]:.3f}{ci}")
    return "  ".join(shown)
