"""Evaluation: avg@k and pass@k of one policy on each configured benchmark (``python -m mugrpo.jobs.eval`` is its
job entry point).

Writes one Parquet file per benchmark, ``evals/stage={k}/{benchmark}.parquet`` (one row per sample), skipping
benchmarks already written (resume), then its worker manifest, then (once every worker has committed, with
``eval.workers`` > 1 splitting the benchmarks; :mod:`mugrpo.coordination.fanout`) the job manifest with avg@k / pass@k
per benchmark. ``stage`` names the
policy evaluated: policies/stage={k} (stage K is the final policy).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from pydantic import Field, field_validator, model_validator

from mugrpo.commits.manifest import read_job_manifest, write_job_manifest
from mugrpo.commits.policies import local_policy_dir
from mugrpo.commits.tables import read_table, table_from_rows, write_table
from mugrpo.common.dtypes import refuse_auto
from mugrpo.common.progress import TokenProgress, console, stall_cause
from mugrpo.common.seeds import derive_seed
from mugrpo.config import BenchmarkConfig
from mugrpo.config.precision import concrete
from mugrpo.config.threads import engine_options, fanout_workers
from mugrpo.coordination.fanout import commit_when_all_committed, owned, slowest_timings, worker_job
from mugrpo.coordination.jobspec import JobSpec
from mugrpo.coordination.start_gate import StartGate
from mugrpo.data.datasets import load_problems
from mugrpo.data.prompts import PromptConfig, encode_prompt, render_prompt
from mugrpo.engines.base import GenerationRequest, SamplingParams, attach_token_meter, generate_requests
from mugrpo.evaluation.metrics import avg_at_k, clustered_mean_ci, maj_at_k, mean_pass_at_k
from mugrpo.policy.adapters import merged_policy_dir
from mugrpo.rewards import RewardConfig, RewardInput
from mugrpo.scoring.verifiers import VerifierPoolOwner
from mugrpo.storage.store import Store, sha256_bytes
from schemas import FileRecord, JobManifest


class EvalSpec(JobSpec):
    """Which policy to evaluate on which benchmarks, and how."""

    policy_dir: str = Field(description="Store path of the policy (HF dir), usually policies/stage={k}.")
    benchmarks: list[BenchmarkConfig]
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    engine: str = "transformers"
    engine_kwargs: dict = Field(default_factory=dict)
    dtype: str = Field("float32", description="The engine's weight dtype: concrete, never auto (model.dtype resolved).")
    verify_timeout_s: float = 5.0
    reward_workers: int = 2
    workers: int = Field(1, ge=1, description="Evaluation workers (eval.workers); they split the benchmarks.")
    worker: int = Field(0, ge=0, description="This worker's index w: it runs benchmarks w, w + workers, ...")

    @field_validator("dtype")
    @classmethod
    def _concrete_dtype(cls, dtype: str) -> str:
        return refuse_auto("dtype", dtype)

    @model_validator(mode="after")
    def _worker_in_range(self) -> EvalSpec:
        if self.worker >= self.workers:
            raise ValueError(f"worker {self.worker} of {self.workers}: the worker index must be < workers")
        return self

    @classmethod
    def from_config(cls, cfg, stage: int) -> EvalSpec:
        """The eval spec of policy ``stage`` for run config ``cfg`` (``auto`` precision resolved as in
        :func:`mugrpo.config.precision.concrete`)."""
        cfg = concrete(cfg)
        return cls(
            **cls.run_fields(cfg, stage),
            policy_dir=cfg.layout.policy_dir(stage),
            benchmarks=cfg.eval.benchmarks,
            prompt=cfg.data.prompt,
            engine=cfg.generation.engine,
            engine_kwargs=engine_options(cfg, "eval"),
            dtype=cfg.model.dtype,
            verify_timeout_s=cfg.reward.verify_timeout_s,
            reward_workers=cfg.reward.num_workers,
            workers=fanout_workers(cfg, "eval"),  # a warm segment evaluates in its own process: one worker
        )


def _bench_params(spec: EvalSpec, bench: BenchmarkConfig) -> SamplingParams:
    return SamplingParams(
        temperature=bench.temperature,
        top_p=bench.top_p,
        max_new_tokens=bench.max_new_tokens,
        n=bench.k,
        seed=derive_seed(spec.seed, "eval", spec.stage, bench.dataset.name),
    )


def _bench_prompts(spec: EvalSpec, bench: BenchmarkConfig, problems: list, tokenizer) -> tuple[list, list[str]]:
    """The benchmark's problems (the first ``num_prompts``) and their rendered prompts."""
    problems = problems[: bench.num_prompts] if bench.num_prompts else problems
    return problems, [render_prompt(tokenizer, p.question, spec.prompt) for p in problems]


