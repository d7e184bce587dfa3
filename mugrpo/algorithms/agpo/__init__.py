"""AGPO (arXiv 2605.20722): probe statistics, the temperature and clip-range controllers, and their config.

Pure parts only (numpy / floats, no model): :mod:`.stats` computes a probe's dispersion, vote entropy and skew;
:mod:`.controllers` holds the persistent controller state (temperature EMA, H_ref, KLbar) with
``state_dict()`` / ``load_state_dict()``; :mod:`.config` is the ``agpo`` config section.
"""

from mugrpo.adaptive.config import AGPOConfig
from mugrpo.adaptive.controllers import ClipRangeController, TemperatureController, adaptive_eps
from mugrpo.adaptive.stats import DISPERSIONS, ProbeStats, dispersion, probe_stats, skewness, vote_entropy

__all__ = [
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
