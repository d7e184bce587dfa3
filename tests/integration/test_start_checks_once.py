"""One start of ``mugrpo run`` checks the run once: the preflight makes the resume check (the inputs hashed against
run.json) and the committed files' check, and the run flow builds on them through the run lease
(:attr:`mugrpo.coordination.lease.RunLease.cleared`, :class:`mugrpo.orchestration.runs.OpenRun`) instead of making
them again; the stage flows and helpers take the open run and check nothing.

The command line's ``mugrpo run`` in this process (:func:`mugrpo.cli.run.execute`: preflight, lease, the run flow;
not through typer's CliRunner, whose swapped streams Prefect's console handler would keep), real flows on the test
Prefect server, real job processes, on the tiny policy: a new run, then its resume, each start counted with spies
on the check functions.
"""

from __future__ import annotations

from collections import Counter

from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _tiny import RUN, tiny_config, write_config

import mugrpo.commits.verify as verify
import mugrpo.orchestration.preflight as preflight
import mugrpo.orchestration.runs as runs
from mugrpo.cli.run import execute
from mugrpo.config import config_from_dict


def test_a_start_checks_the_run_and_its_committed_files_once(tmp_path, tiny_model_dir, prefect_api, monkeypatch):
    calls: Counter[str] = Counter()

    def spy(module, name: str, counted_as: str) -> None:
        real = getattr(module, name)

        def counted(*args, **kwargs):
            calls[counted_as] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    spy(verify, "verify_run", "committed files")  # what refuse_corrupted (preflight, or the flow) runs
    spy(preflight, "check_resume", "resume check")  # the preflight's
    spy(runs, "check_resume", "resume check")  # start_run's, when it was handed no check
    config = tiny_config(
        tmp_path / "runs",
        tiny_model_dir,
        run={"num_stages": 1},
        train={"updates_per_stage": 2},
        eval={"benchmarks": []},
        tracking={"sinks": []},
    )
    cfg = config_from_dict(config, source=str(write_config(tmp_path / "tiny.yaml", config)))
    for start in ("new run", "resume of the finished run"):
        calls.clear()
        execute(cfg)  # `mugrpo run tiny.yaml` (a failure raises typer.Exit)
        assert calls == {"committed files": 1, "resume check": 1}, (start, calls)
    assert (tmp_path / "runs" / RUN / "stages/stage=0.json").is_file()
