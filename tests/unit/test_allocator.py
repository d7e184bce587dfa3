"""A job process's allocator keeps freed memory (mugrpo.common.allocator): a freed 64 MB block is reused, where the C
library's defaults hand it back to the kernel and fault its pages in again at the next allocation. Each case runs in a
fresh interpreter (the setting is per process) that allocates, fills and frees the block with the C library's own
malloc, and counts its minor page faults (getrusage)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
from _tiny import REPO_ROOT

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's settings are glibc's")

BLOCK = 64 << 20  # above glibc's largest mmap threshold (32 MB): by default every allocation of it is a fresh mmap
PAGES = BLOCK // 4096
CYCLES = 5

PROBE = f"""
import ctypes, json, resource, sys
setup = sys.argv[1]
applied = None
if setup == "policy":
    from mugrpo.common.allocator import keep_freed_memory
    applied = keep_freed_memory()
elif setup == "job":
    from mugrpo.jobs.common import prepare_process
    prepare_process()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for _ in range({CYCLES}):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc({BLOCK})
    ctypes.memset(block, 1, {BLOCK})
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({{"applied": applied, "faults": faults}}))
"""


def probe(setup: str, **env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, setup],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_by_default_a_freed_block_is_faulted_in_again_at_every_allocation():
    faults = probe("none")["faults"]
    assert all(f >= 0.9 * PAGES for f in faults), faults


def test_the_policy_reuses_a_freed_block_without_faulting():
    result = probe("policy")
    assert result["applied"] is True
    first, *later = result["faults"]
    assert first >= 0.9 * PAGES, result  # the heap grows once
    assert all(f < 0.05 * PAGES for f in later), result


def test_a_job_process_applies_the_policy_at_its_start():
    first, *later = probe("job")["faults"]
    assert all(f < 0.05 * PAGES for f in later), (first, later)


def test_the_environment_switch_leaves_the_defaults():
    result = probe("policy", MUGRPO_KEEP_FREED_MEMORY="0")
    assert result["applied"] is False
    assert all(f >= 0.9 * PAGES for f in result["faults"]), result
