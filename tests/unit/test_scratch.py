"""Scratch folders a killed process leaves are swept by the next process that makes one (mugrpo.common.scratch):
a SIGKILLed child's folder goes, a live process's and another pid namespace's stay. Real processes, real folders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from mugrpo.common.scratch import scratch, scratch_dir, sweep_orphans

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/ns/pid"), reason="pid namespaces are Linux's")


def killed_childs_scratch(parent) -> str:
    """A child makes a scratch folder, writes into it and is SIGKILLed (its ``finally`` never runs)."""
    code = (
        "import os, signal, sys\n"
        "from mugrpo.common.scratch import scratch\n"
        f"with scratch('ckpt', parent={str(parent)!r}) as d:\n"
        "    (d / 'optimizer.pt').write_bytes(b'x' * 1000)\n"
        "    print(d, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    return out.stdout.strip()


def test_a_killed_processs_scratch_is_swept_by_the_next_one_and_a_live_ones_is_kept(tmp_path):
    orphan = killed_childs_scratch(tmp_path)
    assert os.path.isdir(orphan) and os.listdir(orphan) == ["optimizer.pt"]
    live = scratch_dir("train-0", parent=tmp_path)  # this process's: alive
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ns = os.path.basename(orphan).split("-n", 1)[1].split("p", 1)[0]
        other_live = tmp_path / f"mugrpo-ckpt-n{ns}p{sleeper.pid}-abc"
        other_ns = tmp_path / "mugrpo-ckpt-n1p999999-abc"  # another container's numbering: not ours to judge
        unrelated = tmp_path / "mugrpo-cache"
        for d in (other_live, other_ns, unrelated):
            d.mkdir()
        with scratch("publish-0", parent=tmp_path) as fresh:
            assert fresh.is_dir() and fresh.name.startswith(f"mugrpo-publish-0-n{ns}p{os.getpid()}-")
            assert not os.path.exists(orphan)
            assert live.is_dir() and other_live.is_dir() and other_ns.is_dir() and unrelated.is_dir()
        assert not fresh.exists()  # removed at the block's end
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sweep_orphans(tmp_path) == [other_live]  # its process is gone now
    assert live.is_dir() and other_ns.is_dir()
