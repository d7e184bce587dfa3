"""The verifier pool a generation or evaluation worker keeps for its lifetime (shared by
:class:`~mugrpo.generation.GenerationWorker` and :class:`~mugrpo.evaluation.worker.EvalWorker`).

The pool (:class:`~mugrpo.rewards.RewardScorer`: math-verify in worker processes with per-item timeouts) is
started on first use and waited ready, so its workers' imports are not charged to the first batch; it is
restarted only when the reward config changes, and stopped when the worker closes. A warm segment job keeps one
worker, hence one pool, across its stages; a cold job starts it once.
"""

from __future__ import annotations

from mugrpo.rewards import RewardConfig, RewardScorer


class VerifierPoolOwner:
    """Base of the generation and evaluation workers: owns one verifier pool; a context manager that stops it."""

    def __init__(self) -> None:
        self._scorer: RewardScorer | None = None
        self._reward_config: RewardConfig | None = None
        self._ready = False

    def start_verifier_pool(self, config: RewardConfig) -> None:
        """Start the verifier pool scoring with ``config`` without waiting for its workers (restarted when
        ``config`` differs from the running pool's): they start while the caller loads its engine, and
        :meth:`verifier_pool` waits them ready.

        Raises:
            RuntimeError: the pool could not be started.
        """
        if self._scorer is not None and self._reward_config != config:
            self.close()
        if self._scorer is None:
            scorer = RewardScorer(config)
            try:
                scorer.start()
            except BaseException:
                scorer.close()
                raise
            self._scorer, self._reward_config, self._ready = scorer, config, False

    def verifier_pool(self, config: RewardConfig) -> RewardScorer:
        """The verifier pool scoring with ``config``: started on first use (or by :meth:`start_verifier_pool`) and
        waited ready, restarted when ``config`` differs from the running pool's.

        Raises:
            RuntimeError: the pool's processes did not start in time (:meth:`TimeoutPool.wait_ready`).
        """
        self.start_verifier_pool(config)
        if not self._ready:
            try:
                self._scorer.wait_ready()
            except BaseException:
                self.close()
                raise
            self._ready = True
        return self._scorer

    def close(self) -> None:
        """Stop the verifier pool (an engine passed to the worker stays its caller's). Idempotent."""
        if self._scorer is not None:
            self._scorer.close()
            self._scorer = None
            self._reward_config = None
            self._ready = False

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