def _bench_rows(
    spec: EvalSpec, bench: BenchmarkConfig, problems: list, texts: list[str], groups: list, scorer
) -> list[dict]:
    """The eval rows of one benchmark from its sampled ``groups`` (one per problem), scored by ``scorer``."""
    flat = [(p, t, i, s) for p, t, samples in zip(problems, texts, groups, strict=True) for i, s in enumerate(samples)]
    results = scorer.score([RewardInput.for_problem(p, s.text) for p, _, _, s in flat])
    correctness = bench.dataset.correctness_component
    now = datetime.now(UTC)
    return [
        {
            "run_id": spec.run_id,
            "stage": spec.stage,
            "benchmark": bench.dataset.name,
            "prompt_id": p.prompt_id,
            "sample_idx": i,
            "k": bench.k,
            "prompt_text": t,
            "response_text": s.text,
            "num_tokens": len(s.response_token_ids),
            "finish_reason": s.finish_reason,
            "ground_truth": p.ground_truth,
            "extracted_answer": r.extracted_answer,
            "correct": r.status == "ok" and r.components.get(correctness, 0.0) >= 1.0,
            "task": p.task,
            "task_metadata": p.task_metadata,
            "reward_status": r.status,
            "temperature": bench.temperature,
            "top_p": bench.top_p,
            "created_at": now,
        }
        for (p, t, i, s), r in zip(flat, results, strict=True)
    ]


def bench_metrics(rows: list[dict], k: int) -> dict[str, float]:
    """The eval contract of one benchmark's rows (grouped by prompt_id, in sample order): avg@k with its 95% CI
    clustered by problem (``avg@k_ci95_low`` / ``_high``), the unbiased pass@k, and maj@k
    (:mod:`mugrpo.evaluation.metrics`)."""
    by_prompt: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["prompt_id"], r["sample_idx"])):
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    groups = [[bool(r["correct"]) for r in g] for g in by_prompt.values()]
    answers = [[r["extracted_answer"] for r in g] for g in by_prompt.values()]
    ci = clustered_mean_ci([sum(g) / len(g) for g in groups])
    return {
        f"avg@{k}": avg_at_k(groups),
        f"avg@{k}_ci95_low": max(ci.low, 0.0),
        f"avg@{k}_ci95_high": min(ci.high, 1.0),
        f"pass@{k}": mean_pass_at_k(groups, k),
        f"maj@{k}": maj_at_k(answers, groups),
    }


