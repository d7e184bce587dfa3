"""The C allocator's policy in a job process: freed memory is kept for the next allocation, not handed back.

A decoding step allocates tensors of ``[rows, vocabulary]`` (SmolLM2: 170 rows x 49,152 fp32 logits, 33 MB, and
the sampler's temporaries of that size) and frees them before the next step; a training step allocates and frees
weight-sized bf16 casts and gradients. glibc's malloc serves an allocation above its mmap threshold (at most 32 MB,
adjusted at run time) with a fresh ``mmap`` and returns it with ``munmap`` when freed, and trims the top of its heap
once more than its trim threshold is free: the next allocation of that size then faults in every 4 KiB page again,
zeroed by the kernel. The main job's run on a 2-core CPU took 29.6 M such minor page faults and spent 23% of its
CPU time in the kernel (docs/benchmarks.md, "The allocator's policy").

:func:`keep_freed_memory` sets glibc's ``M_MMAP_MAX`` to 0 (every allocation from the heap, reused once freed) and
``M_TRIM_THRESHOLD`` to :data:`TRIM_THRESHOLD_BYTES` (the heap keeps that much free memory at its top). This is the
effect the field gets from preloading tcmalloc or jemalloc for CPU inference, with the C library the interpreter
already uses. A process's peak memory stays what its live tensors need: a freed block is reused, not added to.
Allocation only, no arithmetic changes: the same bits are computed either way (``bench/allocator.py`` checks it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: glibc's mallopt parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
#: Free memory the heap keeps at its top before it trims: 1 GiB, above a job's largest transient working set here.
TRIM_THRESHOLD_BYTES = 1 << 30
#: ``MUGRPO_KEEP_FREED_MEMORY=0`` leaves the C library's defaults (bench/allocator.py's baseline arm).
ENV = "MUGRPO_KEEP_FREED_MEMORY"


def keep_freed_memory() -> bool:
    """Make this process's allocator keep freed memory for reuse (module docstring). Call it once, at a job's start.

    Returns:
        True if glibc's ``mallopt`` took both settings; False where it did not apply: ``MUGRPO_KEEP_FREED_MEMORY=0``,
        a C library without ``mallopt`` (musl, macOS), or a setting it refused. Never raises.
    """
    if os.environ.get(ENV, "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
