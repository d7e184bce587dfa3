"""Warm execution: one process runs stages k .. k+n-1 (generate -> eval where scheduled -> train -> stage commit,
stage after stage) with the policy, the optimizer, the rollout engine and the verifier pools loaded once
(``python -m mugrpo.jobs.segment`` is its job entry point).

This is ``orchestration.execution: warm``: how TRL and verl run GRPO's many short generate -> train cycles, and so
the fair way to run standard GRPO (mu = 4) against Mu-GRPO's few large stages. It is a way to run, not a second
implementation: each stage writes the same job specs as the cold path
(:func:`mugrpo.orchestration.job_specs.build_job_specs`) and runs them through the same objects as the cold jobs
(:class:`~mugrpo.generation.GenerationWorker`, :class:`~mugrpo.evaluation.worker.EvalWorker`,
:class:`~mugrpo.trainer.loop.Trainer`), then commits the stage with :func:`mugrpo.orchestration.runs.commit_stage`. The
files, their layout and schemas are those of the cold path.

Weight sync (:class:`WarmEngine`), measured per stage as ``t_sync``:
  - transformers engine: it samples from the trainer's own module (no copy, no reload; generation runs under
    ``torch.inference_mode`` in eval mode, gradients are None between updates, so no grad state leaks in);
  - vLLM engine: the trainer's weights are loaded into the running engine in place (:meth:`VLLMEngine.update_weights`),
    and before each generation and evaluation the engine is reseeded with the cold job's seed and its prefix cache
    dropped (:meth:`WarmEngine.begin_phase`). Every stage samples the distributions of the cold run (log-probs
    bitwise equal on shared prefixes) with noise that vLLM may assign to other requests than a fresh engine does,
    the first stage's included (:mod:`mugrpo.engines.vllm_engine`, tests/e2e/test_warm_vllm.py).

What the segment does so that, on CPU with the transformers engine, warm and cold give bitwise the same rollouts
and weights: the behavior policy of a stage is evaluated before the stage's updates (the cold eval job evaluates
the same published policy after them); each phase runs with the float environment of its cold job (generation and
evaluation: subnormals kept and ``engine_kwargs.num_threads`` torch threads; training: subnormals flushed to zero
and the default thread count); the trainer restores each stage's seed, RNG and AdamW moments as a cold train job
does (:meth:`mugrpo.trainer.loop.Trainer.run_stage`).

Resume: stages whose manifest exists are skipped; inside a stage every job resumes from what it committed (shards,
checkpoints), so a SIGKILLed segment re-run continues from the last committed stage and checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import torch
from pydantic import Field, field_validator

from mugrpo.commits.policies import local_policy_dir
from mugrpo.common.dtypes import refuse_auto, torch_dtype
from mugrpo.common.progress import console
from mugrpo.config.precision import CHOICES, FOLLOWERS, concrete
from mugrpo.config.threads import THREADS_KEY, job_threads
from mugrpo.coordination.jobspec import JobSpec
from schemas import JobManifest, StageManifest, StageTimings

#: Prefix of the one-line JSON progress record a segment prints after each committed stage (the run flow turns
#: it into a Prefect progress artifact).
PROGRESS_TAG = "mugrpo-segment-progress "


class SegmentSpec(JobSpec):
    """A warm segment: stages ``stage .. stage + num_stages - 1`` of the run described by ``config``."""

    config: dict[str, Any] = Field(description="The resolved run config (as in run.json): no auto precision.")
    num_stages: int = Field(ge=1, description="Consecutive stages this job runs (cut at the run's last stage).")

    @field_validator("config")
    @classmethod
    def _concrete_precision(cls, config: dict[str, Any]) -> dict[str, Any]:
        for key in [*CHOICES, *FOLLOWERS]:
            section, name = key.split(".")
            default = "auto" if key in CHOICES else None  # left out, a CHOICES key loads as its default: auto
            refuse_auto(f"config.{key}", config.get(section, {}).get(name, default))
        return config

    @classmethod
    def from_config(cls, cfg, first: int, count: int) -> SegmentSpec:
        """The segment of ``count`` stages starting at ``first`` of run config ``cfg`` (``auto`` precision resolved
        as in :func:`mugrpo.config.precision.concrete`)."""
        cfg = concrete(cfg)
        return cls(**cls.run_fields(cfg, first), config=cfg.to_json_dict(), num_stages=count)


@contextlib.contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with ``num_threads`` torch threads (None: unchanged), then restore the previous count."""
    before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class WarmEngine:
    """A rollout engine bound to the trainer's live policy, with an explicit, timed weight sync.

    transformers: samples from ``trainer.policy`` itself when ``model.dtype`` is the trainer's (fp32): the sync is
    a no-op. Another dtype keeps one engine copy in that dtype, refreshed in place with ``copy_`` at each sync.
    vllm: one engine for the whole segment, started on the first stage's behavior policy; each sync loads the
    trainer's weights into it in place. ``engine_kwargs.num_threads`` applies during generation only (training
    keeps the default), as in the cold jobs.

    ``store``: the run's store, which the vllm engine loads the first policy from (the segment's open run's).

    Raises:
        ValueError: an engine without an in-memory sync (only ``transformers`` and ``vllm`` have one), or the vllm
            engine without ``store``.
    """

    def __init__(self, cfg, trainer, policy_dir: str, store=None) -> None:
        from mugrpo.engines.transformers_engine import TransformersEngine

        kwargs = dict(cfg.generation.engine_kwargs)
        kwargs.pop(THREADS_KEY, None)
        self.num_threads = job_threads(cfg, "segment")  # auto: every core (one process generates and trains)
        self._trainer = trainer
        self._copy = None
        self.name = cfg.generation.engine
        self.synced_stage: int | None = None
        if self.name == "transformers":
            dtype = torch_dtype(cfg.model.dtype)
            model = trainer.policy
            if dtype != next(model.parameters()).dtype:  # buffers (RoPE inv_freq) stay fp32, as the cold engine's
                import copy

                from mugrpo.policy.models import cast_parameters

                model = self._copy = cast_parameters(copy.deepcopy(model), dtype).requires_grad_(False).eval()
            options = {k: kwargs[k] for k in ("batch_size", "kv_budget_gib", "fp32_logits") if k in kwargs}
            self.engine = TransformersEngine(model, trainer.tokenizer, **options)  # the cold engine's defaults
            self.synced_stage = None if self._copy is not None else -1  # -1: shares the module, always in sync
        elif self.name == "vllm":
            from mugrpo.engines import make_engine

            if store is None:
                raise ValueError("the warm vllm engine loads its first policy from the run's store: pass store")
            self.engine = make_engine(
                "vllm", local_policy_dir(store, policy_dir), dtype=cfg.model.dtype, seed=cfg.run.seed, **kwargs
            )
            self.synced_stage = trainer.weights_stage
        else:
            raise ValueError(
                f"generation.engine {self.name!r} has no in-memory weight sync; orchestration.execution=warm "
                "supports 'transformers' and 'vllm' (use execution=cold for other engines)"
            )

    def sync(self) -> float:
        """Make the engine sample from the trainer's current weights; returns the seconds it took."""
        t0 = time.monotonic()
        stage = self._trainer.weights_stage
        if self.synced_stage == -1 or self.synced_stage == stage:
            return time.monotonic() - t0
        if self._copy is not None:
            with torch.no_grad():
                self._copy.load_state_dict(self._trainer.policy.state_dict())
        else:
            self.engine.update_weights(self._trainer.policy.state_dict().items())
        self.synced_stage = stage
        return time.monotonic() - t0

    def begin_phase(self, seed: int) -> None:
        """Before a stage's generation or evaluation: make the engine sample as the cold job's fresh engine would.
        vllm: reseed its engine core with ``seed`` and drop its prefix cache (:meth:`VLLMEngine.reset`);
        transformers: nothing (it seeds every call from ``SamplingParams.seed``)."""
        if self.name == "vllm":
            self.engine.reset(seed)

    def generate(self, prompt_token_ids, params):
        """:meth:`mugrpo.engines.base.RolloutEngine.generate` with the generation thread count."""
        with torch_threads(self.num_threads):
            return self.engine.generate(prompt_token_ids, params)

    def generate_many(self, requests):
        """:func:`mugrpo.engines.base.generate_requests` with the generation thread count: the cold eval job's
        batch schedule."""
        from mugrpo.engines.base import generate_requests

        with torch_threads(self.num_threads):
            return generate_requests(self.engine, requests)

    def close(self) -> None:
        if self.name == "vllm":
            self.engine.close()
        self._copy = None


