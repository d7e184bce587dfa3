"""What a store says about a committed file without reading it (mugrpo.storage.digests), on a local folder and on a
real S3 API (moto in server mode): the sha256 it vouches for, the ETag a commit marker records for a multipart
object, and the quick check of mugrpo.commits.verify built on them."""

from __future__ import annotations

import os
import posixpath

import pytest
from _s3 import moto_server, s3_root  # noqa: F401  (fixtures)

from mugrpo.commits.verify import StageCheck, _check_folder, _Mode
from mugrpo.storage.digests import DigestCache, digest_cache, local_file_sha256, local_version
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import COMPLETE_MARKER, MARKER_ETAGS, PART_BYTES, Store, sha256_bytes


@pytest.fixture
def cache(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "digests.sqlite")
    monkeypatch.setenv("MUGRPO_DIGEST_CACHE", path)
    return path


def folder(tmp_path, big: int = 3 * PART_BYTES // 2) -> tuple:
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(os.urandom(big))  # over one part: a multipart upload on S3
    (src / "config.json").write_bytes(b'{"hidden_size": 8}')
    return src, {p.name: sha256_bytes(p.read_bytes()) for p in src.iterdir()}


def quick_check(store: Store, rel: str) -> StageCheck:
    out = StageCheck(stage=0, label="0")
    _check_folder(store, RunLayout("run"), rel, out, _Mode(quick=True))
    return out


def test_local_writes_fill_the_hash_cache_and_a_rewrite_misses_it(tmp_path, cache):
    store = Store(str(tmp_path / "root"))
    src, sums = folder(tmp_path, big=1000)
    store.upload_dir(src, "run/policies/stage=0")
    st = store.stat_object("run/policies/stage=0/model.safetensors")
    assert st.sha256 == sums["model.safetensors"] and st.size == 1000  # recorded by the write itself
    out = quick_check(store, "run/policies/stage=0")
    assert out.ok and out.trusted == 2 and out.hashed_bytes == 0 and store.bytes_read < 1000
    path = tmp_path / "root/run/policies/stage=0/model.safetensors"
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))  # a new mtime: the cache entry no longer applies
    assert store.stat_object("run/policies/stage=0/model.safetensors").sha256 is None
    out = quick_check(store, "run/policies/stage=0")
    assert list(out.corrupted) == ["policies/stage=0/model.safetensors"] and out.hashed_bytes == 1000


def test_a_local_file_is_hashed_once_until_it_changes(tmp_path, cache):
    """local_file_sha256 (what keys a GGUF's conversion in the policy cache): the bytes' sha256, recorded for the
    file's version; a recorded digest is returned without reading the file; a rewrite is hashed again."""
    path = tmp_path / "model.gguf"
    path.write_bytes(os.urandom(3 << 20))
    want = sha256_bytes(path.read_bytes())
    assert local_file_sha256(path) == want
    version = local_version(os.stat(path))
    assert digest_cache().lookup(str(path), version) == want
    digest_cache().record(str(path), version, "0" * 64)  # what the cache says is what a hit returns: no read
    assert local_file_sha256(path) == "0" * 64
    path.write_bytes(os.urandom(1 << 20))  # a new version: read again
    assert local_file_sha256(path) == sha256_bytes(path.read_bytes())


def test_the_cache_is_keyed_by_inode_and_survives_nothing_but_the_same_file(tmp_path):
    cache = DigestCache(tmp_path / "c.sqlite")
    cache.record("/a", "10:1:2:3", "ab" * 32)
    assert cache.lookup("/a", "10:1:2:3") == "ab" * 32
    assert cache.lookup("/a", "10:1:9:3") is None  # another inode (a copy, a move)
    broken = DigestCache(tmp_path / "file-not-dir" / "c.sqlite")
    (tmp_path / "file-not-dir").write_text("x")
    assert broken.lookup("/a", "v") is None  # an unusable cache is off, never an error
    broken.record("/a", "v", "cd" * 32)


def test_s3_objects_carry_their_sha256_and_multipart_ones_their_commit_etag(tmp_path, s3_root, cache):
    url, options = s3_root
    store = Store(url, options)
    src, sums = folder(tmp_path)
    store.upload_dir(src, "run/policies/stage=0")
    small = store.stat_object("run/policies/stage=0/config.json")
    assert small.sha256 == sums["config.json"] and not small.multipart  # S3's full-object SHA-256, from a HEAD
    big = store.stat_object("run/policies/stage=0/model.safetensors")
    assert big.multipart and big.sha256 is None
    marker = store.read_json(f"run/policies/stage=0/{COMPLETE_MARKER}")
    assert marker[MARKER_ETAGS] == {"model.safetensors": big.version}
    store.write_bytes("run/shard.parquet", b"rows" * 3000)  # a one-request write: checksummed too
    assert store.stat_object("run/shard.parquet").sha256 == sha256_bytes(b"rows" * 3000)

    before = store.bytes_read
    out = quick_check(store, "run/policies/stage=0")
    assert out.ok and out.trusted == 2 and out.hashed_bytes == 0
    assert store.bytes_read - before < 1000  # the marker only: no byte of the weights

    # The multipart object replaced by other bytes of the same size: its ETag is not the commit's, so the check
    # reads it and finds it.
    data = bytearray((src / "model.safetensors").read_bytes())
    data[5] ^= 0xFF
    key = posixpath.join(store.root, "run/policies/stage=0/model.safetensors")
    with store.fs.open(key, "wb", block_size=PART_BYTES) as f:
        f.write(bytes(data))
    out = quick_check(store, "run/policies/stage=0")
    assert list(out.corrupted) == ["policies/stage=0/model.safetensors"]
    assert out.hashed_bytes == len(data)
