"""A real S3 API for tests: moto in server mode on 127.0.0.1 (no AWS account, no network)."""

from __future__ import annotations

import os
import uuid

import pytest


@pytest.fixture(scope="session")
def moto_server():
    """Start moto's S3 server on a free loopback port; yields its endpoint URL. Credentials are dummies."""
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    # Region via the environment: client_kwargs={"region_name": ...} breaks bucket creation with s3fs (docs/design.md).
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_root(moto_server):
    """A fresh bucket; yields (root URL, storage_options) for mugrpo.storage.store.Store."""
    import s3fs

    opts = {"endpoint_url": moto_server}
    fs = s3fs.S3FileSystem(**opts)
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    yield f"s3://{bucket}/runs", opts
