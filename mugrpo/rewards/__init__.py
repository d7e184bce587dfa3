"""Verifiable rewards: a registry of reward components and a batch scorer with per-item timeouts.

Importing this package registers the built-in components ``math_correctness``, ``format``, ``reasoning_gym`` and
``reasoning_gym_exact``.
"""

from mugrpo.rewards import components as _components  # noqa: F401  (registers the built-ins)
from mugrpo.rewards import reasoning_gym as _reasoning_gym  # noqa: F401  (registers reasoning_gym, reasoning_gym_exact)
from mugrpo.rewards.config import RewardConfig
from mugrpo.rewards.registry import REWARD_FUNCTIONS, RewardFn, RewardInput
from mugrpo.rewards.scorer import RewardResult, RewardScorer

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardConfig",
    "RewardFn",
    "RewardInput",
    "RewardResult",
    "RewardScorer",
]
