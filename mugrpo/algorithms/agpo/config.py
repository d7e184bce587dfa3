"""The ``agpo`` config section (AGPO, arXiv 2605.20722). Defaults are the released code's (wandugu/paper_agpo,
docs/papers.md): where paper and code may differ we follow the code (docs/algorithms/agpo.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mugrpo.algorithms.agpo.controllers import ClipRangeController, TemperatureController


class AGPOConfig(BaseModel):
    """AGPO: probe each prompt at tau_base, sample its training group at an adaptive temperature, and clip each
    group's ratio at an adaptive eps. The dispersion measure is ``advantage.dispersion`` (one knob for the probe
    sigma and the advantage)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    probe: bool = Field(
        True, description="Sample a probe group of G responses at tau_base per prompt (AGPO, arXiv 2605.20722)."
    )
    tau_base: float = Field(1.0, gt=0, description="Probe temperature and base of the adaptive one (code: 1.0).")
    tau_min: float = Field(0.5, gt=0, description="Lower bound of the adaptive temperature (code: 0.5).")
    tau_max: float = Field(1.5, gt=0, description="Upper bound of the adaptive temperature (code: 1.5).")
    tau_lambda: float = Field(0.15, ge=0, description="lambda: tau = tau_base (1 + lambda c) (code: 0.15).")
    u_ema_rate: float = Field(0.1, gt=0, le=1, description="EMA rate of the uncertainty U (code: 0.1).")
    w_r: float = Field(1.0, ge=0, description="Weight of the reward dispersion sigma in U (code: 1).")
    w_e: float = Field(1.0, ge=0, description="Weight of the vote entropy E in U (code: 1).")
    w_k: float = Field(0.0, ge=0, description="Weight of |skew k3| in U (code: 0).")
    eps_base: float = Field(0.2, gt=0, description="Base clip range eps_base (code: 0.2).")
    eps_min: float = Field(0.05, gt=0, description="Lower bound of the per-group clip range (code: 0.05).")
    eps_max: float = Field(0.4, gt=0, lt=1, description="Upper bound of the per-group clip range (code: 0.4).")
    a_var: float = Field(1.0, ge=0, description="a_var: weight of the probe sigma in eps's denominator (code: 1).")
    gamma: float = Field(0.5, ge=0, description="gamma: weight of KLbar in eps's denominator (code: 0.5).")
    delta: float = Field(0.1, ge=0, description="delta: eps grows by (1 + delta E) with vote entropy (code: 0.1).")
    zeta: float = Field(0.0, ge=0, description="zeta: weight of |k3| in eps's denominator (code: 0).")
    h_ref_rate: float = Field(0.01, gt=0, le=1, description="EMA rate of H_ref (code: 0.01).")
    kl_bar_rate: float = Field(0.1, gt=0, le=1, description="EMA rate of KLbar (code: 0.1).")

    @model_validator(mode="after")
    def _bounds(self) -> AGPOConfig:
        if not self.tau_min <= self.tau_base <= self.tau_max:
            raise ValueError(
                f"agpo needs tau_min <= tau_base <= tau_max, got {self.tau_min}, {self.tau_base}, {self.tau_max}"
            )
        if not self.eps_min <= self.eps_base <= self.eps_max:
            raise ValueError(
                f"agpo needs eps_min <= eps_base <= eps_max, got {self.eps_min}, {self.eps_base}, {self.eps_max}"
            )
        return self

    def temperature_controller(self) -> TemperatureController:
        """A fresh :class:`TemperatureController` with these settings."""
        return TemperatureController(
            tau_base=self.tau_base,
            tau_min=self.tau_min,
            tau_max=self.tau_max,
            lam=self.tau_lambda,
            rate=self.u_ema_rate,
        )

    def clip_controller(self) -> ClipRangeController:
        """A fresh :class:`ClipRangeController` with these settings."""
        return ClipRangeController(
            eps_base=self.eps_base,
            eps_min=self.eps_min,
            eps_max=self.eps_max,
            a_var=self.a_var,
            gamma=self.gamma,
            delta=self.delta,
            zeta=self.zeta,
            h_rate=self.h_ref_rate,
            kl_rate=self.kl_bar_rate,
        )
