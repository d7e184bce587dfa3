"""The start gate of a pre-started job: wait for the commit markers of its inputs, then run.

A cold stage's jobs run one after another (generate k -> train k -> generate k+1 beside train k's checkpoint ->
eval k -> stage manifest k -> train k+1 ...). With ``orchestration.prestart_jobs`` the stage schedule
(:mod:`mugrpo.execution.pipeline`) launches each job while the job before it still runs: the process starts, imports
torch and transformers, starts its verifier pool and loads its datasets, then waits here until every marker of its
spec's ``start_after`` exists (:meth:`StartGate.wait`). Only then does it read its inputs, so what it computes and
commits is what a job launched after those markers would: the same files, the same resume, the same fencing. On
Kubernetes the same job is a pod created ahead and blocked on the markers.

The markers are commit points (:mod:`mugrpo.orchestration.job_specs` ``start_markers``): a job manifest, a policy
folder's ``_COMPLETE`` marker, a stage manifest. Waking up, the gate checks the run lease
(:func:`mugrpo.coordination.lease.check_fence`): a job pre-started by a writer that has since lost the run exits without
reading anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mugrpo.coordination.jobspec import JobSpec
from mugrpo.coordination.lease import check_fence
from mugrpo.storage.store import Store

#: Seconds between two looks at the store for missing markers: a local ``stat`` every 50 ms; on object storage
#: (an S3 HEAD request per marker) the pause grows by half each look up to :data:`MAX_REMOTE_POLL_S`.
POLL_S = 0.05
MAX_REMOTE_POLL_S = 0.5


class StartTimeout(RuntimeError):
    """The job's input markers did not all appear within its spec's ``start_timeout_s``."""


class StartGate:
    """The markers job ``spec`` waits for (``spec.start_after``, store paths) and the wait itself.

    Args:
        spec: the job's spec.
        store: its run's store (default ``spec.store()``).
        clock: ``time.monotonic`` (tests pass a fake one).
        sleep: ``time.sleep``.
    """

    def __init__(
        self,
        spec: JobSpec,
        store: Store | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.spec = spec
        self.store = store or spec.store()
        self._clock, self._sleep = clock, sleep

    def missing(self) -> list[str]:
        """The markers that do not exist yet (store paths), in spec order."""
        if not self.spec.start_after:
            return []
        if not self.store.is_local:
            self.store.invalidate_cache()  # s3fs caches listings: a cached one would hide a new marker
        return [m for m in self.spec.start_after if not self.store.exists(m)]

    @property
    def pending(self) -> bool:
        """Whether the job would have to wait (some marker is missing now)."""
        return bool(self.missing())

    def wait(self, say: Callable[[str], None] = lambda _: None) -> float:
        """Block until every marker exists, then check that the run lease still names this job's writer.

        Args:
            say: called with one line when the wait starts and one when it ends.

        Returns:
            ``time.monotonic()`` when the last marker was seen: the moment the job's own switch time (T_switch)
            counts from.

        Raises:
            StartTimeout: a marker was still missing after ``spec.start_timeout_s`` seconds (names it).
            mugrpo.coordination.lease.LeaseFenced: another writer took the run over while this job waited.
        """
        start = self._clock()
        missing = self.missing()
        if missing:
            say(f"waiting for {len(missing)} input(s) to be committed: {', '.join(missing)}")
        pause = POLL_S
        while missing:
            if self._clock() - start >= self.spec.start_timeout_s:
                raise StartTimeout(
                    f"{self.spec.run_id} stage {self.spec.stage}: inputs not committed after "
                    f"{self.spec.start_timeout_s:g} s: {', '.join(self.store.uri(m) for m in missing)}"
                )
            self._sleep(pause)
            if not self.store.is_local:
                pause = min(pause * 1.5, MAX_REMOTE_POLL_S)
            missing = self.missing()
        ready = self._clock()
        if self.spec.start_after:
            check_fence(self.store, self.spec.run_id, self.spec.start_after[-1])
            if ready - start > 0.0:
                say(f"inputs committed: starting after {ready - start:.1f} s ready")
        return ready
