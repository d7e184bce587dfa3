"""A real pretrained LM learns, beyond the noise of a mutated control: SmolLM2-135M-Instruct, one Mu-GRPO stage of
the main job's recipe (configs/smollm2-arithmetic.yaml, `mugrpo run` through Prefect), against the same stage trained
on shuffled rewards (tests/plugins/shuffled_rewards.py: each rollout's advantage comes from another rollout's
reward, so the update statistics stay and the signal goes).

Everything is real: the SmolLM2 GGUF converted to HF (the ``smollm2_dir`` fixture), reasoning-gym's problems and
verifier, the Prefect flow, the job processes, Parquet and SQL; fp32 (the suite pins ``auto`` to it).

The recipe is the main job's (same reward: the exact answer plus 0.1 for a boxed one) at the size of a test
(TEST_RECIPE): one stage, LoRA rank 16 at lr 1e-4 (the main job's documented LoRA variant: ~60 MB per stage of
adapter and its AdamW moments instead of ~1.6 GB for full weights, and the recipe these figures were measured on),
and one worked example instead of two, so that the base policy boxes about half of its answers at T = 1 (57% of the
stage-0 rollouts; two examples: 91-100%, none: 0-3%) and the format reward has room to rise within one stage; 32
held-out problems x 8 samples at the training temperature measure the final policies.
What each check is for (the mutation it catches):
- both arms sample the same stage-0 rollouts with the same rewards, and only the advantages differ: the control is
  the real stage with one change (a control that samples differently measures something else);
- the trained policy's held-out format reward beats the control's, paired by problem, with a 95% CI clustered by
  problem above 0 (arXiv 2411.00640): a trainer that ignores the advantage, a flipped advantage sign, a loss that
  no longer reaches the weights;
- and it exceeds the base policy's (its stage-0 rollouts, same temperature) by FORMAT_BAR.
The control is needed: trained on shuffled rewards, the policy still boxes more often than the base (0.570 -> 0.695
here), so a rise over the base alone would pass a run that learns nothing from its rewards.

Measured (2026-12-05, the 2-core CPU of docs/benchmarks.md, fp32, one torch thread per job): format reward base
0.570, trained 0.902, control 0.695, trained - control +0.207 [+0.162, +0.252]; exact answers 0.164 against 0.082.
The test takes about 6 minutes of one worker (2 x ~175 s runs: generation, 8 updates, 256 evaluation samples, the
report).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _tiny import REPO_ROOT

from bench.real_lm import LORA_VARIANT
from mugrpo.data.answers import extract_boxed
from mugrpo.evaluation.metrics import paired_difference_ci
from mugrpo.sql import connect

pytestmark = pytest.mark.slow

MAIN = REPO_ROOT / "configs" / "smollm2-arithmetic.yaml"
PLUGINS = REPO_ROOT / "tests" / "plugins"
BENCHMARK = "arithmetic-heldout-t1"
HELDOUT_PROBLEMS = 32
#: The main job, sized for a test: one stage, LoRA, one worked example instead of two, the held-out problems sampled.
TEST_RECIPE = [
    "run.num_stages=1",
    *LORA_VARIANT,
    'data.prompt.examples=[{"question": "Calculate 7 + 5.", "response": "7 + 5 = 12. The answer is \\\\boxed{12}."}]',
    "eval.every_stage=false",
    "eval.benchmarks="
    + json.dumps(
        [
            {
                "dataset": {
                    "name": BENCHMARK,
                    "source": "reasoning_gym",
                    "task": "basic_arithmetic",
                    "params": {
                        "min_terms": 2,
                        "max_terms": 2,
                        "min_digits": 2,
                        "max_digits": 2,
                        "operators": ["+", "-"],
                        "allow_parentheses": False,
                        "allow_negation": False,
                    },
                    "seed": 0,
                    "heldout_fraction": 0.1,
                    "split": "heldout",
                    "size": HELDOUT_PROBLEMS,
                },
                "k": 8,
                "temperature": 1.0,
                "max_new_tokens": 32,
            }
        ]
    ),
]
#: Points of held-out format reward (the share of samples with a boxed answer) the trained policy must add over the
#: base policy's stage-0 rollouts.
FORMAT_BAR = 0.10


def run_arm(name: str, root: Path, prefect_api: str, model_dir: Path, *overrides: str, **env: str) -> Path:  # noqa: F811
    """``mugrpo run`` of the main job with TEST_RECIPE into ``root / name``; returns the run folder."""
    out = root / name
    out.mkdir(parents=True)
    environ = {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "PYTHONUNBUFFERED": "1",
        "MUGRPO_RUN_SLOT": "off",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(PLUGINS)]),
        **env,
    }
    cmd = [sys.executable, "-m", "mugrpo.cli", "run", str(MAIN), f"run.root={out}", f"model.source={model_dir}"]
    log = out / "run.log"
    with log.open("wb") as sink:
        code = subprocess.run(
            cmd + TEST_RECIPE + list(overrides), env=environ, stdout=sink, stderr=subprocess.STDOUT, timeout=1800
        ).returncode
    assert code == 0, log.read_text()[-4000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def boxed(text: str) -> float:
    """The ``format`` reward component of a response (mugrpo.rewards.components): 1.0 for a non-empty box."""
    return 1.0 if extract_boxed(text) else 0.0


def heldout_scores(run_dir: Path) -> tuple[dict[str, float], dict[str, float]]:
    """Per held-out problem, the final policy's mean format reward and its exact accuracy over its k samples."""
    with connect(str(run_dir)) as cat:
        rows = cat.arrow(
            f"SELECT prompt_id, correct, response_text FROM evals WHERE benchmark = '{BENCHMARK}' AND stage = 1"
        ).to_pylist()
    fmt: dict[str, list[float]] = {}
    exact: dict[str, list[float]] = {}
    for r in rows:
        fmt.setdefault(r["prompt_id"], []).append(boxed(r["response_text"]))
        exact.setdefault(r["prompt_id"], []).append(float(r["correct"]))
    return {p: sum(v) / len(v) for p, v in fmt.items()}, {p: sum(v) / len(v) for p, v in exact.items()}