class EvalWorker(VerifierPoolOwner):
    """The evaluation side of a run: a rollout engine and a verifier pool that live across evaluations.

    A cold eval job builds one, evaluates its worker's benchmarks of one policy and exits (:func:`run_eval`); a
    warm segment passes an ``engine`` bound to the trainer's live policy (the behavior policy of the stage, before
    its updates). The verifier pool is started and waited ready on first use
    (:class:`~mugrpo.scoring.verifiers.VerifierPoolOwner`).

    Args:
        engine: a ready rollout engine (owned by the caller), or None to start one per policy from its dir.
    """

    def __init__(self, engine=None) -> None:
        super().__init__()
        self._engine = engine
        self._datasets: dict[str, list] = {}  # benchmark problems loaded by this worker, by dataset config (JSON)

    def prepare(self, spec: EvalSpec) -> None:
        """What a pre-started eval job does before its policy is committed (:mod:`mugrpo.coordination.start_gate`):
        start the verifier pool and wait it ready, import the engine, load its benchmarks' problems. Reads nothing of
        the run.

        Raises:
            RuntimeError: the verifier pool did not start.
            mugrpo.data.datasets.DatasetError: a benchmark cannot be read.
        """
        from mugrpo.engines import load_builtin_engines

        self.start_verifier_pool(self.reward_config(spec))  # its workers start while this process imports
        load_builtin_engines()  # the engine's imports (torch, transformers' model code)
        for i in owned(len(spec.benchmarks), spec.worker, spec.workers):
            self._problems(spec.benchmarks[i])
        self.verifier_pool(self.reward_config(spec))

    def _problems(self, bench: BenchmarkConfig) -> list:
        """The problems of ``bench``'s dataset, loaded once per dataset config in this worker's life."""
        key = bench.dataset.model_dump_json()
        if key not in self._datasets:
            self._datasets[key] = load_problems(bench.dataset)[0]
        return self._datasets[key]

    @staticmethod
    def reward_config(spec: EvalSpec) -> RewardConfig:
        """The correctness-only reward of an evaluation."""
        return RewardConfig(
            components={name: 1.0 for name in sorted({b.dataset.correctness_component for b in spec.benchmarks})},
            verify_timeout_s=spec.verify_timeout_s,
            num_workers=spec.reward_workers,
        )

    def run_stage(self, spec: EvalSpec, *, origin: float | None = None) -> JobManifest:
        """Evaluate (or finish evaluating) worker ``spec.worker``'s benchmarks of policy ``spec.stage``, write its
        worker manifest, then the eval manifest if every worker has committed (:func:`commit_eval`).

        Args:
            origin: ``time.monotonic()`` value the switch time counts from (process start for a cold job).

        Returns:
            The eval manifest, or this worker's manifest while other workers have not committed.
        """
        from transformers import AutoTokenizer

        from mugrpo.engines import make_engine

        origin = time.monotonic() if origin is None else origin
        store = spec.store()
        layout = spec.layout
        done = read_job_manifest(store, spec.run_id, spec.stage, "eval")
        if done is not None:
            console.print(f"eval policy {spec.stage}: already committed")
            return done
        name = worker_job("eval", spec.worker, spec.workers)
        mine = read_job_manifest(store, spec.run_id, spec.stage, name)
        if mine is not None:
            return commit_eval(spec) or mine
        benches = [spec.benchmarks[i] for i in owned(len(spec.benchmarks), spec.worker, spec.workers)]
        todo = [b for b in benches if not store.exists(layout.eval_file(spec.stage, b.dataset.name))]
        t_switch = t_eval = 0.0
        if todo:
            policy = merged_policy_dir(store, local_policy_dir(store, spec.policy_dir))  # LoRA: merged once
            tokenizer = AutoTokenizer.from_pretrained(policy)
            own_engine = self._engine is None
            engine = (
                make_engine(spec.engine, policy, dtype=spec.dtype, seed=spec.seed, **spec.engine_kwargs)
                if own_engine
                else self._engine
            )
            try:
                scorer = self.verifier_pool(self.reward_config(spec))
                t_switch = time.monotonic() - origin
                t0 = time.monotonic()
                prompts = [_bench_prompts(spec, b, self._problems(b), tokenizer) for b in todo]
                console.print(f"eval policy {spec.stage}: {', '.join(b.dataset.name for b in todo)} ...")
                requests = [
                    GenerationRequest([encode_prompt(tokenizer, t) for t in texts], _bench_params(spec, b))
                    for b, (_, texts) in zip(todo, prompts, strict=True)
                ]
                sampled = _sample_with_progress(spec, engine, requests)  # every benchmark in one batch schedule
                for bench, (problems, texts), groups in zip(todo, prompts, sampled, strict=True):
                    rows = _bench_rows(spec, bench, problems, texts, groups, scorer)
                    write_table(
                        store,
                        layout.eval_file(spec.stage, bench.dataset.name),
                        table_from_rows(rows, "evals"),
                        "evals",
                    )
                t_eval = time.monotonic() - t0
            finally:
                if own_engine:
                    engine.close()
        files = []
        for bench in benches:
            rel = layout.eval_file(spec.stage, bench.dataset.name)
            data = store.read_bytes(rel)
            files.append(FileRecord(path=layout.rel(rel), sha256=sha256_bytes(data), bytes=len(data)))
        mine = JobManifest(
            run_id=spec.run_id,
            stage=spec.stage,
            job=name,
            created_at=datetime.now(UTC),
            files=files,
            timings={"switch": t_switch, "eval": t_eval, "total": time.monotonic() - origin},
        )
        write_job_manifest(store, mine)
        return commit_eval(spec) or mine


