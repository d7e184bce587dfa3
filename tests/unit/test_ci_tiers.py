"""CI's two halves select every test exactly once: `make test-main` (-m "not vllm") and `make test-vllm` (-m vllm with
MUGRPO_VLLM_PYTHON set), both in `make test-all` and in .ci/run, which builds the vLLM env during the first half."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _recipe(target: str) -> tuple[str, str]:
    """(prerequisites, recipe lines) of a Makefile target."""
    text = (REPO / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)*)", text, re.M)
    assert match, f"Makefile has no target {target}"
    return match.group(1).strip(), match.group(2)


def test_make_test_all_is_the_main_half_then_the_vllm_half():
    assert _recipe("test-all")[0].split() == ["test-main", "test-vllm"]
    assert '-m "not vllm"' in _recipe("test-main")[1]
    prereqs, recipe = _recipe("test-vllm")
    assert prereqs == "vllm-venv"
    assert "-m vllm" in recipe
    # the interpreter is absolute: jobs run it from their run folders, the build's import check from the temp dir
    dry = subprocess.run(["make", "-n", "test-vllm"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    (line,) = [x for x in dry.splitlines() if "-m vllm" in x]
    assert re.search(r"MUGRPO_VLLM_PYTHON=(\S+)/bin/python ", line).group(1) == str(REPO / ".venv-vllm"), line


def test_ci_run_overlaps_the_vllm_build_with_the_main_half_and_fails_on_either():
    script = (REPO / ".ci" / "run").read_text()
    subprocess.run(["bash", "-n", str(REPO / ".ci" / "run")], check=True)  # parses
    order = [script.index(s) for s in ("make install", "make vllm-venv", "make test-main", "wait ", "make test-vllm")]
    assert order == sorted(order)
    assert re.search(r"make vllm-venv[^\n]*&\n", script)  # in the background
    assert 'failed+=("make test-main")' in script and 'failed+=("make test-vllm")' in script
    assert "exit 1" in script


def test_the_vllm_marker_is_registered_and_every_vllm_module_uses_it():
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("vllm:") for m in markers)
    for path in (REPO / "tests").rglob("test_*.py"):
        text = path.read_text()
        if "MUGRPO_VLLM_PYTHON" in text and path.name != "test_ci_tiers.py":
            assert "pytest.mark.vllm" in text, f"{path} runs vLLM but is not marked vllm: CI would run it unset"
