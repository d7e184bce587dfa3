"""One shard of a stage: its sampling params, its samples, and its rollout rows (rewards, group advantages).

A shard's plan (:class:`mugrpo.algorithms.ShardPlan`, from the algorithms' ``plan_shard`` hooks) may set each
prompt's temperature, set declared columns on each prompt's rows and add extra groups (sampled and scored to plan
the shard), written after the training rows with their own columns. Once the shard's groups are scored, the
algorithms' ``scored`` hooks may set more declared columns on each prompt's training rows (dynamic sampling's
filter). Every declared column (:func:`mugrpo.algorithms.declared_columns`) no hook sets holds its default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from mugrpo.algorithms import GenerationHooks, ScoredShard, ShardPlan, declared_columns
from mugrpo.common.seeds import derive_seed
from mugrpo.engines.base import Sample, SamplingParams
from mugrpo.generation.prompts import PreparedPrompt
from mugrpo.generation.spec import GenerateSpec, GenerationError
from mugrpo.rewards import RewardInput, RewardScorer
from mugrpo.scoring.advantages import compute_advantages


def shard_params(
    spec: GenerateSpec, shard: int, prompts: list[PreparedPrompt], plan: ShardPlan | None = None
) -> SamplingParams:
    """Sampling params of one shard: the shard's own seed, and per-prompt temperatures when the shard's plan sets
    them (else when the spec has them)."""
    params = spec.sampling.model_copy(update={"seed": derive_seed(spec.seed, spec.stage, shard)})
    if plan is not None and plan.temperatures is not None:
        params = params.model_copy(update={"temperatures": plan.temperatures})
    elif spec.temperatures:
        temps = [spec.temperatures.get(p.problem.prompt_id, params.temperature) for p in prompts]
        params = params.model_copy(update={"temperatures": tuple(temps)})
    return params


def generate_groups(
    spec: GenerateSpec, shard: int, prompts: list[PreparedPrompt], engine, params: SamplingParams
) -> list[list[Sample]]:
    """The engine's samples of ``prompts`` with ``params`` (outer: prompt; inner: sample).

    Raises:
        GenerationError: the engine failed (exception or out of memory); nothing is returned for the shard.
    """
    if not prompts:
        return []
    try:
        return engine.generate([p.token_ids for p in prompts], params)
    except (RuntimeError, MemoryError, ValueError) as e:
        first, last = prompts[0].problem.prompt_id, prompts[-1].problem.prompt_id
        raise GenerationError(
            f"shard {shard} (prompts {first}..{last}) failed in the {spec.engine} engine: {type(e).__name__}: {e}. "
            "Nothing was committed for this shard; re-run the job to retry it."
        ) from e


def sample_shard(
    spec: GenerateSpec, shard: int, prompts: list[PreparedPrompt], engine, plan: ShardPlan | None = None
) -> list[list[Sample]]:
    """The G samples of every prompt of one shard (outer: prompt; inner: sample), at the plan's temperatures.

    Raises:
        GenerationError: the engine failed (exception or out of memory); nothing is returned for the shard.
    """
    return generate_groups(spec, shard, prompts, engine, shard_params(spec, shard, prompts, plan))


def shard_rows(
    spec: GenerateSpec,
    shard: int,
    prompts: list[PreparedPrompt],
    groups: list[list[Sample]],
    scorer: RewardScorer,
    plan: ShardPlan | None = None,
    hooks: Sequence[GenerationHooks] = (),
) -> tuple[list[dict], int]:
    """Score and group-normalize one shard's samples into rollout rows (with the columns of the plan and of the
    ``hooks``' :meth:`~mugrpo.algorithms.GenerationHooks.scored`), followed by the plan's extra rows (their
    advantage is that of their own group). Returns (rows, generated tokens, extra groups' included)."""
    if not prompts:
        return [], 0
    params = shard_params(spec, shard, prompts, plan)
    flat = [(p, i, s) for p, samples in zip(prompts, groups, strict=True) for i, s in enumerate(samples)]
    results = scorer.score([RewardInput.for_problem(p.problem, s.text) for p, _, s in flat])
    columns: dict[str, dict[str, Any]] = {p.problem.prompt_id: {} for p in prompts}
    if plan is not None and plan.columns:
        for p, c in zip(prompts, plan.columns, strict=True):
            columns[p.problem.prompt_id].update(c)
    rows = rollout_rows(spec, params, flat, results, columns)
    if hooks:
        _add_scored_columns(spec, shard, prompts, rows, hooks)
    tokens = sum(len(s.response_token_ids) for _, _, s in flat)
    if plan is not None and plan.extra_samples:
        extra_flat = [
            (p, i, s) for p, samples in zip(prompts, plan.extra_samples, strict=True) for i, s in enumerate(samples)
        ]
        extra_results = [r for group in plan.extra_results for r in group]
        own = plan.extra_columns or [{}] * len(prompts)
        extra_columns = {
            p.problem.prompt_id: {**columns[p.problem.prompt_id], **c} for p, c in zip(prompts, own, strict=True)
        }
        rows += rollout_rows(spec, plan.extra_params, extra_flat, extra_results, extra_columns)
        tokens += sum(len(s.response_token_ids) for _, _, s in extra_flat)
    return rows, tokens


def _add_scored_columns(
    spec: GenerateSpec, shard: int, prompts: list[PreparedPrompt], rows: list[dict], hooks: Sequence[GenerationHooks]
) -> None:
    """Set the columns each hook's ``scored`` gives a prompt on the prompt's training ``rows`` (in place)."""
    ids = [p.problem.prompt_id for p in prompts]
    by_prompt: dict[str, list[dict]] = {i: [] for i in ids}
    for row in rows:
        by_prompt[row["prompt_id"]].append(row)
    view = ScoredShard(
        stage=spec.stage,
        shard=shard,
        prompt_ids=ids,
        rewards=[[r["reward"] for r in by_prompt[i]] for i in ids],
        zero_variance=[all(r["zero_variance"] for r in by_prompt[i]) for i in ids],
    )
    for h in hooks:
        given = h.scored(view)
        if given is None:
            continue
        for i, c in zip(ids, given, strict=True):
            for row in by_prompt[i]:
                row.update(c)


def rollout_rows(
    spec: GenerateSpec,
    params: SamplingParams,
    flat: list,
    results: list,
    columns: Mapping[str, Mapping[str, Any]],
) -> list[dict]:
    """Rollout rows of ``flat`` = [(prompt, sample index, sample)] with their reward results and group advantages;
    ``columns``: per prompt id, declared columns of its rows (from the shard's plan); every other declared column
    holds its default."""
    rewards = np.array([r.reward for r in results], dtype=np.float32)
    group_ids = np.array([p.problem.prompt_id for p, _, _ in flat])
    advantages, zero_var = compute_advantages(rewards, group_ids, spec.advantage, expected_group_size=params.n)
    now = datetime.now(UTC)
    defaults = {c.name: c.default for c in declared_columns()}
    rows = []
    for (p, i, s), r, adv, zv in zip(flat, results, advantages, zero_var, strict=True):
        row = {
            **defaults,
            "run_id": spec.run_id,
            "stage": spec.stage,
            "policy_version": spec.policy_version,
            "prompt_id": p.problem.prompt_id,
            "sample_idx": i,
            "group_size": params.n,
            "prompt_text": p.text,
            "prompt_token_ids": p.token_ids,
            "response_text": s.text,
            "response_token_ids": s.response_token_ids,
            "behavior_logprobs": s.behavior_logprobs,
            "finish_reason": s.finish_reason,
            "num_tokens": len(s.response_token_ids),
            "reward": r.reward,
            "reward_components": r.components,
            "reward_status": r.status,
            "ground_truth": p.problem.ground_truth,
            "task": p.problem.task,
            "task_metadata": p.problem.task_metadata,
            "extracted_answer": r.extracted_answer,
            "advantage": float(adv),
            "zero_variance": bool(zv),
            "temperature": s.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "min_p": params.min_p,
            "seed": params.seed,
            "engine": spec.engine,
            "created_at": now,
        }
        row.update(columns.get(p.problem.prompt_id, {}))
        rows.append(row)
    return rows
