"""``mugrpo env``: the machine report for bug reports and for choosing a config (as ``trl env``, ``accelerate env``
and ``vllm collect-env`` do): versions, cores, the CPU's bf16 verdict with measured GFLOP/s, GPUs, the Prefect API
in use, and the precision ``auto`` would pick here and why (:mod:`mugrpo.common.hardware`)."""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import metadata
from typing import Any

#: Distributions whose versions the report lists (None when not installed in this interpreter).
PACKAGES = ("mugrpo", "torch", "transformers", "accelerate", "peft", "prefect", "duckdb", "pyarrow", "math-verify")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _vllm() -> dict[str, Any]:
    """vLLM lives in its own virtualenv (``MUGRPO_VLLM_PYTHON`` or ``.venv-vllm``): its interpreter and version."""
    import subprocess
    from pathlib import Path

    python = os.environ.get("MUGRPO_VLLM_PYTHON") or (
        str(Path(".venv-vllm/bin/python").resolve()) if Path(".venv-vllm/bin/python").exists() else None
    )
    info: dict[str, Any] = {"python": python, "version": _version("vllm")}
    if python and info["version"] is None:
        try:
            out = subprocess.run(
                [python, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            info["version"] = out.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def _gpus() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append({"index": i, "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)})
    return gpus


def _prefect_api() -> str:
    url = os.environ.get("PREFECT_API_URL")
    if url:
        return url
    try:
        from prefect.settings import PREFECT_API_URL

        value = PREFECT_API_URL.value()
    except Exception:  # noqa: BLE001 - the report must print whatever Prefect's settings hold
        value = None
    return value or "none set: `mugrpo run` starts a temporary local server"


def environment_report() -> dict[str, Any]:
    """The report as a JSON-able dict (what ``mugrpo env --json`` prints)."""
    import torch

    from mugrpo.common.hardware import auto_choice, bf16_verdict

    verdict = bf16_verdict()
    choice, reason = auto_choice(verdict)
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "vllm": _vllm(),
        "cpu": {
            "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "capability": torch.backends.cpu.get_cpu_capability(),
        },
        "bf16": verdict.to_json(),
        "gpus": _gpus(),
        "prefect_api": _prefect_api(),
        "auto_precision": {
            "choice": choice,
            "model.dtype": "bfloat16" if choice == "bf16" else "float32",
            "train.mixed_precision": "bf16" if choice == "bf16" else "no",
            "reason": reason,
        },
    }


def format_report(report: dict[str, Any]) -> str:
    """The report as plain text, one fact a line (paste it into a bug report)."""
    bf16 = report["bf16"]
    cpu = report["cpu"]
    lines = [
        f"python           {report['python']} ({report['platform']})",
        *(f"{name:<16} {version or 'not installed'}" for name, version in report["packages"].items()),
        f"vllm             {report['vllm']['version'] or 'not installed'}"
        + (f" ({report['vllm']['python']})" if report["vllm"]["python"] else ""),
        f"cpu              {cpu['cores']} cores ({cpu['usable_cores']} usable, torch threads {cpu['torch_threads']}), "
        f"capability {cpu['capability']}",
        f"bf16 units       {'yes' if bf16['units'] else 'no'}"
        + (f" ({', '.join(bf16['units'])})" if bf16["units"] else ""),
    ]
    if bf16["fp32_gflops"] is not None:
        lines.append(
            f"matmul GFLOP/s   fp32 {bf16['fp32_gflops']:.1f}, bf16 {bf16['bf16_gflops']:.1f} "
            f"(bf16 {bf16['slowdown']:.2f}x the time of fp32; one thread, 256x256)"
        )
    lines.append(f"bf16 native      {'yes' if bf16['native'] else 'no'}: {bf16['reason']}")
    gpus = report["gpus"]
    lines.append(
        "gpus             " + ("; ".join(f"{g['index']}: {g['name']} {g['memory_gib']} GiB" for g in gpus) or "none")
    )
    lines.append(f"prefect api      {report['prefect_api']}")
    auto = report["auto_precision"]
    lines.append(
        f"auto precision   {auto['choice']}: model.dtype={auto['model.dtype']}, "
        f"train.mixed_precision={auto['train.mixed_precision']} ({auto['reason']})"
    )
    return "\n".join(lines)


def register_cli(app) -> None:
    """Add ``mugrpo env`` to the command line ``app`` (a typer app)."""
    import typer

    @app.command("env")
    def env_cmd(as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")):
        """Print this machine's report: versions, cores, bf16 units with measured fp32/bf16 GFLOP/s, GPUs, the
        Prefect API, and the precision `auto` picks here and why. Paste it into bug reports."""
        report = environment_report()
        typer.echo(json.dumps(report, indent=2) if as_json else format_report(report))
