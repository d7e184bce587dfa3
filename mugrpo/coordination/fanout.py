"""Fan-out of a stage's generation (and evaluation) over N worker jobs (``generation.workers``, ``eval.workers``).

Worker ``w`` of ``N`` owns items ``w, w + N, w + 2N, ...`` of the job's ordered work list (the shards of a
stage, or its benchmarks): a disjoint, deterministic split that depends on nothing but (w, N), so a relaunched
worker finds exactly the items it owns. Round-robin rather than contiguous blocks: consecutive shards have similar
cost, so each worker gets an equal share of a stage that ends on a short last shard.

Each worker writes its items, then its *worker manifest* ``jobs/stage=k/{job}.worker-{w:03d}-of-{N:03d}.manifest.json``
(the files it owns with their sha256): its commit point. The job's own manifest (``{job}.manifest.json``, what the
next job and the stage manifest read) is written only once every worker manifest exists, by whoever sees that
first: the last worker to commit, or the stage flow after all workers returned (when that worker died between its
two writes). N = 1 goes through the same functions: one worker manifest, then the job manifest.

The worker specs are copies of the job spec with ``worker`` set (:func:`worker_spec_paths`); with N = 1 the job
spec itself is worker 0's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mugrpo.commits.manifest import read_job_manifest, write_job_manifest
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from schemas import JobManifest

#: Job kinds that fan out over workers (each writes its job manifest from the worker manifests:
#: :func:`mugrpo.generation.commit_generation`, :func:`mugrpo.evaluation.worker.commit_eval`).
FANOUT_JOBS = ("generate", "eval")


def owned(count: int, worker: int, workers: int) -> list[int]:
    """Indices in ``range(count)`` owned by worker ``worker`` of ``workers`` (round-robin).

    Raises:
        ValueError: ``worker`` is not in ``[0, workers)``.
    """
    if workers < 1 or not 0 <= worker < workers:
        raise ValueError(f"worker {worker} of {workers}: the worker index must be in [0, {workers})")
    return list(range(worker, count, workers))


def worker_job(job: str, worker: int, workers: int) -> str:
    """Name of worker ``worker``'s part of ``job``, as used in file names: ``generate.worker-001-of-002``."""
    return f"{job}.worker-{worker:03d}-of-{workers:03d}"


def worker_manifests(store: Store, run_id: str, stage: int, job: str, workers: int) -> list[JobManifest | None]:
    """The worker manifests of ``job`` in worker order (None where that worker has not committed)."""
    return [read_job_manifest(store, run_id, stage, worker_job(job, w, workers)) for w in range(workers)]


def missing_workers(store: Store, run_id: str, stage: int, job: str, workers: int) -> list[int]:
    """Workers of ``job`` that have not committed their worker manifest."""
    parts = worker_manifests(store, run_id, stage, job, workers)
    return [w for w, m in enumerate(parts) if m is None]


def worker_spec_paths(store: Store, run_id: str, stage: int, job: str, spec, workers: int) -> list[str]:
    """Store paths of the specs of the ``workers`` workers of ``job``: the job spec itself when ``workers`` is 1,
    else one copy per worker, ``jobs/stage=k/{job}.worker-{w:03d}-of-{N:03d}.spec.json`` with ``worker`` set."""
    layout = RunLayout(run_id)
    if workers == 1:
        return [layout.job_spec(stage, job)]
    paths = []
    for w in range(workers):
        rel = layout.job_spec(stage, worker_job(job, w, workers))
        store.write_bytes(rel, spec.model_copy(update={"worker": w}).model_dump_json(indent=2).encode())
        paths.append(rel)
    return paths


def commit_when_all_committed(
    store: Store, run_id: str, stage: int, job: str, workers: int, build: Callable[[list[JobManifest]], JobManifest]
) -> JobManifest | None:
    """The job commit of a fanned-out ``job``: its existing manifest if it is committed (idempotent); else None
    while a worker manifest is missing; else ``build(worker_manifests)`` written as the job manifest.

    Raises:
        Whatever ``build`` raises (e.g. :class:`mugrpo.storage.store.ChecksumError` for a file changed after its worker
        committed it); nothing is written then.
    """
    done = read_job_manifest(store, run_id, stage, job)
    if done is not None:
        return done
    parts = worker_manifests(store, run_id, stage, job, workers)
    if any(p is None for p in parts):
        return None
    manifest = build(parts)
    write_job_manifest(store, manifest)
    return manifest


def slowest_timings(parts: Iterable[JobManifest], keys: Iterable[str]) -> dict[str, float]:
    """Per timing key, the slowest worker's seconds: the workers ran in parallel, so the job took that long."""
    parts = list(parts)
    return {k: max(p.timings.get(k, 0.0) for p in parts) for k in keys}
