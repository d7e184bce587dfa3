"""A mutated control for learning tests: GRPO advantages computed from *shuffled* rewards (loaded as a plugin:
``MUGRPO_PLUGINS=shuffled_rewards``, then ``advantage.estimator=shuffled_grpo``).

The rewards of a scored batch (one generation shard: its prompts x G rollouts) are permuted across all its rollouts
before the GRPO advantage (arXiv 2402.03300, Sec. 4.1.2) is taken, so each rollout is pushed up or down by another
rollout's reward. The update statistics stay those of a real run (same reward distribution, about as many groups
with signal, same advantage magnitudes) while the link between a response and its reward is cut: a run trained on
them should learn nothing about the task, and any rise it shows is the noise a real run must beat
(tests/e2e/test_smollm2_learning.py). The rollout rows keep their true rewards; only the advantages are shuffled.

The permutation is seeded by the batch's group ids, so a re-scored shard (a resumed stage) gets the same one.
"""

from __future__ import annotations

import hashlib

import numpy as np

from mugrpo.scoring.advantages import ADVANTAGE_ESTIMATORS, AdvantageConfig, ArrayLike, grpo_advantages


def shuffled(rewards: ArrayLike, group_ids: ArrayLike) -> np.ndarray:
    """``rewards`` [N] permuted by a generator seeded with a digest of ``group_ids`` [N] (deterministic per batch)."""
    r = np.asarray(rewards, dtype=np.float64)
    digest = hashlib.sha256("\n".join(map(str, np.asarray(group_ids).tolist())).encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    return r[rng.permutation(r.size)]


@ADVANTAGE_ESTIMATORS.register("shuffled_grpo")
def shuffled_grpo_advantages(
    rewards: ArrayLike, group_ids: ArrayLike, config: AdvantageConfig
) -> tuple[np.ndarray, np.ndarray]:
    """GRPO advantages of the batch's rewards after :func:`shuffled`: shapes rewards [N], group_ids [N] ->
    advantages [N] float32, zero_variance [N] bool (of the shuffled rewards' groups)."""
    return grpo_advantages(shuffled(rewards, group_ids), group_ids, config)