def _phase(before: JobManifest | None, run, spec, work_key: str) -> tuple[JobManifest, float, float, float]:
    """Run one job of a stage: ``run(spec)``. Returns (manifest, wall seconds, work seconds, switch seconds that
    a job committed by an earlier attempt recorded)."""
    if before is not None:  # committed by an earlier attempt: keep the timings it recorded (as the stage flow does)
        return run(spec), before.timings.get("total", 0.0), 0.0, before.timings.get("switch", 0.0)
    t0 = time.monotonic()
    manifest = run(spec)
    return manifest, time.monotonic() - t0, manifest.timings.get(work_key, 0.0), 0.0


class WarmSegment:
    """What lives for the whole segment job: the trainer, the generation and evaluation workers (verifier pools),
    and the warm rollout engine (built on first use). :meth:`run_stage` runs one stage with them."""

    def __init__(self, run) -> None:
        """``run``: the segment's open run (:class:`mugrpo.orchestration.runs.OpenRun`), its config the segment
        spec's, concrete (:class:`SegmentSpec` refuses auto precision)."""
        from mugrpo.evaluation.worker import EvalWorker
        from mugrpo.generation import GenerationWorker
        from mugrpo.trainer.loop import Trainer

        self.run = run
        self.cfg, self.store, self.layout = run.config, run.store, run.layout
        self.trainer = Trainer(self.cfg.train.mixed_precision)
        if self.trainer.accelerator.num_processes > 1:
            raise ValueError(
                "a warm segment runs in one process; use orchestration.execution=cold for data parallelism"
            )
        self.train_threads = torch.get_num_threads()  # before any engine changes it
        self.gen_worker, self.eval_worker = GenerationWorker(), EvalWorker()
        self.engine: WarmEngine | None = None

    def close(self) -> None:
        self.gen_worker.close()
        self.eval_worker.close()
        if self.engine is not None:
            self.engine.close()

    def run_stage(self, k: int, origin: float) -> tuple[StageManifest, JobManifest, JobManifest]:
        """Stage ``k``: specs -> (sync) -> generate -> eval (if scheduled) -> train -> stage commit.

        Returns:
            (stage manifest, generate job manifest, train job manifest).
        """
        from mugrpo.commits.manifest import read_job_manifest
        from mugrpo.orchestration.job_specs import build_job_specs
        from mugrpo.orchestration.runs import commit_stage

        cfg, store, trainer = self.cfg, self.store, self.trainer
        specs = build_job_specs(self.run, k)
        for job, job_spec in specs.items():  # the same specs as the cold jobs, kept for audit and resume
            store.write_bytes(self.layout.job_spec(k, job), job_spec.model_dump_json(indent=2).encode())
        before = {job: read_job_manifest(store, cfg.run.id, k, job) for job in specs}
        t_sync = 0.0
        if before["generate"] is None or ("eval" in specs and before["eval"] is None):
            trainer.ensure_weights(specs["train"])  # loads only on first use or after a resume
            if self.engine is None:
                self.engine = WarmEngine(cfg, trainer, specs["generate"].policy_dir, store)
                self.gen_worker._engine = self.eval_worker._engine = self.engine
            t_sync = self.engine.sync()
            console.print(f"segment stage {k}: weights synced into the {self.engine.name} engine in {t_sync:.3f}s")
        torch.set_flush_denormal(False)  # generation and evaluation: as in the cold generate and eval jobs
        if before["generate"] is None:
            self.engine.begin_phase(specs["generate"].seed)
        gen, wall_gen, work_gen, old_switch = _phase(
            before["generate"], self.gen_worker.run_stage, specs["generate"], "gen"
        )
        wall_eval = work_eval = 0.0
        if "eval" in specs:  # the stage's behavior policy, evaluated before its updates change it
            if before["eval"] is None:
                self.engine.begin_phase(specs["eval"].seed)
            _, wall_eval, work_eval, old = _phase(before["eval"], self.eval_worker.run_stage, specs["eval"], "eval")
            old_switch += old
        torch.set_flush_denormal(True)  # training: as in the cold train job (see mugrpo.jobs.train)
        with torch_threads(self.train_threads):
            trained, wall_train, work_train, old = _phase(before["train"], trainer.run_stage, specs["train"], "train")
        old_switch += old
        t_total = time.monotonic() - origin
        timings = StageTimings(
            t_gen=wall_gen,
            t_train=wall_train,
            t_eval=wall_eval,
            t_switch=max(t_total - work_gen - work_train - work_eval, 0.0) + old_switch,
            t_total=t_total,
            t_sync=t_sync,
        )
        return commit_stage(self.run, k, timings), gen, trained


