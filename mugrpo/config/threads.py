"""Threads of the transformers engine (``generation.engine_kwargs.num_threads``): ``auto`` resolved by the schedule.

A job's torch intra-op thread count is decided once, where the schedule is known (the job spec is written from the
config: :func:`engine_options`), and recorded in the spec the job reads, so a resumed job computes with the count
its first attempt used on the same machine. The rule of ``auto`` (the default):

- the machine's width is its usable cores (``os.sched_getaffinity``), capped by ``OMP_NUM_THREADS`` where the
  operator set it (a CI runner that runs two test workers sets 1);
- the cores are shared by the jobs the schedule runs at once on this machine with the subprocess launcher: the N
  workers of a fan-out job (``generation.workers``, ``eval.workers``) get width // N each (at least 1), so two jobs
  never oversubscribe the cores (OpenMP threads spin-wait: 2 threads beside another busy process ran 3.5x slower
  than 1 on 2 cores);
- a job alone gets every core: a cold stage runs its generate, train and eval jobs one after another (a pre-started
  job waits asleep at its start gate), and the next stage's generation starts beside only the train job's
  checkpoint write (:mod:`mugrpo.execution.pipeline`), which serializes and hashes, without torch threads;
- a warm segment generates, trains and evaluates in one process: every core;
- with another launcher (Kubernetes) a job has a machine or a pod of its own: no count is set, and torch takes its
  default there (the pod's cores).

An explicit integer is kept as it is (the lab's recipes pin 1: CPU results depend on the thread count).
"""

from __future__ import annotations

import os
from typing import Any

#: The engine option this module resolves, and the engine that takes it.
THREADS_KEY = "num_threads"
THREADS_ENGINE = "transformers"


def machine_width() -> int:
    """Usable cores of this process (``os.sched_getaffinity``), capped by a positive integer ``OMP_NUM_THREADS``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cap = os.environ.get("OMP_NUM_THREADS", "")
    if cap.isdigit() and int(cap) > 0:
        cores = min(cores, int(cap))
    return max(cores, 1)


def check_threads(value: Any, field: str = "generation.engine_kwargs.num_threads") -> None:
    """Refuse a thread count that is neither ``"auto"`` nor an integer >= 1.

    Raises:
        ValueError: naming ``field`` and the value.
    """
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be 'auto' or an integer >= 1, got {value!r}")


def fanout_workers(cfg, job: str) -> int:
    """The worker jobs the schedule launches at once for ``job`` in a cold run (``generation.workers``; for "eval",
    ``eval.workers`` but no more than the benchmarks they split); 1 in a warm segment (one process) and for any
    other job."""
    if cfg.orchestration.execution != "cold":
        return 1
    if job == "generate":
        return cfg.generation.workers
    if job == "eval":
        return min(cfg.eval.workers, max(len(cfg.eval.benchmarks), 1))
    return 1


def beside(cfg, job: str) -> int:
    """How many jobs that compute with torch threads the schedule runs at once on this machine with ``job``
    (itself included): its fan-out workers under the subprocess launcher, else 1."""
    return fanout_workers(cfg, job) if cfg.orchestration.launcher == "subprocess" else 1


def job_threads(cfg, job: str) -> int | None:
    """The torch thread count of ``job`` ("generate", "eval" or "segment") for run config ``cfg``: the configured
    integer, or ``auto`` resolved by the rule in this module's docstring; None where no count is set (another
    engine, or a launcher that gives a job its own machine). The config refused any other value
    (:func:`check_threads`)."""
    value = cfg.generation.engine_kwargs.get(THREADS_KEY, "auto")
    if value != "auto":
        return value
    if cfg.generation.engine != THREADS_ENGINE or cfg.orchestration.launcher != "subprocess":
        return None
    return max(1, machine_width() // beside(cfg, job))


def engine_options(cfg, job: str) -> dict[str, Any]:
    """``generation.engine_kwargs`` as job ``job``'s spec records them: ``num_threads`` concrete
    (:func:`job_threads`), or absent where no count is set."""
    options = dict(cfg.generation.engine_kwargs)
    threads = job_threads(cfg, job)
    if threads is None:
        options.pop(THREADS_KEY, None)
    else:
        options[THREADS_KEY] = threads
    return options
