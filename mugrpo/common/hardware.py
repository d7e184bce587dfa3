"""Does this machine compute bf16 natively? The verdict ``auto`` precision is resolved from, with its evidence.

Frameworks take bf16 on a CPU on trust: accelerate's ``is_bf16_available()`` is True on any CPU, TRL's ``bf16=True``
and vLLM's ``dtype="auto"`` follow the checkpoint. But PyTorch runs a bf16 GEMM at speed only where the CPU has bf16
units (AVX512-BF16, AMX, or ARM's BF16 extension); elsewhere it takes a scalar fallback, measured 44-499x slower than
fp32 on AVX2 Xeons (pytorch/pytorch#146508) and 46x on an AVX2-only AMD EPYC (Zen 3) with 512x512 matmuls on one
thread. :func:`bf16_verdict` therefore asks twice:

1. **units**: CUDA's ``torch.cuda.is_bf16_supported()``; on a CPU ``torch.cpu._is_avx512_bf16_supported()``,
   ``torch.cpu._is_amx_tile_supported()`` or the ``bf16`` feature of an aarch64 CPU (``/proc/cpuinfo``);
2. **probe** (CPU): a short one-thread matmul of :data:`PROBE_SIZE` square matrices in fp32 and in bf16, best of a
   few repeats; bf16 must run at least as fast as fp32 (:data:`MIN_SPEEDUP`).

bf16 is native when both say so. The verdict is computed once per process (about 0.1 s with bf16 units, about 0.2 s
without) and carries its figures, which ``run.json``, ``mugrpo env`` and the benches record.

Two environment variables exist for operators and tests, each named in the verdict's reason when set:

- ``MUGRPO_CPU_BF16_UNITS=0|1`` overrides the CPU unit detection (``0`` makes a bf16 machine behave as one without
  units; the probe still runs and is reported);
- ``MUGRPO_AUTO_PRECISION=fp32|bf16`` pins what ``auto`` resolves to, whatever the hardware (a fleet of mixed machines
  that must agree, or a test suite that must be identical on every CI machine).
"""

from __future__ import annotations

import functools
import os
import platform
import time
from dataclasses import asdict, dataclass, field

from mugrpo.common.lazy import torch

#: Side of the square matrices the probe multiplies (a 256x256 fp32 matmul is ~0.4 ms on one AVX2 core).
PROBE_SIZE = 256
#: bf16 is native only if the probe's bf16 GFLOP/s is at least this multiple of fp32's.
MIN_SPEEDUP = 1.0
#: Wall-clock budget of each dtype's timed loop, seconds (the best of the repeats inside it counts).
PROBE_BUDGET_S = 0.06

UNITS_ENV = "MUGRPO_CPU_BF16_UNITS"
PIN_ENV = "MUGRPO_AUTO_PRECISION"


@dataclass(frozen=True)
class Bf16Verdict:
    """Whether bf16 is native on ``device``, and why.

    Attributes:
        device: "cuda" (the first GPU) or "cpu".
        capability: ``torch.backends.cpu.get_cpu_capability()`` ("AVX2", "AVX512", ...), or the GPU's name.
        units: the bf16 units found ("avx512_bf16", "amx_tile", "arm_bf16", "cuda"); empty when none.
        fp32_gflops: probe figure in GFLOP/s (one thread, :data:`PROBE_SIZE` matmul); None on CUDA.
        bf16_gflops: the same in bf16; None on CUDA.
        native: bf16 computes at least as fast as fp32 here (units present and, on a CPU, the probe agrees).
        reason: one sentence with the evidence, for logs and run.json.
        overrides: the environment overrides in force (``{"MUGRPO_CPU_BF16_UNITS": "0"}``, ...).
    """

    device: str
    capability: str
    units: tuple[str, ...]
    fp32_gflops: float | None
    bf16_gflops: float | None
    native: bool
    reason: str
    overrides: dict[str, str] = field(default_factory=dict)

    @property
    def slowdown(self) -> float | None:
        """How many times slower bf16 runs than fp32 here (``fp32 / bf16`` GFLOP/s; < 1 means faster)."""
        if not self.fp32_gflops or not self.bf16_gflops:
            return None
        return self.fp32_gflops / self.bf16_gflops

    def to_json(self) -> dict:
        data = asdict(self)
        data["units"] = list(self.units)
        data["slowdown"] = self.slowdown
        return data


