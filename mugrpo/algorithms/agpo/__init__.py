"""AGPO (arXiv 2605.20722; released code wandugu/paper_agpo): adaptive sampling temperatures from probe groups, and
a per-group clip range from an entropy- and KL-driven controller. Registered as ``agpo`` (:mod:`.algorithm`).

===============  =====================================================================================
module           what
===============  =====================================================================================
``config``       the ``agpo`` config section
``stats``        a probe group's dispersion, vote entropy and skew (pure)
``controllers``  the temperature and clip-range controllers, their state as ``state_dict()`` (pure)
``probe``        a probe's sampling params and per-prompt plans; replaying committed U values
``advantages``   the ``agpo`` advantage estimator (dispersion-normalized)
``loss``         the ``agpo`` policy loss (clipped surrogate with a per-group clip range)
``generation``   the generation worker's hooks: probe each shard, sample at the planned temperatures
``trainer``      the trainer's hooks: the clip-range controller around each update
``algorithm``    the registered :class:`~mugrpo.algorithms.base.Algorithm`
===============  =====================================================================================
"""

from mugrpo.algorithms.agpo import advantages, loss  # noqa: F401  (register the agpo estimator and loss)
from mugrpo.algorithms.agpo.algorithm import AGPO
from mugrpo.algorithms.agpo.config import AGPOConfig
from mugrpo.algorithms.agpo.controllers import ClipRangeController, TemperatureController, adaptive_eps
from mugrpo.algorithms.agpo.stats import DISPERSIONS, ProbeStats, dispersion, probe_stats, skewness, vote_entropy

__all__ = [
    "AGPO",
    "DISPERSIONS",
    "AGPOConfig",
    "ClipRangeController",
    "ProbeStats",
    "TemperatureController",
    "adaptive_eps",
    "dispersion",
    "probe_stats",
    "skewness",
    "vote_entropy",
]