def _sample_with_progress(spec: EvalSpec, engine, requests: list[GenerationRequest]) -> list[list[list]]:
    """:func:`generate_requests` with a live progress line (tokens, tok/s, prompts, ETA every 10 s; the generate
    job's :class:`~mugrpo.common.progress.TokenProgress`): a policy's evaluation samples for most of a minute on a
    2-core CPU. Tokens are counted as the engine samples them where it can, else when the batch schedule ends."""
    prompts = sum(len(r.prompt_token_ids) for r in requests)
    budget = sum(len(r.prompt_token_ids) * r.params.n * r.params.max_new_tokens for r in requests)
    progress = TokenProgress(f"eval policy {spec.stage}", console, cause=lambda: stall_cause(spec.dtype))
    progress.streaming = streaming = attach_token_meter(engine, progress.add_tokens)
    progress.begin_sampling(prompts, budget)
    progress.start("sampling")
    try:
        sampled = generate_requests(engine, requests)
        tokens = None if streaming else sum(len(s.response_token_ids) for r in sampled for g in r for s in g)
        progress.shard_done(prompts, tokens)
        return sampled
    finally:
        attach_token_meter(engine, None)
        progress.close()


def commit_eval(spec: EvalSpec) -> JobManifest | None:
    """Write the eval manifest (avg@k / pass@k of every benchmark file, read through its worker manifest) once
    every worker has committed; None while one has not. Idempotent. Timings are the slowest worker's.

    Raises:
        mugrpo.storage.store.ChecksumError: a benchmark file changed after its worker committed it.
    """
    store = spec.store()
    return commit_when_all_committed(
        store, spec.run_id, spec.stage, "eval", spec.workers, lambda parts: _eval_manifest(spec, store, parts)
    )


def _eval_manifest(spec: EvalSpec, store: Store, parts: list[JobManifest]) -> JobManifest:
    """The eval manifest from the committed worker manifests (see :func:`commit_eval`)."""
    layout = spec.layout
    digests = {f.path: f.sha256 for p in parts for f in p.files}
    files, metrics, counts = [], {}, {}
    for bench in spec.benchmarks:
        name = bench.dataset.name
        rel = layout.eval_file(spec.stage, name)
        data = store.read_bytes(rel, expected_sha256=digests.get(layout.rel(rel)))
        rows = read_table(store, rel, "evals").to_pylist()
        files.append(FileRecord(path=layout.rel(rel), sha256=sha256_bytes(data), bytes=len(data), rows=len(rows)))
        for key, value in bench_metrics(rows, bench.k).items():
            metrics[f"{name}/{key}"] = value
        counts[f"{name}/samples"] = len(rows)
        shown = bench_metrics(rows, bench.k)
        k = bench.k
        console.print(
            f"eval policy {spec.stage}: {name:<10} n={len(rows) // k:<4} k={k} avg@{k}={shown[f'avg@{k}']:.3f} "
            f"[{shown[f'avg@{k}_ci95_low']:.3f}, {shown[f'avg@{k}_ci95_high']:.3f}]  "
            f"pass@{k}={shown[f'pass@{k}']:.3f}  maj@{k}={shown[f'maj@{k}']:.3f}"
        )
    return JobManifest(
        run_id=spec.run_id,
        stage=spec.stage,
        job="eval",
        created_at=datetime.now(UTC),
        files=files,
        counts=counts,
        metrics=metrics,
        timings=slowest_timings(parts, ("switch", "eval", "total")),
    )


def run_eval(spec: EvalSpec, *, origin: float | None = None, gate: StartGate | None = None) -> JobManifest:
    """The cold eval job: start an engine and a verifier pool, evaluate one policy, stop them. ``origin``: as in
    :meth:`EvalWorker.run_stage` (the job passes its process start). With a ``gate`` not yet open (a pre-started
    job): :meth:`EvalWorker.prepare`, then wait at the gate; the switch time counts from its opening.

    Raises:
        mugrpo.coordination.start_gate.StartTimeout, mugrpo.coordination.lease.LeaseFenced: from the gate.
    """
    with EvalWorker() as worker:
        if gate is not None and gate.pending:
            worker.prepare(spec)
            origin = gate.wait(console.print)
        return worker.run_stage(spec, origin=origin)
