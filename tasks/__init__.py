"""Prefect tasks that launch jobs and wait for them (:mod:`tasks.jobs`), on launchers (:mod:`tasks.launchers`).

Jobs are processes (``python -m mugrpo.jobs.{kind} SPEC_URL``) that import no Prefect; this package is the only
place where a job meets Prefect: launching, log streaming, timeouts and retries.
"""

# Importing the launcher modules registers the launchers (subprocess, kubernetes).
from tasks.kubernetes import launcher as kubernetes_launcher  # noqa: F401
from tasks.launchers import subprocess_launcher  # noqa: F401