def stage0_rollouts(run_dir: Path) -> list[dict]:
    with connect(str(run_dir)) as cat:
        return cat.arrow(
            "SELECT prompt_id, sample_idx, response_text, reward, advantage FROM rollouts WHERE stage = 0 "
            "ORDER BY prompt_id, sample_idx"
        ).to_pylist()


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def test_smollm2_format_reward_rises_beyond_a_shuffled_reward_control(tmp_path, prefect_api, smollm2_dir):  # noqa: F811
    trained = run_arm("trained", tmp_path, prefect_api, smollm2_dir)
    control = run_arm(
        "control",
        tmp_path,
        prefect_api,
        smollm2_dir,
        "advantage.estimator=shuffled_grpo",
        MUGRPO_PLUGINS="shuffled_rewards",
    )

    base, mutated = stage0_rollouts(trained), stage0_rollouts(control)
    assert len(base) == 16 * 8
    assert [(r["response_text"], r["reward"]) for r in base] == [(r["response_text"], r["reward"]) for r in mutated]
    assert [r["advantage"] for r in base] != [r["advantage"] for r in mutated]

    (ours, our_exact), (theirs, their_exact) = heldout_scores(trained), heldout_scores(control)
    assert len(ours) == len(theirs) == HELDOUT_PROBLEMS
    diff = paired_difference_ci(ours, theirs)
    base_format = mean(boxed(r["response_text"]) for r in base)
    figures = (
        f"format reward: base {base_format:.3f} (stage-0 rollouts), trained {mean(ours.values()):.3f}, control "
        f"{mean(theirs.values()):.3f}, trained - control {diff.mean:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}]; "
        f"exact: trained {mean(our_exact.values()):.3f}, control {mean(their_exact.values()):.3f}"
    )
    print(figures)
    assert diff.low > 0, figures
    assert mean(ours.values()) - base_format >= FORMAT_BAR, figures
