"""Storage faults a user can fix get one clear line, in every command that reads a run (real moto S3 server).

Kinds: an endpoint that nobody listens on, a bucket that does not exist, credentials the server refuses, and no
credentials at all. moto checks signatures only when its ``INITIAL_NO_AUTH_ACTION_COUNT`` setting is 0; the server
runs in this process, so the tests that need authentication switch it on for their duration.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import uuid

import pytest
from _s3 import moto_server, s3_root  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from mugrpo.cli import app
from mugrpo.storage.errors import StorageUnavailable, check_store, explain_storage_error
from mugrpo.storage.store import Store

pytestmark = pytest.mark.waits  # run first, it mostly waits: a dead S3 endpoint is named once the retries are spent

runner = CliRunner()


@pytest.fixture(autouse=True)
def _quiet_moto_request_log():
    """moto's server logs every request through werkzeug; when an earlier test in this process ran a flow, Prefect's
    console handler (bound to a stream CliRunner has since closed) would print '--- Logging error ---' into the
    captured output. The request log is not what these tests look at."""
    logger = logging.getLogger("werkzeug")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nobody listens there


@pytest.fixture
def dead_endpoint(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # no retries: the connection is refused at once
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")
    return f"http://127.0.0.1:{_closed_port()}"


@pytest.fixture
def auth_required(moto_server, monkeypatch):  # noqa: F811
    from moto import settings

    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    return moto_server


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [
        ["status", "s3://bucket-a/runs/r1"],
        ["resume", "s3://bucket-a/runs/r1"],
        ["report", "s3://bucket-a/runs/r1"],
        ["sql", "s3://bucket-a/runs/r1", "SELECT 1"],
    ],
    ids=lambda c: c[0],
)
def test_unreachable_endpoint_is_one_line_naming_url_and_fix(command, dead_endpoint):
    line = _one_error_line(runner.invoke(app, [*command, "-o", f"endpoint_url={dead_endpoint}"]))
    assert "s3://bucket-a/runs" in line and dead_endpoint in line
    assert "endpoint_url" in line and "AWS_ENDPOINT_URL" in line and "run.storage_options" in line


def test_run_fails_before_prefect_starts_when_the_endpoint_is_wrong(dead_endpoint):
    # A subprocess, as a user runs it: importing Prefect in this process would leave its log handlers behind.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mugrpo.cli",
            "run",
            "configs/gsm8k-smollm2-quick.yaml",
            "run.root=s3://bucket-a/runs",
            f"run.storage_options={{endpoint_url: '{dead_endpoint}'}}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "prefect" not in result.stderr.lower()
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("Error: ")]
    assert dead_endpoint in line and "s3://bucket-a/runs/gsm8k-smollm2-quick" in line


def test_missing_bucket_is_named(moto_server):  # noqa: F811
    bucket = f"missing-{uuid.uuid4().hex[:8]}"
    for command in (["status", f"s3://{bucket}/runs/r1"], ["sql", f"s3://{bucket}/runs/r1", "SELECT 1"]):
        line = _one_error_line(runner.invoke(app, [*command, "-o", f"endpoint_url={moto_server}"]))
        assert f"bucket '{bucket}'" in line and "does not exist" in line and moto_server in line


def test_refused_credentials_are_reported_without_the_secret(s3_root, auth_required, monkeypatch):  # noqa: F811
    url, opts = s3_root
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGKEY00000000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-zzz")
    line = _one_error_line(runner.invoke(app, ["status", f"{url}/r1", "-o", f"endpoint_url={opts['endpoint_url']}"]))
    assert "denied" in line and "AWS_ACCESS_KEY_ID" in line and url in line
    assert "not-the-secret-zzz" not in line


def test_missing_credentials_say_which_variables_to_set(s3_root, auth_required, monkeypatch, tmp_path):  # noqa: F811
    url, opts = s3_root
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    line = _one_error_line(
        runner.invoke(app, ["sql", f"{url}/r1", "SELECT 1", "-o", f"endpoint_url={opts['endpoint_url']}"])
    )
    assert "credentials" in line and "AWS_ACCESS_KEY_ID" in line and url in line


def test_check_store_accepts_a_prefix_that_does_not_exist_yet(s3_root):  # noqa: F811
    url, opts = s3_root
    check_store(Store(f"{url}/not-yet", opts))  # the first write creates it: no error


def test_check_store_raises_storage_unavailable(dead_endpoint):
    with pytest.raises(StorageUnavailable, match="cannot reach"):
        check_store(Store("s3://bucket-a/runs", {"endpoint_url": dead_endpoint}))


def test_unrelated_errors_are_not_explained():
    assert explain_storage_error(ValueError("bad value"), "s3://b/r") is None
    assert explain_storage_error(FileNotFoundError("s3://b/r/run.json does not exist"), "s3://b/r") is None
