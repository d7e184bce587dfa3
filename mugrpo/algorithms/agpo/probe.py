"""AGPO's probe step of the generation job (arXiv 2605.20722; released code wandugu/paper_agpo).

For each prompt of a shard: sample a probe group of G responses at ``tau_base``, score it, compute its
:class:`~mugrpo.algorithms.agpo.stats.ProbeStats`, and step the (run-wide) :class:`TemperatureController` prompt by
prompt to get the temperature of that prompt's G training responses.

The controller's EMA is a function of the committed data: it starts a stage from the previous stage's generate
manifest (``metrics["agpo_u_ema"]``, the state at that stage's commit) and replays the U values of the shards
this stage already committed (stored per row in ``agpo_u``, float64), so a killed and resumed job continues with
the same EMA, bitwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from mugrpo.algorithms.agpo.config import AGPOConfig
from mugrpo.algorithms.agpo.controllers import TemperatureController
from mugrpo.algorithms.agpo.stats import DispersionMode, ProbeStats, probe_stats
from mugrpo.algorithms.contracts import RolloutColumn
from mugrpo.algorithms.sampling import ShardPlan
from mugrpo.engines.base import SamplingParams

#: Key of the temperature controller's EMA in the generate job manifest's metrics (its state at stage commit).
EMA_METRIC = "agpo_u_ema"

#: The declared column of AGPO's probe rows: sampled at tau_base to plan the shard, never trained on.
IS_PROBE = "is_probe"
#: The declared columns of a probed prompt's statistics (sigma, vote entropy E, skew k3), in the controller's order.
PROBE_STATS = ("probe_sigma", "probe_vote_entropy", "probe_skew")
#: AGPO's rollout columns (columns of the rollouts schema since its version 3: ``schemas.tables``).
COLUMNS = (
    RolloutColumn(pa.field(IS_PROBE, pa.bool_()), default=False, excludes=True),
    *(RolloutColumn(pa.field(name, pa.float64())) for name in PROBE_STATS),
    RolloutColumn(pa.field("agpo_u", pa.float64())),  # U = w_r sigma + w_e E + w_k |k3|
    RolloutColumn(pa.field("agpo_c", pa.float64())),  # c = (U - EMA) / (EMA + 1e-8); the row's temperature is tau(c)
)


@dataclass(frozen=True)
class PromptPlan:
    """One prompt's probe outcome: its statistics, U, c and the training temperature tau."""

    stats: ProbeStats
    uncertainty: float
    c: float
    temperature: float

    def columns(self) -> dict[str, float]:
        """The rollout columns of the prompt's rows (training and probe): its probe statistics, U and c."""
        return {
            "probe_sigma": self.stats.sigma,
            "probe_vote_entropy": self.stats.entropy,
            "probe_skew": self.stats.skew,
            "agpo_u": self.uncertainty,
            "agpo_c": self.c,
        }


@dataclass
class ShardProbe:
    """The probe of one shard: the probe samples and rewards (per prompt) and each prompt's plan."""

    samples: list[list]
    results: list[list]
    plans: list[PromptPlan]

    @property
    def temperatures(self) -> tuple[float, ...]:
        return tuple(p.temperature for p in self.plans)

    def plan(self, params: SamplingParams) -> ShardPlan:
        """The shard's plan for the generation worker: each prompt's temperature and columns, and the probe
        groups (sampled with ``params``) to write as probe rows."""
        return ShardPlan(
            temperatures=self.temperatures,
            columns=[p.columns() for p in self.plans],
            extra_params=params,
            extra_samples=self.samples,
            extra_results=self.results,
            extra_columns=[{IS_PROBE: True}] * len(self.plans),
        )


def probe_params(base: SamplingParams, config: AGPOConfig, seed: int) -> SamplingParams:
    """The probe's sampling params: ``base`` (n = G, top-p, max tokens) at ``tau_base``, with the probe's seed."""
    return base.model_copy(update={"temperature": config.tau_base, "temperatures": None, "seed": seed})


def plan_prompts(
    controller: TemperatureController,
    config: AGPOConfig,
    rewards: list[list[float]],
    texts: list[list[str]],
    mode: DispersionMode,
) -> list[PromptPlan]:
    """Probe statistics, U, c and tau of each prompt in order, stepping ``controller`` once per prompt.

    Args:
        rewards: per prompt, its G probe rewards.
        texts: per prompt, its G probe response texts.
        mode: the dispersion measure (``advantage.dispersion``).
    """
    plans = []
    for r, t in zip(rewards, texts, strict=True):
        stats = probe_stats(r, t, mode)
        u = stats.uncertainty(config.w_r, config.w_e, config.w_k)
        tau, c = controller.step(u)
        plans.append(PromptPlan(stats=stats, uncertainty=u, c=c, temperature=tau))
    return plans


def replay_uncertainties(controller: TemperatureController, rows: list[dict]) -> int:
    """Step ``controller`` over the committed U of each prompt of a shard, in row order (one step per prompt).

    Args:
        rows: the shard's rows with ``prompt_id``, ``sample_idx``, ``is_probe`` and ``agpo_u``.

    Returns:
        Prompts replayed.

    Raises:
        ValueError: a training row without ``agpo_u`` (a shard written without AGPO).
    """
    n = 0
    for row in rows:
        if row[IS_PROBE] or row["sample_idx"] != 0:
            continue
        if row["agpo_u"] is None:
            raise ValueError(
                f"rollout prompt_id={row['prompt_id']!r} has no agpo_u: its shard was written without AGPO; delete the "
                "stage's rollouts to regenerate it"
            )
        controller.step(row["agpo_u"])
        n += 1
    return n
