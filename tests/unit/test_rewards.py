"""Verifiable rewards on real GSM8K / MATH-500 golds, scored in real worker processes.

The hanging, raising and crashing components below are test-only reward components: they run inside the
scorer's real spawned workers (which import this module to unpickle them), to make a timeout, an exception
and a worker death happen deterministically.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from mugrpo.data.answers import extract_gold
from mugrpo.rewards import (
    REWARD_FUNCTIONS,
    RewardConfig,
    RewardInput,
    RewardScorer,
)

pytestmark = pytest.mark.waits  # run first, it mostly waits: the verifier's per-item time limit is waited out

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_data = pytest.mark.usefixtures("shared_data_dir")  # skipped without the data; a failure under CI


@REWARD_FUNCTIONS.register("test_misbehave")
def _misbehave(item: RewardInput, answer: str | None) -> float:
    """Test-only: hangs on "HANG", sleeps 1 s on "SLOW", raises on "RAISE", kills its process on "DIE", returns
    its worker's pid on "PID"; on "KILLME" writes its pid to $MUGRPO_TEST_PIDFILE, then sleeps 2 s."""
    if "KILLME" in item.response_text:
        pidfile = Path(os.environ["MUGRPO_TEST_PIDFILE"])
        pidfile.with_suffix(".tmp").write_text(str(os.getpid()))
        pidfile.with_suffix(".tmp").replace(pidfile)  # atomic: the killer never reads a half-written pid
        time.sleep(2.0)
    if "HANG" in item.response_text:
        time.sleep(600)
    if "SLOW" in item.response_text:
        time.sleep(1.0)
    if "RAISE" in item.response_text:
        raise ArithmeticError("deliberate failure")
    if "DIE" in item.response_text:
        os._exit(3)
    if "PID" in item.response_text:
        return float(os.getpid())
    return 1.0


