"""One flow run per run id: a Prefect global concurrency limit ``mugrpo-run:{run id}`` of 1 slot.

Two flow runs of the same run id (a resumed run started while a stuck one still runs, a deployment triggered twice)
would launch the same jobs and write the same stage files. The run flow holds the run's slot for its whole life:

    with one_flow_run_per_run_id(cfg.run.id):
        ...

The limit is created on first use (``mugrpo-run:r1``, limit 1; see it with ``prefect gcl ls``). The slot is a
lease that the holder renews: a flow pod killed hard stops renewing and its slot frees itself once the lease
(:data:`LEASE_S`, 60 s) has expired and the server swept it, so a resumed flow run waits about a minute or two (it
gives up after :data:`WAIT_S`). Jobs a
dead flow left behind are re-attached by the kubernetes launcher, not relaunched. This complements the run lease in
object storage (reliability issue), which also covers local runs: without ``PREFECT_API_URL`` (``mugrpo run`` on
its temporary server) there is no slot.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

#: Seconds a dead holder keeps the slot (Prefect renews the lease of a live holder; 60 s is Prefect's minimum).
LEASE_S = 60.0
#: Environment variable that turns the slot off when set to ``off`` (tests that kill and resume one run in a loop:
#: each resume would wait out the killed flow's lease).
SLOT_ENV = "MUGRPO_RUN_SLOT"
#: Seconds a flow run waits for the slot before failing with TimeoutError (> LEASE_S: a dead holder's slot frees).
WAIT_S = 900.0


def run_limit_name(run_id: str) -> str:
    """Name of the run's global concurrency limit: ``mugrpo-run:{run id}`` (characters Prefect rejects -> '-')."""
    return "mugrpo-run:" + re.sub(r"[^A-Za-z0-9_.:-]", "-", run_id)


@contextmanager
def one_flow_run_per_run_id(run_id: str, *, wait_s: float = WAIT_S, lease_s: float = LEASE_S) -> Iterator[None]:
    """Hold the run's single slot (creating its limit if missing) for the ``with`` block. A failed lease renewal
    (the Prefect API briefly down) does not stop the flow: the run lease in object storage still guards the run.

    Args:
        lease_s: lease of the slot in seconds (>= 60).

    Raises:
        TimeoutError: another flow run of ``run_id`` held the slot for ``wait_s`` seconds.
    """
    from prefect import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.settings import get_current_settings

    # Only with a Prefect server that outlives the flow (deployments, PREFECT_API_URL). The temporary server of a
    # local `mugrpo run` dies with the flow process and keeps slot leases in memory: a slot held at a hard kill
    # would stay taken in its database with no lease left to expire.
    # The CLI's own temporary server (tasks/prefect_server.py) is the same case: it lives as long as the CLI.
    from tasks.prefect_server import TEMPORARY_SERVER_ENV

    temporary = os.environ.get(TEMPORARY_SERVER_ENV)
    if os.environ.get(SLOT_ENV, "").lower() == "off" or not get_current_settings().api.url or temporary:
        yield
        return
    name = run_limit_name(run_id)
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, 1)
    with concurrency(
        name,
        occupy=1,
        timeout_seconds=wait_s,
        lease_duration=lease_s,
        strict=True,
        raise_on_lease_renewal_failure=False,
    ):
        yield
