"""Job entry modules stay light to import: heavy modules a job does not need before its first useful work are
imported on use (the job-start profile in docs/benchmarks.md, "Job start").

- ``mugrpo.jobs.generate``, ``mugrpo.jobs.eval`` and ``mugrpo.jobs.segment`` (the jobs that run a verifier pool):
  a pool worker, spawned or forked from the pool's forkserver, re-imports the job's main module (``__mp_main__``),
  so anything such a module imports at its top is imported again by every verifier worker before it can score. They
  must import neither torch nor transformers nor the libraries of generation, evaluation or the warm segment.
- ``mugrpo.jobs.train``: torch.distributed.checkpoint's ``state_dict`` module is needed for a checkpoint, a publish,
  a resume or carried AdamW moments, not to start; it must not come with the job's imports. (The package
  ``torch.distributed.checkpoint`` itself, DTensor and transformers' masking utilities are imported by
  transformers' ``modeling_utils``, which loading any policy needs: they are not ours to defer.)
- a config load, the first step of every ``mugrpo`` command: math-verify and sympy (0.25 s of CPU) are imported by
  the reward components where they score (``math_correctness``'s ``preload``), not where their names are checked.

Each check runs in a fresh interpreter (this process has imported everything already).
"""

from __future__ import annotations

import json
import subprocess
import sys

import _tiny
import pytest

#: job module -> modules that must not be in sys.modules once it is imported
NOT_IMPORTED = {
    "mugrpo.jobs.generate": ("torch", "transformers", "mugrpo.generation", "sympy"),
    "mugrpo.jobs.eval": ("torch", "transformers", "mugrpo.evaluation.worker", "sympy"),
    "mugrpo.jobs.segment": ("torch", "transformers", "mugrpo.execution.warm", "mugrpo.generation", "sympy"),
    "mugrpo.jobs.train": ("torch.distributed.checkpoint.state_dict",),
}


def loaded_after_import(module: str, candidates: tuple[str, ...], then: str = "pass") -> list[str]:
    """Which of ``candidates`` a fresh interpreter holds in sys.modules after ``import module`` and ``then``."""
    code = f"import json, sys, {module}; {then}; "
    code += f"print(json.dumps([m for m in {list(candidates)!r} if m in sys.modules]))"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=_tiny.job_env(), cwd=_tiny.REPO_ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "module",
    # The train job's module imports torch and transformers (about 3-4 s on a quiet machine): slow tier.
    [
        "mugrpo.jobs.generate",
        "mugrpo.jobs.eval",
        "mugrpo.jobs.segment",
        pytest.param("mugrpo.jobs.train", marks=pytest.mark.slow),
    ],
)
def test_job_module_does_not_import_what_it_needs_only_later(module):
    assert loaded_after_import(module, NOT_IMPORTED[module]) == []


@pytest.mark.slow
def test_the_check_sees_an_eager_import():
    # The same check on a module that does import them eagerly reports them (the check can fail).
    assert loaded_after_import("torch.distributed.checkpoint.state_dict", NOT_IMPORTED["mugrpo.jobs.train"]) == list(
        NOT_IMPORTED["mugrpo.jobs.train"]
    )


def test_a_config_load_leaves_the_verifier_to_the_scorer():
    # The quick config's reward has math_correctness, whose name the load checks.
    config = str(_tiny.REPO_ROOT / "configs" / "gsm8k-smollm2-quick.yaml")
    verifier = ("sympy", "math_verify")
    assert loaded_after_import("mugrpo.config", verifier, then=f"mugrpo.config.load_config({config!r}, [])") == []
    # Scoring imports them (the check sees them when they are there).
    score = "assert m.math_correctness(m.RewardInput('x', '1/2'), '0.5') == 1.0"
    assert loaded_after_import("mugrpo.rewards.components as m", verifier, then=score) == list(verifier)
