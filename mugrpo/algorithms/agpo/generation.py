"""AGPO inside the generation worker (arXiv 2605.20722; released code wandugu/paper_agpo): each prompt of a shard
is probed at ``tau_base`` before the shard is sampled, and its training group is sampled at the temperature the
(run-wide) :class:`~mugrpo.algorithms.agpo.controllers.TemperatureController` gives its probe's uncertainty U.

The controller's EMA is a function of the committed data (:mod:`mugrpo.algorithms.agpo.probe`): a stage starts
from the previous stage's generate manifest (``metrics["agpo_u_ema"]``) and replays the U of the shards it already
committed (column ``agpo_u``), so a killed and resumed worker continues with the same EMA, bitwise. Probes step
the controller prompt by prompt in shard order, so AGPO's probes need one generation worker.
"""

from __future__ import annotations

from mugrpo.algorithms.agpo.config import AGPOConfig
from mugrpo.algorithms.agpo.controllers import TemperatureController
from mugrpo.algorithms.agpo.probe import EMA_METRIC, ShardProbe, plan_prompts, probe_params, replay_uncertainties
from mugrpo.algorithms.sampling import GenerationHooks, GenerationStart, ShardPlan, ShardToSample
from mugrpo.commits.manifest import read_job_manifest
from mugrpo.commits.tables import read_table
from mugrpo.common.seeds import derive_seed
from mugrpo.rewards import RewardInput


class AGPOGenerationHooks(GenerationHooks):
    """AGPO's probes and temperature controller for one stage of a generation worker.

    Args:
        config: the run's ``agpo`` section (with ``probe``).
    """

    def __init__(self, config: AGPOConfig) -> None:
        self.config = config
        self.controller: TemperatureController = config.temperature_controller()

    def start(self, ctx: GenerationStart) -> None:
        """The controller as of the first shard still to sample: the previous stage's state at its commit, then
        the U of every prompt of this stage's committed shards, in order.

        Raises:
            ValueError: committed shards are not a prefix of the stage's shards, or one lacks AGPO columns.
        """
        controller = self.config.temperature_controller()
        previous = read_job_manifest(ctx.store, ctx.layout.run_id, ctx.stage - 1, "generate") if ctx.stage else None
        if previous is not None and EMA_METRIC in previous.metrics:
            controller.load_state_dict({"ema": previous.metrics[EMA_METRIC]})
        committed = [s for s in range(ctx.num_shards) if s not in ctx.todo]
        if ctx.todo and committed and max(committed) > min(ctx.todo):
            raise ValueError(
                f"stage {ctx.stage}: shard {min(ctx.todo)} is missing but later shards are written; AGPO's "
                "temperature controller runs prompt by prompt in shard order: delete the stage's rollouts to "
                "regenerate them"
            )
        for s in committed:
            rel = ctx.layout.rollout_shard(ctx.stage, s)
            rows = read_table(ctx.store, rel, "rollouts").select(["prompt_id", "sample_idx", "is_probe", "agpo_u"])
            try:
                replay_uncertainties(controller, rows.to_pylist())
            except ValueError as e:
                raise ValueError(f"{rel}: {e}") from e
        self.controller = controller

    def plan_shard(self, shard: ShardToSample) -> ShardPlan:
        """AGPO's probe of one shard: G responses per prompt at tau_base (own seed), scored; each prompt's
        statistics step the controller in prompt order and give its training temperature.

        Raises:
            Whatever ``shard.sample`` raises when the engine fails.
        """
        seed = derive_seed(shard.seed, shard.stage, shard.shard, "agpo-probe")
        params = probe_params(shard.sampling, self.config, seed)
        samples = shard.sample(params)
        by_prompt = zip(shard.problems, samples, strict=True)
        flat = [RewardInput.for_problem(problem, s.text) for problem, group in by_prompt for s in group]
        scored = shard.score(flat)
        results, start = [], 0
        for group in samples:
            results.append(scored[start : start + len(group)])
            start += len(group)
        plans = plan_prompts(
            self.controller,
            self.config,
            [[r.reward for r in group] for group in results],
            [[s.text for s in group] for group in samples],
            shard.dispersion,
        )
        return ShardProbe(samples=samples, results=results, plans=plans).plan(params)

    def worker_metrics(self) -> dict[str, float]:
        """The controller's EMA once the worker's shards are committed (the next stage starts from it)."""
        return {EMA_METRIC: self.controller.ema}
