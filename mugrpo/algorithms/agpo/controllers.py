"""AGPO's two controllers (arXiv 2605.20722; released code wandugu/paper_agpo), as plain objects whose whole
state is a few floats, saved with ``state_dict()`` and restored with ``load_state_dict()``.

* :class:`TemperatureController`: one uncertainty EMA shared by all prompts, updated prompt by prompt; maps a
  probe's U to the sampling temperature of that prompt's training responses.
* :class:`ClipRangeController`: H_ref (EMA of the policy's token entropy) and KLbar (EMA of the per-step KL
  to the behavior policy); with a group's probe statistics gives that group's clip range eps
  (:func:`adaptive_eps`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Below this the temperature EMA counts as unset (released code: ``if ema <= 1e-8``).
EMA_UNSET = 1e-8


def _clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def _finite(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


@dataclass
class TemperatureController:
    """tau = clip(tau_base (1 + lambda c), tau_min, tau_max) with c = (U - EMA)/(EMA + 1e-8).

    Per prompt (arXiv 2605.20722; released code): if EMA <= 1e-8 then c = 0 and EMA = U (the first call, and
    any call while the EMA is still ~0), else c = (U - EMA)/(EMA + 1e-8) and then EMA <- rate U + (1 - rate) EMA.

    Attributes:
        tau_base, tau_min, tau_max: base temperature and its bounds (code: 1.0, 0.5, 1.5).
        lam: lambda, the gain from c to the relative temperature change (code: 0.15).
        rate: EMA rate of U (code: 0.1).
        ema: the state: EMA of U over the prompts seen so far (0 = unset).
    """

    tau_base: float = 1.0
    tau_min: float = 0.5
    tau_max: float = 1.5
    lam: float = 0.15
    rate: float = 0.1
    ema: float = 0.0

    def step(self, uncertainty: float) -> tuple[float, float]:
        """Temperature of the prompt whose probe has uncertainty U; updates the EMA.

        Returns:
            ``(tau, c)``.

        Raises:
            ValueError: U is not finite.
        """
        u = _finite("uncertainty U", uncertainty)
        if self.ema <= EMA_UNSET:
            c = 0.0
            self.ema = u
        else:
            c = (u - self.ema) / (self.ema + 1e-8)
            self.ema = self.rate * u + (1.0 - self.rate) * self.ema
        return _clip(self.tau_base * (1.0 + self.lam * c), self.tau_min, self.tau_max), c

    def state_dict(self) -> dict[str, Any]:
        """The controller state (JSON-serializable)."""
        return {"ema": self.ema}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output. Raises KeyError naming a missing field."""
        self.ema = float(state["ema"])


def adaptive_eps(
    *,
    eps_base: float,
    eps_min: float,
    eps_max: float,
    entropy_ratio: float,
    vote_entropy: float,
    sigma: float,
    kl_bar: float,
    skew: float,
    a_var: float,
    gamma: float,
    delta: float,
    zeta: float,
) -> float:
    """AGPO's clip range of one group (arXiv 2605.20722):

    eps = clip(eps_base * clip(H/H_ref, 0.5, 1.5) * (1 + delta E) / (1 + a_var sigma + gamma KLbar + zeta |k3|),
               eps_min, eps_max)

    ``entropy_ratio`` is H/H_ref before its [0.5, 1.5] clip; E, sigma and k3 are the group's probe statistics.
    """
    ratio = _clip(entropy_ratio, 0.5, 1.5)
    num = eps_base * ratio * (1.0 + delta * vote_entropy)
    den = 1.0 + a_var * sigma + gamma * kl_bar + zeta * abs(skew)
    return _clip(num / den, eps_min, eps_max)


@dataclass
class ClipRangeController:
    """State of AGPO's clip range: H_ref and KLbar (arXiv 2605.20722; released code).

    * H_ref: None until the first :meth:`entropy_ratio` call, which sets it to that H; after the clip ranges of
      a step are computed, :meth:`update_entropy` does H_ref <- h_rate H + (1 - h_rate) H_ref (code: 0.01).
    * KLbar: starts at 0; once per step after the update, :meth:`update_kl` does KLbar <- kl_rate KL_step +
      (1 - kl_rate) KLbar (code: 0.1), KL_step = mean over responses of max(0, token-mean(logp_old - logp_new)).
    """

    eps_base: float = 0.2
    eps_min: float = 0.05
    eps_max: float = 0.4
    a_var: float = 1.0
    gamma: float = 0.5
    delta: float = 0.1
    zeta: float = 0.0
    h_rate: float = 0.01
    kl_rate: float = 0.1
    h_ref: float | None = None
    kl_bar: float = 0.0

    def entropy_ratio(self, entropy: float) -> float:
        """max(H, 1e-8) / (max(H_ref, 1e-8) + 1e-8) (released code), setting H_ref = H on the first call."""
        h = _finite("entropy H", entropy)
        if self.h_ref is None:
            self.h_ref = h
        return max(h, 1e-8) / (max(self.h_ref, 1e-8) + 1e-8)

    def eps(self, entropy_ratio: float, sigma: float, vote_entropy: float, skew: float) -> float:
        """Clip range of one group from the step's entropy ratio and the group's probe statistics."""
        return adaptive_eps(
            eps_base=self.eps_base,
            eps_min=self.eps_min,
            eps_max=self.eps_max,
            entropy_ratio=entropy_ratio,
            vote_entropy=vote_entropy,
            sigma=sigma,
            kl_bar=self.kl_bar,
            skew=skew,
            a_var=self.a_var,
            gamma=self.gamma,
            delta=self.delta,
            zeta=self.zeta,
        )

    def update_entropy(self, entropy: float) -> None:
        """H_ref <- h_rate H + (1 - h_rate) H_ref (H_ref = H when unset)."""
        h = _finite("entropy H", entropy)
        self.h_ref = h if self.h_ref is None else self.h_rate * h + (1.0 - self.h_rate) * self.h_ref

    def update_kl(self, kl_step: float) -> None:
        """KLbar <- kl_rate KL_step + (1 - kl_rate) KLbar."""
        self.kl_bar = self.kl_rate * _finite("KL_step", kl_step) + (1.0 - self.kl_rate) * self.kl_bar

    def state_dict(self) -> dict[str, Any]:
        """The controller state (JSON-serializable)."""
        return {"h_ref": self.h_ref, "kl_bar": self.kl_bar}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output. Raises KeyError naming a missing field."""
        self.h_ref = None if state["h_ref"] is None else float(state["h_ref"])
        self.kl_bar = float(state["kl_bar"])


def kl_step(old_minus_new_token_means: list[float] | Any) -> float:
    """KL_step = mean over responses of max(0, mean_t(logp_old - logp_new)) (released code).

    Args:
        old_minus_new_token_means: [N] per-response token means of logp_old - logp_new.
    """
    values = [max(0.0, float(v)) for v in old_minus_new_token_means]
    if not values:
        raise ValueError("KL_step needs at least one response")
    return sum(values) / len(values)
