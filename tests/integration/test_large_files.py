"""Large files with bounded memory: a 256 MiB file is written to the store, read back and re-hashed with
peak RSS growth under 100 MiB, on the local store and on S3 (moto server; multipart: 32 parts of 8 MiB). RSS is
measured in a separate client process (``VmHWM`` from /proc: its peak resident memory), so the moto server's own
memory does not count. The file is 2.5x the limit: code that held the whole file, or kept its parts, fails; a
larger file would only add minutes (memory per transfer does not grow with the size, docs/reliability.md).
Slow: 256 MiB each way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _s3 import moto_server, s3_root  # noqa: F401  (fixtures)

REPO = Path(__file__).resolve().parents[2]
SIZE = 256 * 2**20
LIMIT_MIB = 100

CLIENT = r"""
import hashlib, json, os, sys
from mugrpo.storage.store import Store

def hwm_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

url, opts, src, dest = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
store = Store(url, opts)
store.write_bytes("warm/up.bin", b"x" * 1024)       # imports, clients, event loop: before the baseline
store.read_bytes("warm/up.bin")
before = hwm_kib()
written = store.write_file("big/optimizer.pt", src)
read = store.read_to_file("big/optimizer.pt", dest, expected_sha256=written)
hashed, size = store.hash_file("big/optimizer.pt")
print(json.dumps({"growth_mib": (hwm_kib() - before) / 1024, "sha": [written, read, hashed], "size": size}))
"""


def make_file(path: Path, size: int) -> str:
    """A ``size``-byte file of non-repeating blocks, written in 16 MiB pieces; returns its sha256."""
    import hashlib

    digest = hashlib.sha256()
    block = 16 * 2**20
    with open(path, "wb") as f:
        for i in range(size // block):
            piece = hashlib.sha256(str(i).encode()).digest() * (block // 32)
            digest.update(piece)
            f.write(piece)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def big_file(tmp_path_factory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("big") / "optimizer.pt"
    return path, make_file(path, SIZE)


def run_client(url: str, opts: dict, src: Path, dest: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, url, json.dumps(opts), str(src), str(dest)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_256_mib_file_round_trips_with_bounded_memory(where, big_file, tmp_path, request):
    src, sha = big_file
    if where == "local":
        url, opts = str(tmp_path / "root"), {}
    else:
        url, opts = request.getfixturevalue("s3_root")
    result = run_client(url, opts, src, tmp_path / "back.pt")
    assert result["sha"] == [sha, sha, sha] and result["size"] == SIZE
    assert (tmp_path / "back.pt").stat().st_size == SIZE
    assert result["growth_mib"] < LIMIT_MIB, result
