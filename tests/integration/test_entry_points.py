"""Every entry point a user types answers ``--help`` with its usage, and a usage error exits 2 with the usage.

Found by a new user: ``python -m mugrpo`` had no ``__main__`` and ``python -m mugrpo.jobs.generate --help``
answered "job spec --help does not exist". Each case runs the real interpreter on the real module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
JOBS = {"generate": "GenerateSpec", "train": "TrainSpec", "eval": "EvalSpec", "segment": "SegmentSpec"}


def run_module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize(("job", "flag"), [*((job, "--help") for job in JOBS), ("generate", "-h")])
def test_each_job_answers_help_with_its_usage_and_docstring(job: str, flag: str):
    out = run_module(f"mugrpo.jobs.{job}", flag)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m mugrpo.jobs.{job} [-h] SPEC\n")
    assert f"path or fsspec URL of a {JOBS[job]} JSON file" in out.stdout
    assert f"The {'warm segment' if job == 'segment' else job[:4]}" in out.stdout  # the module docstring's lead
    assert "does not exist" not in out.stdout + out.stderr


@pytest.mark.parametrize("job", list(JOBS))
def test_a_job_without_its_spec_is_a_usage_error(job: str):
    out = run_module(f"mugrpo.jobs.{job}")
    assert out.returncode == 2
    assert f"usage: python -m mugrpo.jobs.{job} [-h] SPEC" in out.stderr and "required: SPEC" in out.stderr


def test_a_missing_spec_file_names_it(tmp_path: Path):
    missing = tmp_path / "nope.spec.json"
    out = run_module("mugrpo.jobs.generate", str(missing))
    assert out.returncode == 2 and f"job spec {missing} does not exist" in " ".join(out.stderr.split())


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["sql", "--help"]])
def test_python_dash_m_mugrpo_is_the_cli(args: list[str]):
    out = run_module("mugrpo", *args)
    assert out.returncode == 0, out.stderr
    assert "Usage: python -m mugrpo" in " ".join(out.stdout.split())


def test_python_dash_m_mugrpo_without_a_command_shows_the_usage():
    out = run_module("mugrpo")
    assert out.returncode == 2 and "Usage:" in out.stdout + out.stderr


#: Scripts of bench/ (modules named _x.py are shared helpers, not entry points).
BENCH_SCRIPTS = sorted(p.name for p in (REPO_ROOT / "bench").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("script", BENCH_SCRIPTS)
def test_each_bench_script_answers_help(script: str):
    out = subprocess.run(
        [sys.executable, f"bench/{script}", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: {script} [-h]")


def test_the_console_script_is_main_so_read_only_commands_skip_the_native_teardown():
    """``mugrpo status`` once aborted at exit (-6, "terminate called without an active exception") after printing all
    of its output: a native thread pool torn down at interpreter exit. Read-only commands end with ``os._exit`` once
    flushed (``mugrpo.cli.main``), so the console script must be ``main``, not the Typer app."""
    from mugrpo.cli import READ_ONLY_COMMANDS

    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["mugrpo"] == "mugrpo.cli:main"
    assert {"status", "sql", "verify", "report", "env"} <= READ_ONLY_COMMANDS
    assert not {"run", "resume", "lab"} & READ_ONLY_COMMANDS  # Prefect's exit handlers must run after a flow


def test_a_read_only_command_keeps_its_output_and_exit_code(tmp_path: Path):
    """The ``os._exit`` path flushes what was printed and passes on the command's exit code, success or refusal."""
    out = run_module("mugrpo", "env", "--json")
    assert out.returncode == 0, out.stderr
    assert "torch" in json.dumps(json.loads(out.stdout))  # the whole JSON document arrived
    missing = tmp_path / "runs" / "nope"
    out = run_module("mugrpo", "status", str(missing))
    assert out.returncode == 2 and "nope" in out.stdout + out.stderr, out.stdout + out.stderr
    out = run_module("mugrpo", "status")  # a usage error
    assert out.returncode == 2 and "Missing argument" in out.stdout + out.stderr
