"""Statistics of one prompt's probe group (AGPO, arXiv 2605.20722; released code wandugu/paper_agpo).

Every function takes the G rewards (or response texts) of one group and returns a Python float.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from mugrpo.data.answers import extract_answer_loose

DispersionMode = Literal["std", "mad", "iqr"]

#: MAD -> sigma of a normal distribution (1 / Phi^-1(3/4)).
MAD_SCALE = 1.4826
#: IQR -> sigma of a normal distribution (2 Phi^-1(3/4)).
IQR_SCALE = 1.349
#: AGPO's skew is 0 when the group's std is below this (released code).
SKEW_MIN_STD = 1e-6
#: AGPO clamps the skew to [-SKEW_CLAMP, SKEW_CLAMP].
SKEW_CLAMP = 10.0


def _rewards(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if r.size == 0:
        raise ValueError("a probe group needs at least one reward, got none")
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
        raise ValueError(f"rewards must be finite; entry {int(bad[0])} is {float(r[bad[0]])!r}")
    return r


def sample_std(rewards: Sequence[float] | np.ndarray) -> float:
    """Sample (Bessel, ddof=1) standard deviation; 0 for a group of one (AGPO's code uses the sample std)."""
    r = _rewards(rewards)
    return float(r.std(ddof=1)) if r.size > 1 else 0.0


def mad_sigma(rewards: Sequence[float] | np.ndarray) -> float:
    """1.4826 * median(|r - median(r)|): the MAD scaled to a normal sigma."""
    r = _rewards(rewards)
    return float(MAD_SCALE * np.median(np.abs(r - np.median(r))))


def iqr_sigma(rewards: Sequence[float] | np.ndarray) -> float:
    """(q75 - q25) / 1.349 with linearly interpolated quantiles (numpy's and torch's default)."""
    r = _rewards(rewards)
    q75, q25 = np.percentile(r, [75.0, 25.0])
    return float((q75 - q25) / IQR_SCALE)


DISPERSIONS: dict[str, Callable[[Sequence[float] | np.ndarray], float]] = {
    "std": sample_std,
    "mad": mad_sigma,
    "iqr": iqr_sigma,
}


def dispersion(rewards: Sequence[float] | np.ndarray, mode: DispersionMode = "std") -> float:
    """AGPO's dispersion sigma of a group's rewards: ``std`` (sample std), ``mad`` (MAD x 1.4826) or ``iqr``
    (IQR / 1.349) (arXiv 2605.20722, probe statistics).

    Raises:
        ValueError: unknown mode, no reward, or a non-finite reward.
    """
    try:
        fn = DISPERSIONS[mode]
    except KeyError:
        raise ValueError(f"unknown dispersion mode {mode!r}; known: {', '.join(DISPERSIONS)}") from None
    return fn(rewards)


def robust_dispersion(rewards: Sequence[float] | np.ndarray, mode: DispersionMode = "std") -> float:
    """Dispersion used by AGPO's advantage: a robust mode (mad, iqr) that gives ~0 (< 1e-8) while the rewards
    differ falls back to the sample std (released code; e.g. 7 equal rewards and one outlier have MAD 0)."""
    value = dispersion(rewards, mode)
    if mode != "std" and value < 1e-8:
        return sample_std(rewards)
    return value


def vote_entropy(texts: Sequence[str]) -> float:
    """Vote entropy E = -sum_k p_k log p_k (nats) over the answer keys of a group's responses.

    The key of a response is :func:`mugrpo.data.answers.extract_answer_loose` (the graded answer, else the last number,
    else whitespace-collapsed text; lower-cased; docs/algorithms/agpo.md, "The vote key").

    Raises:
        ValueError: no text.
    """
    if len(texts) == 0:
        raise ValueError("vote entropy needs at least one response, got none")
    counts = Counter(extract_answer_loose(t) for t in texts)
    n = len(texts)
    return float(-sum((c / n) * math.log(c / n) for c in counts.values()))


def skewness(rewards: Sequence[float] | np.ndarray) -> float:
    """AGPO's adjusted skew k3 = sqrt(n(n-1))/(n-2) * mean(z^3), z = (r - mean)/std with the sample std,
    clamped to [-10, 10]; 0 when n < 3 or std < 1e-6 (released code).
    """
    r = _rewards(rewards)
    n = r.size
    if n < 3:
        return 0.0
    std = r.std(ddof=1)
    if std < SKEW_MIN_STD:
        return 0.0
    z = (r - r.mean()) / std
    k3 = math.sqrt(n * (n - 1)) / (n - 2) * float(np.mean(z**3))
    return float(min(max(k3, -SKEW_CLAMP), SKEW_CLAMP))


@dataclass(frozen=True)
class ProbeStats:
    """Statistics of one prompt's probe group.

    Attributes:
        sigma: reward dispersion (the configured mode).
        entropy: vote entropy over answer keys (nats).
        skew: adjusted skew k3, clamped to +-10.
        mean_reward: mean probe reward (reported only).
    """

    sigma: float
    entropy: float
    skew: float
    mean_reward: float

    def uncertainty(self, w_r: float, w_e: float, w_k: float) -> float:
        """U = w_r sigma + w_e E + w_k |k3| (arXiv 2605.20722)."""
        return w_r * self.sigma + w_e * self.entropy + w_k * abs(self.skew)


def probe_stats(rewards: Sequence[float], texts: Sequence[str], mode: DispersionMode = "std") -> ProbeStats:
    """:class:`ProbeStats` of one probe group (rewards [G] and the G response texts).

    Raises:
        ValueError: lengths differ, empty group, non-finite reward, unknown mode.
    """
    if len(rewards) != len(texts):
        raise ValueError(f"probe group has {len(rewards)} rewards but {len(texts)} texts")
    r = _rewards(rewards)
    return ProbeStats(
        sigma=dispersion(r, mode), entropy=vote_entropy(texts), skew=skewness(r), mean_reward=float(r.mean())
    )
