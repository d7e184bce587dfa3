"""CI's three selections take every test exactly once: `make test-main` (-m "not vllm and not waits"), `make
test-waits` (-m "waits and not vllm") and `make test-vllm` (-m vllm with MUGRPO_VLLM_PYTHON set), both in `make
test-all` and in .ci/run, which runs the waiting tests and the vLLM half (build, then tests) beside the main one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _recipe(target: str) -> tuple[str, str]:
    """(prerequisites, recipe lines) of a Makefile target."""
    text = (REPO / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)*)", text, re.M)
    assert match, f"Makefile has no target {target}"
    return match.group(1).strip(), match.group(2)


def test_make_test_all_is_the_main_half_the_waiting_tests_and_the_vllm_half():
    assert _recipe("test-all")[0].split() == ["test-main", "test-waits", "test-vllm"]
    assert '-m "not vllm and not waits"' in _recipe("test-main")[1]
    assert '-m "waits and not vllm"' in _recipe("test-waits")[1]
    prereqs, recipe = _recipe("test-vllm")
    assert prereqs == "vllm-venv"
    assert "-m vllm" in recipe
    # the interpreter is absolute: jobs run it from their run folders, the build's import check from the temp dir
    dry = subprocess.run(["make", "-n", "test-vllm"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    (line,) = [x for x in dry.splitlines() if "-m vllm" in x]
    assert re.search(r"MUGRPO_VLLM_PYTHON=(\S+)/bin/python ", line).group(1) == str(REPO / ".venv-vllm"), line


FAKE_MAKE = """#!/usr/bin/env bash
# Stands in for make: records "start TARGET" / "end TARGET" in $CALLS, sleeps, exits as $FAIL_TARGET says.
echo "start $1" >> "$CALLS"
case "$1" in test-main) sleep 0.8 ;; test-waits) sleep 0.3 ;; *) sleep 0.1 ;; esac
echo "end $1" >> "$CALLS"
[ "$1" != "${FAIL_TARGET:-}" ]
"""


def _run_ci(tmp_path: Path, fail: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    """.ci/run of a copy of the repository's script with make (and chromium) standing in: the script's own control
    flow (order, background tier, exit codes) runs for real."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    (repo / ".ci" / "run").write_text((REPO / ".ci" / "run").read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("make", FAKE_MAKE), ("chromium", "#!/bin/sh\n")):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls), "FAIL_TARGET": fail}
    env["VLLM_TIER_LOG"] = str(tmp_path / "tier.log")
    proc = subprocess.run(["bash", str(repo / ".ci" / "run")], capture_output=True, text=True, env=env, timeout=60)
    return proc, calls.read_text().split("\n")[:-1]


def test_ci_run_runs_the_vllm_tier_beside_the_main_half_and_fails_on_either(tmp_path):
    proc, calls = _run_ci(tmp_path)
    assert proc.returncode == 0 and "every tier passed" in proc.stdout, proc.stdout + proc.stderr
    assert calls[:2] == ["start install", "end install"]  # before either half
    # the vLLM half (build, then its tests) and the waiting tests run while test-main runs
    assert calls.index("end vllm-venv") < calls.index("start test-vllm") < calls.index("end test-main")
    assert calls.index("start test-main") < calls.index("end vllm-venv")
    assert calls.index("start test-waits") < calls.index("end test-main")
    assert calls.index("start test-main") < calls.index("end test-waits")
    assert "end test-vllm" in calls and "vLLM tier (build or reuse, then the tests) took" in proc.stdout
    assert "the waiting tests took" in proc.stdout
    for target in ("test-main", "test-waits", "vllm-venv", "test-vllm"):
        proc, calls = _run_ci(tmp_path / target, fail=target)
        assert proc.returncode == 1, (target, proc.stdout)
        assert "FAILED" in proc.stderr and "every tier passed" not in proc.stdout, target
        assert "end test-main" in calls  # one selection failing never stops the others
        if target == "vllm-venv":
            assert "start test-vllm" not in calls  # a failed build runs no vLLM test


def test_the_vllm_marker_is_registered_and_every_vllm_module_uses_it():
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("vllm:") for m in markers)
    for path in (REPO / "tests").rglob("test_*.py"):
        text = path.read_text()
        if "MUGRPO_VLLM_PYTHON" in text and path.name != "test_ci_tiers.py":
            assert "pytest.mark.vllm" in text, f"{path} runs vLLM but is not marked vllm: CI would run it unset"


def test_the_waiting_modules_are_handed_out_first_then_the_heaviest_tier():
    """tests/conftest.py's order, read from a real collection: the ``waits`` modules (whatever their tier) first, so
    their idle core goes to the niced vLLM half beside them; then e2e, integration, unit."""
    files = [
        "tests/unit/test_registry.py",
        "tests/e2e/test_smoke.py",
        "tests/integration/test_launchers.py",  # waits
        "tests/unit/test_rewards.py",  # waits
        "tests/integration/test_cli.py",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    order = list(dict.fromkeys(line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line))
    assert order == [files[2], files[3], files[1], files[4], files[0]], order
