"""AGPO's advantage estimator ``agpo`` (arXiv 2605.20722), registered in
:data:`mugrpo.scoring.advantages.ADVANTAGE_ESTIMATORS`.

A_i = (r_i - mean(r_group)) / max(disp(r_group), 1e-8) with disp the ``advantage.dispersion`` measure: sample std,
MAD x 1.4826 or IQR / 1.349; a robust measure that is ~0 while rewards differ falls back to the std, as in the
released code (:func:`mugrpo.algorithms.agpo.stats.robust_dispersion`).
"""

from __future__ import annotations

import numpy as np

from mugrpo.algorithms.agpo.stats import robust_dispersion
from mugrpo.scoring.advantages import ADVANTAGE_ESTIMATORS, AdvantageConfig, ArrayLike, group_stats

#: AGPO's floor on the advantage denominator (released code).
AGPO_MIN_DISPERSION = 1e-8


@ADVANTAGE_ESTIMATORS.register("agpo")
def agpo_advantages(rewards: ArrayLike, group_ids: ArrayLike, config: AdvantageConfig) -> tuple[np.ndarray, np.ndarray]:
    """AGPO's dispersion-normalized advantage A_i = (r_i - mean) / max(disp, 1e-8) (arXiv 2605.20722), disp
    being ``config.dispersion`` of the response's (training) group.

    Zero-variance groups get A = 0. Shapes: rewards [N], group_ids [N] -> advantages [N] float32,
    zero_variance [N] bool.
    """
    stats = group_stats(rewards, group_ids, ddof=1)
    disp = np.empty(int(stats.group.max()) + 1)
    for g in range(disp.size):
        disp[g] = robust_dispersion(stats.rewards[stats.group == g], config.dispersion)
    adv = (stats.rewards - stats.mean) / np.maximum(disp[stats.group], AGPO_MIN_DISPERSION)
    adv[stats.zero_variance] = 0.0
    return adv.astype(np.float32), stats.zero_variance