def matmul_gflops(dtype: torch.dtype, size: int = PROBE_SIZE, budget_s: float = PROBE_BUDGET_S) -> float:
    """Best-of-repeats GFLOP/s of a ``size`` x ``size`` CPU matmul in ``dtype`` on one thread (2 size^3 FLOP each).

    At least 3 timed repeats after one warm-up, more while ``budget_s`` lasts. The thread count is restored after.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(size, size, generator=gen).to(dtype)
        b = torch.randn(size, size, generator=gen).to(dtype)
        torch.mm(a, b)  # warm-up: kernel selection, page faults
        best = float("inf")
        start = time.perf_counter()
        repeats = 0
        while repeats < 3 or time.perf_counter() - start < budget_s:
            t = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t)
            repeats += 1
            if repeats >= 50:
                break
    finally:
        torch.set_num_threads(threads)
    return 2 * size**3 / best / 1e9


def cpu_bf16_units() -> tuple[str, ...]:
    """The CPU's bf16 units as PyTorch and the kernel report them (``MUGRPO_CPU_BF16_UNITS`` overrides)."""
    forced = os.environ.get(UNITS_ENV)
    if forced is not None:
        return ("forced",) if forced.strip() not in ("", "0", "false", "no") else ()
    units = []
    if getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)():
        units.append("avx512_bf16")
    if getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
        units.append("amx_tile")
    if platform.machine() in ("aarch64", "arm64") and "bf16" in _cpuinfo_flags():
        units.append("arm_bf16")
    return tuple(units)


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("flags", "features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@functools.cache
def bf16_verdict() -> Bf16Verdict:
    """This machine's verdict on bf16 (see the module docstring), computed once per process."""
    overrides = {k: os.environ[k] for k in (UNITS_ENV, PIN_ENV) if k in os.environ}
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        native = bool(torch.cuda.is_bf16_supported())
        reason = f"GPU {name} {'supports' if native else 'does not support'} bf16 (torch.cuda.is_bf16_supported())"
        return Bf16Verdict("cuda", name, ("cuda",) if native else (), None, None, native, reason, overrides)
    capability = torch.backends.cpu.get_cpu_capability()
    units = cpu_bf16_units()
    fp32, bf16 = matmul_gflops(torch.float32), matmul_gflops(torch.bfloat16)
    figures = f"{PROBE_SIZE}x{PROBE_SIZE} matmul on one thread: fp32 {fp32:.1f}, bf16 {bf16:.1f} GFLOP/s"
    forced = f" ({UNITS_ENV}={overrides[UNITS_ENV]})" if UNITS_ENV in overrides else ""
    if not units:
        native = False
        if bf16 < fp32:
            reason = (
                f"CPU {capability} has no bf16 units{forced}: bf16 is emulated, {fp32 / bf16:.1f}x slower ({figures})"
            )
        else:  # units switched off by the override on a machine that has them
            reason = (
                f"CPU {capability} treated as having no bf16 units{forced}, although the probe runs bf16 at "
                f"{bf16 / fp32:.1f}x fp32 ({figures})"
            )
    elif bf16 < MIN_SPEEDUP * fp32:
        native = False
        reason = (
            f"CPU {capability} reports bf16 units ({', '.join(units)}){forced} but the probe runs bf16 "
            f"{fp32 / bf16:.1f}x slower ({figures})"
        )
    else:
        native = True
        reason = (
            f"CPU {capability} has bf16 units ({', '.join(units)}){forced}: bf16 {bf16 / fp32:.1f}x fp32 ({figures})"
        )
    return Bf16Verdict("cpu", capability, units, fp32, bf16, native, reason, overrides)


def pinned_choice() -> str | None:
    """What ``auto`` is pinned to by ``MUGRPO_AUTO_PRECISION`` ("fp32" or "bf16"), or None where the hardware
    decides. Reads only the environment: no probe, no torch."""
    pinned = os.environ.get(PIN_ENV, "").strip().lower()
    return pinned if pinned in ("fp32", "bf16") else None


def auto_choice(verdict: Bf16Verdict | None = None) -> tuple[str, str]:
    """("bf16" | "fp32", reason): what ``auto`` precision picks on this machine (``MUGRPO_AUTO_PRECISION`` pins it;
    then ``verdict`` is not needed and no probe runs)."""
    pinned = pinned_choice()
    if pinned is not None:
        return pinned, f"{PIN_ENV}={pinned} pins auto precision"
    verdict = verdict or bf16_verdict()
    return ("bf16" if verdict.native else "fp32"), verdict.reason
