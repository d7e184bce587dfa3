"""Object storage faults: the real S3 API (moto server) behind a fault-injecting proxy (tests/_faults.py).

500, 503, SlowDown, connection resets and latency are retried by botocore within the run's retry budget
(``run.storage_retry``); past the budget the error names the object and the cause; a failed upload (single PUT or
multipart) leaves no visible object; the next write after the server returns completes."""

from __future__ import annotations

import uuid

import pytest
from _faults import Fault, FaultProxy
from _s3 import moto_server  # noqa: F401  (fixture)

from mugrpo.storage.store import PART_BYTES, RetryBudget, StorageError, Store

pytestmark = pytest.mark.waits  # run first, it mostly waits: injected latency and 5xx are waited out (backoff)


@pytest.fixture
def proxy(moto_server):  # noqa: F811
    import s3fs

    bucket = f"faults-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(endpoint_url=moto_server).mkdir(bucket)
    with FaultProxy(moto_server) as p:
        p.bucket = bucket
        yield p


def store_via(proxy: FaultProxy, max_attempts: int = 5, **budget) -> Store:
    retry = RetryBudget(max_attempts=max_attempts, **budget)
    # A fresh s3fs instance per store (skip_instance_cache): each test's retry budget is its own.
    return Store(f"s3://{proxy.bucket}/runs", {"endpoint_url": proxy.url, "skip_instance_cache": True}, retry)


SHARD = "r/rollouts/stage=0/shard=00000.parquet"


@pytest.mark.parametrize("kind", ["500", "503", "slowdown", "reset"])
def test_transient_faults_are_retried_within_the_budget(proxy, kind):
    store = store_via(proxy)
    proxy.add(Fault(kind, method="PUT", path="shard=00000", times=2), Fault(kind, method="GET", path="shard=", times=2))
    store.write_bytes(SHARD, b"rollouts")
    assert proxy.count("PUT", "shard=00000", kind) == 2 and proxy.count("PUT", "shard=00000", "forwarded") == 1
    assert store.read_bytes(SHARD) == b"rollouts"
    assert proxy.count("GET", "shard=", kind) == 2


def test_high_latency_is_waited_out_and_a_timeout_is_retried(proxy):
    store = store_via(proxy, read_timeout_s=1.0)
    proxy.add(Fault("latency", method="PUT", path="shard=", seconds=0.5))
    store.write_bytes(SHARD, b"slow")  # under the read timeout: one attempt
    assert proxy.count("PUT", "shard=", "forwarded") == 0 and proxy.count("PUT", "shard=", "latency") == 1
    proxy.add(Fault("latency", method="GET", path="shard=", seconds=2.5))
    assert store.read_bytes(SHARD) == b"slow"  # first GET times out at 1 s, the retry succeeds
    assert proxy.count("GET", "shard=", "latency") == 1 and proxy.count("GET", "shard=", "forwarded") >= 1


@pytest.mark.parametrize(("kind", "cause"), [("503", "ServiceUnavailable"), ("slowdown", "SlowDown")])
def test_past_the_budget_the_error_names_the_object_and_the_cause(proxy, kind, cause):
    store = store_via(proxy, max_attempts=3)
    proxy.add(Fault(kind, method="PUT", path="shard=", times=None))
    with pytest.raises(StorageError) as info:
        store.write_bytes(SHARD, b"never")
    message = str(info.value)
    assert f"could not write {store.uri(SHARD)}" in message and "3 attempts" in message and cause in message
    assert proxy.count("PUT", "shard=", kind) == 3  # exactly the budget
    proxy.up()
    assert not store.exists(SHARD) and store.listdir("r/rollouts/stage=0") == []


def test_server_stopped_mid_multipart_upload_leaves_no_object_then_the_retry_completes(proxy, tmp_path):
    """A 2.5-part file: the server goes down after the first part; no object is visible; once it is back the
    same write completes whole."""
    src = tmp_path / "optimizer.pt"
    src.write_bytes(bytes(range(256)) * (PART_BYTES * 5 // 2 // 256))
    store = store_via(proxy, max_attempts=2)
    rel = "r/checkpoints/stage=0/step=000001/optimizer.pt"
    proxy.add(Fault("down", method="PUT", path="optimizer.pt", query="partNumber=2"))
    with pytest.raises(StorageError, match=rf"could not write {store.uri(rel)}.*2 attempts"):
        store.write_file(rel, src)
    assert proxy.count("PUT", "optimizer.pt", "forwarded") == 1  # part 1 went through
    proxy.up()
    assert not store.exists(rel)
    assert store.listdir("r/checkpoints/stage=0/step=000001") == []
    digest = store.write_file(rel, src)
    assert store.hash_file(rel) == (digest, src.stat().st_size)
    assert proxy.count("POST", "optimizer.pt", "forwarded") >= 2  # CreateMultipartUpload + Complete
