"""What a running ``mugrpo run`` owns besides the flow: the stop controller (Ctrl-C / SIGTERM) and what a stop does
in Prefect (its flow runs marked ``Cancelled``, the engine's crash lines kept off the console), the temporary Prefect
server in a session of its own, and the console filter that keeps a failure this command prints itself to one
block."""

from __future__ import annotations

import contextlib
import shlex
import sys

from mugrpo.cli.app import console, err

#: What a stopped run prints before the command that continues it (read by bench/support/chaos's stop check).
RESUME_HINT = "Continue with: mugrpo resume"
#: ... or, when the run had written nothing yet, before the command that starts it again.
RESTART_HINT = "Start it again with:"


def prefect_env() -> None:
    """Defaults for Prefect's temporary local server on a small machine (set before Prefect is imported)."""
    import os

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")


def stop_controller(cfg, uri: str):
    """The run's :class:`tasks.stops.StopController`, installed: its grace is ``orchestration.stop_grace_s``, of
    which the jobs get :func:`mugrpo.common.preemption.job_grace_s` from their SIGTERM to their SIGKILL (what the
    launchers tell them) and the cleanups the rest."""
    from tasks.stops import StopController

    options = "".join(
        f" -o {k}={v}" for k, v in sorted(cfg.run.storage_options.items()) if k in ("endpoint_url", "anon")
    )

    def hint() -> str:
        """The command that continues the run, as it stands at the stop."""
        from mugrpo.orchestration.runs import open_store

        try:
            started = open_store(cfg).exists(cfg.layout.run_json)
        except Exception:  # storage unreachable: the run may well exist
            started = True
        if started:
            return f"stopped: committed work is kept. {RESUME_HINT} {uri}{options}"
        again = shlex.join(["mugrpo", *sys.argv[1:]])
        return f"stopped before run {cfg.run.id} wrote anything. {RESTART_HINT} {again}"

    return StopController(
        cfg.orchestration.stop_grace_s, lambda line: err.print(line, markup=False, highlight=False), hint
    ).install()


def cancel_flow_runs_at_stop(stops) -> None:
    """At a stop (a cleanup of ``stops``, before the temporary Prefect server stops): mark the run's flow runs
    ``Cancelled`` in the Prefect API with the stop's message (:func:`tasks.stops.cancel_flow_runs`), within what the
    cleanups' reserve allows; one yellow line when the API did not take it (the flow run then keeps the
    ``Crashed`` Prefect's engine gave it)."""
    from tasks.stops import CANCEL_TIMEOUT_S, cancel_flow_runs

    try:
        cancel_flow_runs(stops.message(), timeout_s=min(CANCEL_TIMEOUT_S, max(stops.seconds_left() - 2.0, 0.5)))
    except Exception as e:  # noqa: BLE001 - the stop goes on: the lease, the server, the resume line
        err.print(
            f"stop: the Prefect flow run could not be marked Cancelled ({type(e).__name__}: {e})",
            style="yellow",
            markup=False,
            highlight=False,
        )


#: The lines Prefect's engine logs for a flow or task run that a signal unwound (``handle_crash`` in
#: ``prefect/flow_engine.py`` and ``prefect/task_engine.py``, the messages of
#: ``prefect.states.exception_to_crashed_state``, Prefect 3.x): a stop is no crash.
_CRASH_LINES = ("Crash detected!", "Finished in state Crashed")
_SIGNAL_CRASHES = ("aborted by an interrupt signal", "aborted by a termination signal")


def quiet_stop_crashes(stops) -> None:
    """Keep Prefect's crash lines (``Crash detected! Execution was aborted by a termination signal.``, ``Finished
    in state Crashed(...)``) off the console when a stop unwound the flow: while ``stops`` is stopping, or when the
    line names the signal (Prefect may log it before the signal's thread has counted it). The stop prints its own
    lines and the flow runs end ``Cancelled`` (:func:`cancel_flow_runs_at_stop`); a crash of any other cause is
    shown as before, and Prefect's API keeps every record. A second call (another run in this process) replaces the
    first one's filter."""
    import logging

    class _StopCrashes(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if not record.name.startswith("prefect"):
                return True
            text = record.getMessage()
            if not text.startswith(_CRASH_LINES):
                return True
            return not (stops.stopping or any(m in text for m in _SIGNAL_CRASHES))

    quiet = _StopCrashes()
    for logger in [logging.getLogger(), *map(logging.getLogger, list(logging.root.manager.loggerDict))]:
        for handler in getattr(logger, "handlers", []):  # the console only
            if isinstance(handler, logging.StreamHandler):
                for old in [f for f in handler.filters if type(f).__name__ == _StopCrashes.__name__]:
                    handler.removeFilter(old)
                handler.addFilter(quiet)


@contextlib.contextmanager
def prefect_server(stops):
    """Without ``PREFECT_API_URL``: start the temporary Prefect server in a session of its own
    (:mod:`tasks.prefect_server`: a Ctrl-C to this process group must not kill it under the flow) and point
    Prefect at it for the block; it is stopped at exit, after Prefect's own exit handlers, or by a stop."""
    import os

    from tasks.prefect_server import TEMPORARY_SERVER_ENV, TemporaryPrefectServer

    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    server = TemporaryPrefectServer()
    # at a stop, after the flow runs were marked Cancelled, within what is left of the grace
    stops.add_cleanup("temporary Prefect server", lambda: server.stop(min(5.0, max(stops.seconds_left() - 1.0, 0.5))))
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


def quiet_clean_failures(*classes: type[BaseException]) -> None:
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
