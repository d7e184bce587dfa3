"""Run a job module as the launcher does and record when it reaches its first useful work (bench/job_start.py).

    python bench/support/job_probe.py OUT.json mugrpo.jobs.generate SPEC

is ``python -m mugrpo.jobs.generate SPEC`` plus a recorder: an import hook patches a few functions of the job's
own modules right after each module is executed (never importing anything early, so the job's import order and
any overlap it does are unchanged), and ``OUT.json`` gets ``time.monotonic()`` stamps (system-wide on Linux, so
comparable with the parent's spawn stamp):

- ``probe_start``: the interpreter is up and this script runs (before any job import);
- ``first_token``: the first sampled token of the generate job (first return of the transformers engine's
  ``sample_next_tokens``); vLLM's tokens are not observable one by one, so for its engine ``first_batch``: the first
  return of ``VLLMEngine.generate`` (a whole engine batch sampled);
- ``engine_ready``: the rollout engine is built (first return of ``TransformersEngine.__init__``, which ``from_dir``
  calls once the weights are loaded, or of ``VLLMEngine.__init__``);
- ``first_update``: the first optimizer update of the train job (first return of ``mugrpo.trainer.updates.run_update``);
- ``policy_load_s`` / ``policy_loads``: seconds and count of ``AutoModelForCausalLM.from_pretrained`` calls
  made by ``mugrpo.policy.models`` (the disk-bound weight loads), and ``moment_load_s`` / ``moment_loads``: of
  ``mugrpo.trainer.resume.read_optimizer_state`` and ``read_checkpoint`` (the disk-bound AdamW moment loads), each
  with the stamp of its first start and last end; ``tokenizer_load_s`` / ``tokenizer_loads``: the same for the
  tokenizer reads of ``mugrpo.policy.models`` (``AutoTokenizer.from_pretrained``).

The probe lives beside the bench, not in the product: the job under test may be an older checkout on PYTHONPATH.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import json
import runpy
import sys
import time

RECORD: dict[str, float] = {"probe_start": time.monotonic()}


def _timed(name: str, fn):
    """``fn`` that adds its seconds to ``RECORD[name + '_s']`` and counts calls in ``RECORD[name + 's']``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            t1 = time.monotonic()
            RECORD[f"{name}_s"] = RECORD.get(f"{name}_s", 0.0) + t1 - t0
            RECORD[f"{name}s"] = RECORD.get(f"{name}s", 0) + 1
            RECORD.setdefault(f"{name}_first_start", t0)
            RECORD[f"{name}_last_end"] = t1

    return wrapper


def _first(name: str, fn):
    """``fn`` that stamps ``RECORD[name]`` when its first call returns."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        RECORD.setdefault(name, time.monotonic())
        return out

    return wrapper


class _TimedFromPretrained:
    """Stands in for an auto class in ``mugrpo.policy.models``: its ``from_pretrained`` timed as ``name``."""

    def __init__(self, auto, name: str) -> None:
        self._auto = auto
        self.from_pretrained = _timed(name, auto.from_pretrained)

    def __getattr__(self, name):
        return getattr(self._auto, name)


def _patch_models(module) -> None:
    module.AutoModelForCausalLM = _TimedFromPretrained(module.AutoModelForCausalLM, "policy_load")
    module.AutoTokenizer = _TimedFromPretrained(module.AutoTokenizer, "tokenizer_load")


def _patch_engine(module) -> None:
    module.sample_next_tokens = _first("first_token", module.sample_next_tokens)


def _patch_vllm_engine(module) -> None:
    cls = module.VLLMEngine
    cls.__init__ = _first("engine_ready", cls.__init__)
    cls.generate = _first("first_batch", cls.generate)


def _patch_transformers_engine(module) -> None:
    _patch_engine(module)
    cls = module.TransformersEngine  # from_dir is registered before this patch: stamp the constructor it calls
    cls.__init__ = _first("engine_ready", cls.__init__)


def _patch_updates(module) -> None:
    module.run_update = _first("first_update", module.run_update)


def _patch_resume(module) -> None:
    for name in ("read_optimizer_state", "read_checkpoint"):
        if hasattr(module, name):
            setattr(module, name, _timed("moment_load", getattr(module, name)))


PATCHES = {
    "mugrpo.policy.models": _patch_models,
    "mugrpo.engines.transformers_engine": _patch_transformers_engine,
    "mugrpo.engines.vllm_engine": _patch_vllm_engine,
    "mugrpo.trainer.updates": _patch_updates,
    "mugrpo.trainer.resume": _patch_resume,
}


class _AfterExec(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`PATCHES` with the other finders and patches each right after it executes."""

    def find_spec(self, name, path, target=None):
        patch = PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def patched_exec(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = patched_exec
        return spec


def main() -> None:
    out, module, *args = sys.argv[1:]
    atexit.register(lambda: open(out, "w").write(json.dumps(RECORD)))
    sys.meta_path.insert(0, _AfterExec())
    sys.argv = [module, *args]
    sys.path[0] = ""  # as `python -m` leaves it (this script's folder is not the job's)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
