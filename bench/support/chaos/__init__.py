"""Chaos harness (docs/reliability.md): SIGKILL random processes of a real local run (or stop it with SIGINT /
SIGTERM, or evict one of its jobs with SIGTERM and a grace), resume, check the resume invariants against an
uninterrupted run, and count the work each moment lost. ``bench/chaos.py`` is its command
line; ``tests/e2e/test_chaos.py`` runs its quick mode. No Prefect import here: the harness drives ``mugrpo run`` as a
subprocess."""

from bench.support.chaos.accounting import Loss, WorkLedger
from bench.support.chaos.harness import (
    ARM_ROLES,
    QUICK,
    STOP_SIGNALS,
    ChaosReport,
    ChaosSettings,
    EvictionCheck,
    Moment,
    MomentWork,
    StopCheck,
    draw_moments,
    in_overlap,
    run_chaos,
    tiny_config,
    waiting_job,
    working_jobs,
)
from bench.support.chaos.invariants import RunCheck, check_run, rollout_keys, train_updates
from bench.support.chaos.procs import ROLES, Proc, kill, process_tree

__all__ = [
    "ARM_ROLES",
    "QUICK",
    "ROLES",
    "STOP_SIGNALS",
    "ChaosReport",
    "ChaosSettings",
    "EvictionCheck",
    "Loss",
    "Moment",
    "MomentWork",
    "Proc",
    "RunCheck",
    "StopCheck",
    "check_run",
    "draw_moments",
    "in_overlap",
    "kill",
    "process_tree",
    "rollout_keys",
    "run_chaos",
    "tiny_config",
    "waiting_job",
    "working_jobs",
    "train_updates",
    "WorkLedger",
]
