"""One flow run per run id (flows/exclusive.py), against a real local Prefect server (tests/_prefect.py)."""

from __future__ import annotations

import contextvars
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)

from flows.exclusive import one_flow_run_per_run_id, run_limit_name

pytestmark = pytest.mark.waits  # run first, it mostly waits: a SIGKILLed flow's run slot frees after its 60 s lease

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_second_holder_of_the_same_run_id_waits_and_other_run_ids_do_not(prefect_api):
    from prefect import get_client

    run_id = f"r-{uuid.uuid4().hex[:6]}"
    held, release, second = threading.Event(), threading.Event(), []

    def first_flow_run() -> None:
        with one_flow_run_per_run_id(run_id):
            held.set()
            release.wait(30)

    # The thread runs in a copy of this context: Prefect's settings (the test server's URL) live in contextvars.
    holder = threading.Thread(target=contextvars.copy_context().run, args=(first_flow_run,))
    holder.start()
    assert held.wait(60)
    try:
        with pytest.raises(TimeoutError):
            with one_flow_run_per_run_id(run_id, wait_s=1.0):
                second.append("entered")
        with one_flow_run_per_run_id(f"{run_id}-other", wait_s=10.0):  # another run id is not blocked
            second.append("other run")
    finally:
        release.set()
        holder.join(30)
    assert second == ["other run"]
    with one_flow_run_per_run_id(run_id, wait_s=30.0):  # the slot is free again once the holder left
        second.append("after release")
    assert second[-1] == "after release"
    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name(run_limit_name(run_id)).limit == 1


def test_run_limit_names_are_valid_prefect_names():
    assert run_limit_name("gsm8k/smollm2 #3") == "mugrpo-run:gsm8k-smollm2--3"


@pytest.mark.slow
def test_the_slot_of_a_sigkilled_flow_frees_after_its_lease(prefect_api):
    """A flow pod killed hard cannot release its slot: the lease (60 s, Prefect's minimum) expires and a resumed
    flow run gets in."""
    run_id = f"r-{uuid.uuid4().hex[:6]}"
    code = (
        "import time\nfrom flows.exclusive import one_flow_run_per_run_id\n"
        f"with one_flow_run_per_run_id({run_id!r}, lease_s=60):\n    print('held', flush=True)\n    time.sleep(600)\n"
    )
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT)
    try:
        assert proc.stdout.readline().strip() == "held"
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(TimeoutError):  # the lease is still live right after the kill
        with one_flow_run_per_run_id(run_id, wait_s=0.5):
            pass
    with one_flow_run_per_run_id(run_id, wait_s=300):
        pass


def test_no_slot_without_a_prefect_server_url(monkeypatch):
    """Local `mugrpo run` (a temporary server that lives only as long as the CLI) takes no slot: no server is
    contacted."""
    import prefect
    from prefect.settings import PREFECT_API_URL, temporary_settings

    def no_server(*args, **kwargs):
        raise AssertionError("contacted a Prefect server")

    monkeypatch.setattr(prefect, "get_client", no_server)
    with temporary_settings(updates={PREFECT_API_URL: None}):
        with one_flow_run_per_run_id("local-run", wait_s=0.1):
            pass
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):  # with a URL it is contacted
        with pytest.raises(AssertionError, match="contacted"):
            with one_flow_run_per_run_id("local-run", wait_s=0.1):
                pass
        # ... unless it is the CLI's own temporary server (tasks/prefect_server.py), which lives as long as the CLI
        from tasks.prefect_server import TEMPORARY_SERVER_ENV

        monkeypatch.setenv(TEMPORARY_SERVER_ENV, "http://127.0.0.1:9/api")
        with one_flow_run_per_run_id("local-run", wait_s=0.1):
            pass