def run_segment(spec: SegmentSpec, *, origin: float | None = None) -> list[StageManifest]:
    """Run (or resume) the segment's stages in one process; returns the manifests of the stages committed now.
    ``origin``: ``time.monotonic()`` value the first stage's switch time counts from (the job passes its process
    start; default: the call).

    Raises:
        ValueError: more than one training process (a warm segment is one process), or an engine without sync.
        GenerationError, NonFiniteError, RolloutDataError, ...: as the cold jobs.
    """
    from mugrpo.commits.manifest import read_manifest
    from mugrpo.config import config_from_dict
    from mugrpo.orchestration.runs import attach_run

    cfg = config_from_dict(spec.config, source=f"segment spec of stage {spec.stage}")
    run = attach_run(cfg)  # this job process's one store of the run (the run flow started the run)
    store = run.store
    last = min(spec.stage + spec.num_stages, cfg.run.num_stages)
    todo = [k for k in range(spec.stage, last) if read_manifest(store, cfg.run.id, k) is None]
    console.print(
        f"segment stages {spec.stage}..{last - 1}: {last - spec.stage - len(todo)} already committed, "
        f"{len(todo)} to run (warm: one process, {cfg.generation.engine} engine)"
    )
    origin = time.monotonic() if origin is None else origin
    committed: list[StageManifest] = []
    if not todo:
        return committed
    segment = WarmSegment(run)
    try:
        for i, k in enumerate(todo):
            start = origin if i == 0 else time.monotonic()  # the job's start counts in its first stage
            manifest, gen, trained = segment.run_stage(k, start)
            committed.append(manifest)
            _report_progress(k, i + 1, len(todo), gen, trained, manifest.timings)
    finally:
        segment.close()
    return committed


def _report_progress(stage: int, done: int, of: int, gen: JobManifest, trained: JobManifest, t: StageTimings) -> None:
    """One human line and one JSON line (:data:`PROGRESS_TAG`) per committed stage."""
    reward = gen.metrics.get("mean_reward", 0.0)
    updates = trained.counts.get("updates", 0)
    console.print(
        f"segment: stage {stage} committed ({done} of {of}): {updates} updates, mean reward {reward:.3f}, "
        f"T_gen {t.t_gen:.1f}s T_train {t.t_train:.1f}s T_switch {t.t_switch:.2f}s (sync {t.t_sync:.3f}s)"
    )
    record = {
        "stage": stage,
        "done": done,
        "of": of,
        "updates": updates,
        "policy_version": trained.counts.get("policy_version", 0),
        "mean_reward": reward,
        "t_switch": t.t_switch,
        "t_sync": t.t_sync,
        "t_total": t.t_total,
    }
    print(PROGRESS_TAG + json.dumps(record), flush=True)
