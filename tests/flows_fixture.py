"""A stand-in flow for the deployment test of the process work pool fixture (tests/_prefect.py): it launches the
stand-in job (tests/jobs_fixture.py) through the real run_job task, as the run/stage flows launch real jobs."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from tasks.jobs import run_job

TESTS_DIR = Path(__file__).resolve().parent


@flow(name="launcher-deployment-test")
def job_flow(spec_url: str) -> int:
    """Run the stand-in job on ``spec_url``; returns its exit code (0)."""
    result = run_job("standin", spec_url, module="jobs_fixture", env={"PYTHONPATH": str(TESTS_DIR)}, timeout_s=120)
    return result.exit_code