def _rows(relative: str) -> list[dict]:
    with open(DATA_DIR / relative, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def scorer() -> Iterator[RewardScorer]:
    with RewardScorer(RewardConfig(components={"math_correctness": 1.0, "format": 0.1})) as s:
        yield s


def test_registry_and_config_validation() -> None:
    assert {"math_correctness", "format"} <= set(REWARD_FUNCTIONS)
    with pytest.raises(ValueError, match=r"unknown reward component 'bleu'; registered: .*format, math_correctness"):
        REWARD_FUNCTIONS["bleu"]
    with pytest.raises(ValidationError, match="unknown reward component 'bleu'"):
        RewardConfig(components={"bleu": 1.0})
    with pytest.raises(ValidationError, match="at least one"):
        RewardConfig(components={})
    with pytest.raises(ValidationError, match="start_method"):
        RewardConfig(start_method="fork")
    with pytest.raises(ValueError, match="already registered"):
        REWARD_FUNCTIONS.register("format")(_misbehave)


@needs_data
def test_gsm8k_correct_wrong_and_unanswered(scorer: RewardScorer) -> None:
    rows = _rows("gsm8k/test.jsonl")[:20]
    golds = [extract_gold(row["answer"], "gsm8k") for row in rows]
    batch = []
    for gold in golds:
        batch.append(RewardInput(f"Let me compute step by step.\nThe answer is $\\boxed{{{gold}}}$.", gold))
        batch.append(RewardInput(f"Adding up gives \\boxed{{{int(float(gold)) + 1}}}.", gold))
        batch.append(RewardInput(f"I think it is {gold} but I am not sure.", gold))  # no final-answer marker
        batch.append(RewardInput(f"So the total is\n#### {gold}", gold))  # GSM8K style, no box
    results = scorer.score(batch)
    assert all(r.status == "ok" for r in results)
    for i, gold in enumerate(golds):
        correct, wrong, unanswered, hashed = results[4 * i : 4 * i + 4]
        assert correct.components == {"math_correctness": 1.0, "format": 1.0}
        assert correct.reward == pytest.approx(1.1) and correct.extracted_answer == gold
        assert wrong.components == {"math_correctness": 0.0, "format": 1.0} and wrong.reward == pytest.approx(0.1)
        assert unanswered.reward == 0.0 and unanswered.extracted_answer is None
        assert hashed.components == {"math_correctness": 1.0, "format": 0.0} and hashed.reward == 1.0


@needs_data
def test_every_math500_gold_verifies_against_itself(scorer: RewardScorer) -> None:
    golds = [extract_gold(row["answer"], "plain") for row in _rows("math500/test.jsonl")]
    results = scorer.score([RewardInput(f"Therefore the answer is $\\boxed{{{g}}}$.", g) for g in golds])
    failed = [(g, r) for g, r in zip(golds, results, strict=True) if r.components["math_correctness"] != 1.0]
    assert not failed


@needs_data
def test_math500_equivalent_forms(scorer: RewardScorer) -> None:
    golds = [extract_gold(row["answer"], "plain") for row in _rows("math500/test.jsonl")]
    # (dataset gold, a prediction math-verify deems equivalent, a wrong prediction)
    cases = [
        (golds[2], r"\dfrac{14}{3}", r"\frac{3}{14}"),  # \frac{14}{3}
        (golds[0], r"(3, \pi/2)", r"(3, \pi)"),  # \left( 3, \frac{\pi}{2} \right)
        (golds[1], r"-q + p", r"q - p"),  # p - q
        (golds[7], "90", "45"),  # 90^\circ
        (golds[4], r"\text{Evelyn}", r"\text{Bob}"),  # \text{Evelyn}
    ]
    assert golds[2] == r"\frac{14}{3}" and golds[7] == r"90^\circ"
    batch = [RewardInput(rf"... so \boxed{{{pred}}}", gold) for gold, ok, bad in cases for pred in (ok, bad)]
    results = scorer.score(batch)
    got = [r.components["math_correctness"] for r in results]
    assert got == [1.0, 0.0] * len(cases)


@pytest.mark.parametrize(
    ("gold", "response", "expected"),
    [
        (r"\frac{1}{2}", r"\boxed{0.5}", 1.0),
        (r"\frac{1}{2}", r"\boxed{\dfrac12}", 1.0),
        ("0.5", r"\boxed{\frac{1}{2}}", 1.0),
        ("1000", r"\boxed{1,000}", 1.0),
        (r"\frac{1}{2}", r"\boxed{\frac{1}{3}}", 0.0),
        (r"\frac{1}{2}", r"\boxed{}", 0.0),  # empty box: no answer
        (r"\frac{1}{2}", r"\boxed{\frac{1}{2}", 0.0),  # truncated box: no answer
    ],
)
def test_hand_equivalences(scorer: RewardScorer, gold: str, response: str, expected: float) -> None:
    (result,) = scorer.score([RewardInput(response, gold)])
    assert result.status == "ok"
    assert result.components["math_correctness"] == expected


def test_format_needs_a_complete_nonempty_box(scorer: RewardScorer) -> None:
    responses = [r"so \boxed{7}", r"so \fbox{7}", "so 7", "#### 7", r"\boxed{}", r"\boxed{7"]
    results = scorer.score([RewardInput(text, "7") for text in responses])
    assert [r.components["format"] for r in results] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_timeout_error_and_crash_never_stop_the_scorer() -> None:
    config = RewardConfig(components={"test_misbehave": 1.0, "format": 0.5}, verify_timeout_s=3.0)
    with RewardScorer(config) as scorer:
        scorer.wait_ready()  # so the 3 s limit measures scoring, not interpreter start-up
        batch = [
            RewardInput(r"HANG \boxed{1}", "1"),
            RewardInput(r"fine \boxed{1}", "1"),
            RewardInput(r"RAISE \boxed{1}", "1"),
            RewardInput(r"DIE \boxed{1}", "1"),
            RewardInput("fine, no box", "1"),
        ]
        hang, fine, raised, died, unboxed = scorer.score(batch)
        assert (hang.status, hang.reward, hang.components) == ("timeout", 0.0, {"test_misbehave": 0.0, "format": 0.0})
        assert hang.extracted_answer == "1"  # extraction happens in the parent, so it is kept
        assert (fine.status, fine.reward) == ("ok", 1.5)
        assert raised.status == "error: ArithmeticError: deliberate failure" and raised.reward == 0.0
        assert died.status == "error: WorkerDied: exit code 3" and died.reward == 0.0
        assert (unboxed.status, unboxed.reward) == ("ok", 1.0)
        # the hung worker, and the three the "DIE" item killed (first try + 2 retries on fresh workers)
        assert scorer.num_workers_replaced == 4

        # The replacement workers serve the next batch.
        again = scorer.score([RewardInput(rf"\boxed{{{i}}}", str(i)) for i in range(6)])
        assert [r.status for r in again] == ["ok"] * 6 and all(r.reward == 1.5 for r in again)


def test_a_worker_killed_from_outside_does_not_change_the_reward(tmp_path, monkeypatch) -> None:
    """Regression (chaos harness): SIGKILL of a verifier worker mid-item used to commit reward 0 with
    status "error: WorkerDied" for that rollout, so a run whose verifier was killed trained on other rewards than
    an uninterrupted one. The item is now run again on a fresh worker and gets its real reward."""
    import signal
    import threading

    pidfile = tmp_path / "pid"
    monkeypatch.setenv("MUGRPO_TEST_PIDFILE", str(pidfile))  # spawned workers inherit it
    killed: list[int] = []

    def kill_first_worker() -> None:
        deadline = time.monotonic() + 120
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        killed.append(int(pidfile.read_text()))
        os.kill(killed[0], signal.SIGKILL)

    # spawn: a worker reads the pid file's path from its environment, and a forkserver started by an earlier test
    # of this process would fork workers with the environment it started with
    config = RewardConfig(components={"test_misbehave": 1.0, "format": 0.5}, num_workers=1, start_method="spawn")
    with RewardScorer(config) as scorer:
        scorer.wait_ready()
        killer = threading.Thread(target=kill_first_worker)
        killer.start()
        (result,) = scorer.score([RewardInput(r"KILLME \boxed{1}", "1")])
        killer.join()
        assert killed and int(pidfile.read_text()) != killed[0]  # the retry ran on a fresh worker
        assert (result.status, result.reward) == ("ok", 1.5)
        assert scorer.num_workers_replaced == 1


def test_items_run_in_parallel_across_workers() -> None:
    """Four 1-second items on two workers: both workers take items (checked by pid, not by timing)."""
    config = RewardConfig(components={"test_misbehave": 1.0}, num_workers=2, verify_timeout_s=30.0)
    with RewardScorer(config) as scorer:
        scorer.wait_ready()
        results = scorer.score([RewardInput("SLOW PID", "0")] * 4)
    assert [r.status for r in results] == ["ok"] * 4
    assert len({r.reward for r in results}) == 2  # two distinct worker pids


def test_close_stops_every_worker_process() -> None:
    import multiprocessing

    before = {p.pid for p in multiprocessing.active_children()}
    scorer = RewardScorer(RewardConfig(components={"test_misbehave": 1.0}, num_workers=2))
    scorer.wait_ready()
    workers = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert len(workers) == 2 and all(p.is_alive() for p in workers)
    scorer.close()
    scorer.close()  # idempotent
    assert not any(p.is_alive() for p in workers)
    with pytest.raises(RuntimeError, match="closed"):
        scorer.score([RewardInput("x", "1")])


def _broken_initializer() -> None:
    raise ImportError("deliberately broken environment")


def _identity(item: object) -> object:
    return item


def test_a_worker_that_cannot_start_is_a_clear_error_not_a_hang() -> None:
    from mugrpo.rewards.pool import TimeoutPool

    with TimeoutPool(_identity, 1, initializer=_broken_initializer, start_timeout_s=60) as pool:
        with pytest.raises(RuntimeError, match="failed to start"):
            pool.wait_ready()
