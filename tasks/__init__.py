"""Prefect tasks that launch jobs and wait for them (:mod:`tasks.jobs`), on launchers (:mod:`tasks.launchers`).

Jobs are processes (``python -m mugrpo.jobs.{kind} SPEC_URL``) that import no Prefect; this package is the only
place where a job meets Prefect: launching, log streaming, timeouts and retries.
"""

from tasks import kubernetes, launchers  # noqa: F401  (importing registers the launchers: subprocess, kubernetes)
