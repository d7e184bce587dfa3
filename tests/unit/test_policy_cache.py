"""The machine's policy cache (mugrpo.storage.cache): built once, atomic, bounded by MUGRPO_CACHE_GB, least recently
used first, and never an entry a live process holds. Other processes are real child processes (the locks are
per process), each entry a folder of real files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mugrpo.storage import cache

MB = 1024**2

# A child process that builds (or reuses) the named 1 MB entries, prints "ready", then holds them until its stdin
# closes (hold) or exits at once.
CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from mugrpo.storage.cache import cached

    def build(folder: Path) -> None:
        (folder / "weights.bin").write_bytes(b"w" * 1024**2)

    for name in sys.argv[2:]:
        cached(name, build, root=Path(sys.argv[1]))
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def child(root: Path, *names: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), *names],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "MUGRPO_CACHE_GB": "100"},
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def built(root: Path, *names: str) -> None:
    """The entries, built by a child process that has exited (so nobody holds them), used in this order."""
    for name in names:
        proc = child(root, name)
        proc.communicate("")
        time.sleep(0.02)  # distinct last-use times


def entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith((".", "mugrpo-")))


def test_an_entry_is_built_once_then_reused(tmp_path):
    calls = []

    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "config.json").write_text("{}")

    first = cache.cached("remote-abc", build, root=tmp_path)
    again = cache.cached("remote-abc", build, root=tmp_path)
    assert first == again == tmp_path / "remote-abc" and len(calls) == 1
    assert (first / "config.json").read_text() == "{}" and (first / cache.COMPLETE).exists()
    assert [p.name for p in tmp_path.iterdir()] == ["remote-abc"]  # the build folder was renamed into place


def test_a_failed_build_leaves_no_entry_and_no_folder(tmp_path):
    def build(folder: Path) -> None:
        (folder / "half.bin").write_bytes(b"x")
        raise ConnectionError("the store went away")

    with pytest.raises(ConnectionError, match="went away"):
        cache.cached("remote-abc", build, root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_incomplete_leftover_is_replaced(tmp_path):
    (tmp_path / "remote-abc").mkdir()
    (tmp_path / "remote-abc" / "truncated.bin").write_bytes(b"x")  # not made by the cache (put there by hand)
    entry = cache.cached("remote-abc", lambda folder: (folder / "model.bin").write_bytes(b"full"), root=tmp_path)
    assert sorted(p.name for p in entry.iterdir()) == sorted([cache.COMPLETE, cache.LOCK_NAME, "model.bin"])


def test_eviction_removes_the_least_recently_used_down_to_the_budget(tmp_path):
    built(tmp_path, "a", "b", "c")
    child(tmp_path, "a").communicate("")  # a used again: b is now the least recently used
    removed = cache.evict(budget=int(2.5 * MB), root=tmp_path)
    assert [p.name for p in removed] == ["b"]
    assert entries(tmp_path) == ["a", "c"]


def test_an_entry_a_live_process_holds_is_never_evicted(tmp_path):
    built(tmp_path, "a")
    holder = child(tmp_path, "b")  # holds b until its stdin closes
    try:
        assert [p.name for p in cache.evict(budget=0, root=tmp_path)] == ["a"]
        assert entries(tmp_path) == ["b"] and (tmp_path / "b" / "weights.bin").stat().st_size == MB
    finally:
        holder.communicate("")
    assert [p.name for p in cache.evict(budget=0, root=tmp_path)] == ["b"]
    assert entries(tmp_path) == []


def test_adding_an_entry_brings_the_cache_within_budget(tmp_path, monkeypatch):
    built(tmp_path, "a", "b")
    monkeypatch.setenv("MUGRPO_CACHE_GB", str(2.5 * MB / 1024**3))
    cache.cached("c", lambda folder: (folder / "weights.bin").write_bytes(b"w" * MB), root=tmp_path)
    assert entries(tmp_path) == ["b", "c"]  # a went; c, held by this process, stays


@pytest.mark.parametrize("value", ["lots", "-1", "nan"])
def test_a_malformed_budget_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("MUGRPO_CACHE_GB", value)
    with pytest.raises(ValueError, match=f"MUGRPO_CACHE_GB='{value}'"):
        cache.budget_bytes()


def test_eviction_touches_only_the_caches_own_entries(tmp_path, monkeypatch):
    """MUGRPO_CACHE also holds other caches (the vLLM environments of infra/vllm_venv.py): the policy cache lives in
    its own folder, and evicts only folders it completed."""
    monkeypatch.setenv("MUGRPO_CACHE", str(tmp_path))
    assert cache.cache_root() == tmp_path / "policies"
    root = cache.cache_root()
    root.mkdir()
    foreign = root / "someone-elses"
    foreign.mkdir()
    (foreign / "big.bin").write_bytes(b"x" * MB)
    built(root, "a")
    assert [p.name for p in cache.evict(budget=0, root=root)] == ["a"]
    assert foreign.is_dir() and (foreign / "big.bin").exists()
