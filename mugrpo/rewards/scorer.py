"""Batch reward scoring: every configured component of every response, in parallel worker processes."""

from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass, field
from functools import partial

from mugrpo.data.answers import extract_answer
from mugrpo.rewards.config import RewardConfig
from mugrpo.rewards.pool import TimeoutPool
from mugrpo.rewards.registry import REWARD_FUNCTIONS, RewardFn, RewardInput

__all__ = ["NonFiniteReward", "RewardResult", "RewardScorer"]


@dataclass(frozen=True, slots=True)
class RewardResult:
    """Reward of one response, as stored in its rollout row."""

    reward: float
    """Weighted sum of the components; 0.0 unless ``status == "ok"``."""
    components: dict[str, float] = field(default_factory=dict)
    """Unweighted value of every configured component (all 0.0 unless ``status == "ok"``)."""
    extracted_answer: str | None = None
    """The predicted answer graded (:func:`mugrpo.data.answers.extract_answer`); None if the response has none."""
    status: str = "ok"
    """``"ok"``, ``"timeout"`` (over ``verify_timeout_s``) or ``"error: <ExcType>: <message>"``."""


class NonFiniteReward(ValueError):
    """A reward component returned NaN or inf; the response is scored like one whose component raised."""


def _score_components(
    task: tuple[RewardInput, str | None], components: tuple[tuple[str, RewardFn], ...]
) -> dict[str, float]:
    """Worker side: every component of one response (unweighted)."""
    item, answer = task
    values = {name: float(fn(item, answer)) for name, fn in components}
    bad = {name: v for name, v in values.items() if not math.isfinite(v)}
    if bad:  # a NaN reward would turn its whole group's advantages (and the loss) into NaN
        raise NonFiniteReward(f"component {', '.join(f'{k} returned {v}' for k, v in bad.items())}")
    return values


def _init_worker(component_fns: tuple[RewardFn, ...] = ()) -> None:
    """Worker start-up: quiet math-verify's one-time "timeout disabled" warning (our pool enforces the limit), import
    each component's ``preload`` modules (already imported where a forkserver forked the worker; a spawned worker
    imports them here) and run its optional ``prepare()`` (e.g. checking reasoning-gym is installed), so that no
    item's time limit pays for a worker's imports."""
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # The functions, not their names: one registered outside mugrpo (a plugin, a test) reaches a fresh worker
    # pickled by reference, which imports (and so registers) it there.
    for fn in component_fns:
        for module in getattr(fn, "preload", ()):
            importlib.import_module(module)
        getattr(fn, "prepare", lambda: None)()


class RewardScorer:
    """Scores batches of responses with the weighted reward of :class:`RewardConfig`.

    Owns a :class:`~mugrpo.rewards.pool.TimeoutPool` of ``config.num_workers`` processes (started on
    construction); use it as a context manager so the workers stop with it::

        with RewardScorer(RewardConfig()) as scorer:
            results = scorer.score([RewardInput(response_text, gold), ...])

    A response whose scoring exceeds ``verify_timeout_s``, raises, or returns NaN/inf from a component gets reward 0
    and status ``"timeout"`` / ``"error: ..."`` (``"error: NonFiniteReward: component X returned nan"``); the batch
    and the scorer carry on.
    """

    def __init__(self, config: RewardConfig | None = None) -> None:
        self.config = config or RewardConfig()
        components = tuple((name, REWARD_FUNCTIONS[name]) for name in self.config.components)
        self._pool = TimeoutPool(
            partial(_score_components, components=components),
            self.config.num_workers,
            start_method=self.config.start_method,
            initializer=partial(_init_worker, tuple(fn for _, fn in components)),
            start_timeout_s=self.config.worker_start_timeout_s,
            preload=("mugrpo.rewards.scorer", *(m for _, fn in components for m in getattr(fn, "preload", ()))),
        )

    @property
    def num_workers_replaced(self) -> int:
        """Workers killed and replaced so far (after a timeout or a crash)."""
        return self._pool.num_replaced

    def start(self) -> None:
        """Start the worker processes without waiting for them (:meth:`TimeoutPool.start`); :meth:`wait_ready`
        then waits.

        Raises:
            RuntimeError: the scorer is closed.
        """
        self._pool.start()

    def wait_ready(self) -> None:
        """Block until every worker process has started; call it early to fail fast on a broken environment.

        Raises:
            RuntimeError: a worker could not start within ``config.worker_start_timeout_s``.
        """
        self._pool.wait_ready()

    def score(self, batch: list[RewardInput]) -> list[RewardResult]:
        """Reward of each response of ``batch``, in order; items run in parallel across the workers.

        Raises:
            RuntimeError: the scorer is closed, or a worker could not start (a broken environment).
        """
        answers = [extract_answer(item.response_text) for item in batch]
        outcomes = self._pool.map(list(zip(batch, answers, strict=True)), self.config.verify_timeout_s)
        weights = self.config.components
        results = []
        for answer, outcome in zip(answers, outcomes, strict=True):
            if outcome.ok:
                values = outcome.value
                reward = sum(weights[name] * values[name] for name in weights)
            else:
                values = dict.fromkeys(weights, 0.0)
                reward = 0.0
            results.append(RewardResult(float(reward), values, answer, outcome.status))
        return results

    def close(self) -> None:
        """Stop the worker processes. Idempotent."""
        self._pool.close()

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
