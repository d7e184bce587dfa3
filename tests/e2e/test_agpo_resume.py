"""AGPO under SIGKILL and under warm execution, through the real CLI, flows and job processes.

- Cold: a 2-stage tiny AGPO run (`mugrpo run`, real Prefect flows on a local server, generate/train/eval job
  processes) is SIGKILLed four times: the whole tree while stage 0's generate job is in shard 1's probe (shard 0
  committed, its temperature EMA to be replayed), the train job alone after stage 0's first update, the flow
  process alone during stage 1's probe, and the whole tree after stage 1's second update. Resumed each time, it
  ends with bitwise the weights, rollouts (temperatures, U, c), train_steps (eps, H, H_ref, KLbar) and controller
  states (temperature EMA, H_ref, KLbar in the manifests and the last checkpoint) of an uninterrupted run.
- Warm: the same config under warm execution (one segment job, weights and controllers carried in memory) gives the
  cold run's files bitwise, also when the segment job is SIGKILLed in stage 1's probe and resumed.

Tiny random Llama with the real SmolLM2 tokenizer, CPU. Slow: `-m "not slow"` skips it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _prefect import prefect_api, prefect_server  # noqa: F401  (fixtures)
from _tiny import AGPO_LOSS, gsm8k_eval, run_env, tiny_config, write_config

from bench.support.chaos.harness import RunProcess
from bench.support.chaos.invariants import check_run
from bench.support.chaos.procs import alive, kill, process_tree

RUN, STAGES, UPDATES = "agpo", 2, 3

pytestmark = pytest.mark.slow


def agpo_config(root: Path, model_dir: Path, execution: str = "cold") -> dict:
    return tiny_config(
        root,
        model_dir,
        run_id=RUN,
        run={"seed": 7, "num_stages": STAGES},
        generation={
            "engine_kwargs": {"num_threads": 1},
            "sampling": {"temperature": 0.3, "max_new_tokens": 2, "n": 4},
        },
        advantage={"estimator": "agpo"},
        loss=AGPO_LOSS,
        # The tiny random policy is near uniform over 49k tokens at T = 1, so at tau_base 1 every probe answer differs,
        # E = log G for every prompt and tau never moves. At T = 0.3 its top token has p ~ 0.3-0.9: two-token probes
        # repeat answers, E (hence U, c, tau) differs between prompts and the EMA replay is actually exercised.
        agpo={"probe": True, "tau_base": 0.3, "tau_min": 0.1, "tau_max": 0.6, "tau_lambda": 0.5},
        train={"updates_per_stage": UPDATES},
        eval={"benchmarks": [gsm8k_eval(num_prompts=1)]},
        orchestration={"execution": execution, "segment_stages": STAGES},
        tracking={"sinks": []},
    )


def _start(tmp: Path, name: str, model_dir: Path, api: str, execution: str = "cold") -> tuple[RunProcess, Path]:
    root = tmp / name
    cfg = write_config(tmp / f"{name}.yaml", agpo_config(root, model_dir, execution))
    run = RunProcess(cfg, run_env(api, MUGRPO_RUN_SLOT="off"), tmp / f"{name}.log")
    run.start()
    return run, root / RUN


def _finish(run: RunProcess) -> None:
    if not run.running():
        run.start()
    assert run.wait(timeout_s=1800) == 0, run.tail(60)


def _kill_when(run: RunProcess, ready, role: str) -> None:
    """Once ``ready()``, SIGKILL the ``role`` process of the run's tree (``tree``: all of it), then the orphans."""
    deadline = time.monotonic() + 900
    while not ready():
        assert run.running(), f"run ended (code {run.proc.returncode}) too early:\n{run.tail(60)}"
        assert time.monotonic() < deadline, run.tail(60)
        time.sleep(0.02)
    tree = process_tree(run.proc.pid)
    victims = [p.pid for p in tree if role == "tree" or p.role == role][: None if role == "tree" else 1]
    assert victims, f"no {role} process in {tree}"
    kill(victims)
    run.wait(timeout_s=300)  # a job killed alone fails its task (retries 0) and the flow exits
    kill([p.pid for p in tree if alive(p.pid)])  # what a pod would take down with it
    assert not run.running()


