"""Which reward component says whether a rollout's answer is right, as SQL over the ``rollouts`` view."""

from __future__ import annotations

#: The reward components that say whether a rollout's answer is right, most exact first: math-verify's
#: ``math_correctness``, the reasoning-gym task's ``reasoning_gym_exact`` (1 only when exact), then its
#: ``reasoning_gym`` score (partial credit below 1). A run's reward has one of them (mugrpo.rewards registers them).
CORRECTNESS_COMPONENTS = ("math_correctness", "reasoning_gym_exact", "reasoning_gym")


def correctness_sql(default: str | None = None) -> str:
    """The SQL expression of a rollout's correctness: the first of :data:`CORRECTNESS_COMPONENTS` its
    ``reward_components`` map holds, else ``default`` (a SQL literal; None: NULL)."""
    terms = [f"reward_components['{name}']" for name in CORRECTNESS_COMPONENTS]
    return f"coalesce({', '.join(terms + ([default] if default is not None else []))})"