def _controller_state(run_dir: Path) -> dict:
    """Everything AGPO keeps: per-stage manifests' controller metrics, the last checkpoint's, and per-row/per-update
    records."""
    state: dict = {}
    for k in range(STAGES):
        gen = json.loads((run_dir / f"jobs/stage={k}/generate.manifest.json").read_text())
        train = json.loads((run_dir / f"jobs/stage={k}/train.manifest.json").read_text())
        state[f"u_ema/{k}"] = gen["metrics"]["agpo_u_ema"]
        state[f"train/{k}"] = {m: v for m, v in train["metrics"].items() if m.startswith("agpo_")}
        rows = pq.read_table(run_dir / f"rollouts/stage={k}").to_pylist()
        rows.sort(key=lambda r: (r["prompt_id"], r["is_probe"], r["sample_idx"]))
        cols = ("prompt_id", "sample_idx", "is_probe", "temperature", "agpo_u", "agpo_c", "reward", "advantage")
        state[f"rollouts/{k}"] = [tuple(r[c] for c in cols) for r in rows]
        steps = pq.read_table(run_dir / f"train_steps/stage={k}").sort_by("update").to_pylist()
        state[f"steps/{k}"] = [(s["update"], s["loss"], sorted(dict(s["loss_metrics"]).items())) for s in steps]
    last = run_dir / f"checkpoints/stage={STAGES - 1}/step={UPDATES:06d}/trainer_state.json"
    state["checkpoint"] = json.loads(last.read_text())["agpo"]
    return state


@pytest.fixture(scope="module")
def reference(tiny_model_dir, prefect_api, tmp_path_factory) -> dict:
    """The uninterrupted cold run: its run folder and controller state."""
    run, run_dir = _start(tmp_path_factory.mktemp("agpo-reference"), "ref", tiny_model_dir, prefect_api)
    _finish(run)
    return {"dir": run_dir, "state": _controller_state(run_dir)}


def _assert_same_as(reference: dict, run_dir: Path) -> None:
    check = check_run(run_dir, reference["dir"], STAGES)
    assert check.ok, check.problems
    state, ref = _controller_state(run_dir), reference["state"]
    assert state.keys() == ref.keys()
    for key in ref:
        assert state[key] == ref[key], f"{key} differs from the uninterrupted run"
    # the controllers did move: not a comparison of constants
    assert len({r[3] for r in ref["rollouts/1"] if not r[2]}) > 1, "stage 1's temperatures are all equal"
    assert ref["checkpoint"]["kl_bar"] > 0 and ref["checkpoint"]["h_ref"] > 0


def test_sigkill_mid_probe_and_mid_train_then_resume_is_bitwise(reference, tiny_model_dir, prefect_api, tmp_path):
    run, run_dir = _start(tmp_path, "killed", tiny_model_dir, prefect_api)
    shard = "rollouts/stage={}/shard=00000.parquet"
    kills = [
        (lambda: (run_dir / shard.format(0)).exists(), "tree"),  # stage 0, shard 1's probe
        (lambda: (run_dir / "checkpoints/stage=0/step=000001/_COMPLETE").exists(), "train"),
        (lambda: (run_dir / shard.format(1)).exists(), "flow"),  # stage 1, shard 1's probe
        (lambda: (run_dir / "checkpoints/stage=1/step=000002/_COMPLETE").exists(), "tree"),
    ]
    for ready, role in kills:
        if not run.running():
            run.start()
        _kill_when(run, ready, role)
    _finish(run)
    log = run.log.read_text()
    assert "(1 already written)" in log  # a generate job resumed after its first shard: the EMA was replayed
    assert "train stage 0: resuming after update 1" in log and "train stage 1: resuming after update 2" in log
    _assert_same_as(reference, run_dir)


def test_warm_execution_matches_cold_also_after_a_sigkill_mid_probe(reference, tiny_model_dir, prefect_api, tmp_path):
    run, run_dir = _start(tmp_path, "warm", tiny_model_dir, prefect_api, execution="warm")
    _kill_when(run, lambda: (run_dir / "rollouts/stage=1/shard=00000.parquet").exists(), "segment")
    _finish(run)
    assert "1 already committed, 1 to run" in run.log.read_text()
    _assert_same_as(reference, run_dir)
