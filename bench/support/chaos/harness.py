"""The chaos harness (docs/reliability.md): SIGKILL a random process of a real local run at N moments drawn from a seed,
resume after each, then check the run against an uninterrupted one (:mod:`bench.support.chaos.invariants`).

A run here is the real thing: ``python -m mugrpo.cli run CONFIG`` (the flow process, Prefect flows on a local
Prefect server), job subprocesses, verifier workers, a tiny random policy with the real SmolLM2 tokenizer, real
GSM8K rows, Parquet files in a local store. Two arms share the moments: **cold** execution (generate, train and eval
jobs per stage) and **warm** execution (one segment job for all stages, then the final eval job).

A moment is (arm, delay, pick), drawn from the seed. ``delay`` x max_delay_s seconds after a job process is first
seen alive since the flow (re)started or the previous kill (a flow starting under load can take longer than a whole
job, so the clock starts with work, not with the flow), the harness lists the run's process tree by role (the flow,
a generate/train/eval/segment job, a verifier worker), adds ``tree`` (the flow and everything under it), chooses one
role uniformly with ``pick`` and SIGKILLs a process of it. Choosing among the roles alive at that instant means every
moment kills something while the run is going and the run cannot race ahead of the moments; the draws are
reproducible, what they hit depends on the machine's speed (each kill is printed). The cold arm's 1st, 4th, 7th,
... moments (1st, 7th, 13th, ... with eviction moments) are **overlap moments**: instead of the delay they wait for
the first instant the run is inside a checkpoint overlap (stage k+1's policy committed and stage k not: stage k's
train job finishing its checkpoint while stage k+1's generation starts beside it, :mod:`mugrpo.execution.pipeline`),
then pick a role the same way; its 2nd, 5th, 8th, ... are **waiting moments**: they wait for a pre-started job
waiting at its start gate (``orchestration.prestart_jobs``) and kill that job, the flow or the whole tree. A killed
job is re-run by the flow (Prefect's task retry, ``orchestration.retries: 1``, at once); when the flow itself is
gone (a kill of the flow or the tree, a stop, a job's second failure) the run is resumed the way a user does it, by
running ``mugrpo run CONFIG`` again (a killed verifier worker is replaced inside its job). Processes a killed job
leaves behind (its verifier workers, which a pod would take down with it) are killed.

Each arm also has a **data-edit moment** (``ChaosSettings.data_edit``): after the first kill that stops the run (or
after the last moment), the training file (a copy in the work folder) is reversed in place, as ``tac`` does, and the
run is re-run: it must be refused before anything starts (exit 2, one block naming the file and both sha256,
:mod:`mugrpo.orchestration.resume`). The file is then restored and the run resumes; the invariants also check every
stage's prompt plan (no prompt scheduled in two stages of an epoch, rollouts of exactly the planned prompts).

Each arm's 3rd, 6th, 9th, ... moments are **stop moments** (``ChaosSettings.stops``): at the moment's instant,
instead of a SIGKILL, the harness sends SIGINT or SIGTERM to the flow's process group (a terminal's Ctrl-C,
``timeout``, ``docker stop``) or to its pid (Kubernetes), rotating over the four pairs (:data:`STOP_SIGNALS`), and
checks what a stop promises (:mod:`tasks.stops`): exit code 128 + the signal within ``orchestration.stop_grace_s``
(plus :data:`STOP_SLACK_S`), no process of the run left behind, the run lease released, the resume command printed
(:class:`StopCheck`). The run then resumes like any other, and the invariants cover it.

**Eviction moments** (``ChaosSettings.evictions``: the warm arm's 2nd, 5th, 8th, ..., the cold arm's 4th, 10th,
16th, ...) are preemptions with notice of one job, as Kubernetes evicts its pod: ``delay`` after a job is seen alive,
the harness sends SIGTERM to the process group of a job that works (not one waiting at its start gate; picked with
``pick``), waits up to the job's grace (what the launcher tells it, :func:`mugrpo.common.preemption.job_grace_s`),
then SIGKILLs what is left of the group. A job that handles the notice (:data:`NOTICE_ROLES`) must exit 75 or 0
within the grace leaving nothing behind, and a train job's ``train.preempted.json`` must agree with its checkpoints
(:class:`EvictionCheck`); the flow then retries the job (exit 75 is transient), which resumes. A stop moment is the
other preemption with notice: every job of the run gets SIGTERM and its share of the grace.

**Work lost.** Every reached moment reports the work it threw away (:mod:`bench.support.chaos.accounting`): train
updates completed and not committed that the run trains again, and the generation shard in flight that it samples
again; the summary gives the mean per moment kind (SIGKILL, eviction, stop).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.support.chaos.accounting import (
    Loss,
    WorkLedger,
    committed_shards,
    committed_updates,
    job_stages,
    preempted_records,
)
from bench.support.chaos.invariants import RunCheck, check_run
from bench.support.chaos.procs import JOB_ROLES, ROLES, alive, cmdline, kill, process_tree, wait_gone
from mugrpo.cli.lifecycle import RESTART_HINT, RESUME_HINT  # the stop's printed hints (no Prefect import)
from mugrpo.common.preemption import PREEMPTED_EXIT_CODE, job_grace_s

__all__ = [
    "ARM_ROLES",
    "QUICK",
    "STOP_SIGNALS",
    "ChaosReport",
    "ChaosSettings",
    "EvictionCheck",
    "Moment",
    "MomentWork",
    "StopCheck",
    "draw_moments",
    "in_overlap",
    "run_chaos",
    "tiny_config",
    "waiting_job",
    "working_jobs",
]

RUN_ID = "chaos"
#: Victim roles each arm can meet. Warm execution has no per-stage generate/train/eval jobs: its segment job does
#: all three (only the final evaluation is an eval job).
ARM_ROLES = {
    "cold": ("flow", "generate", "train", "eval", "verifier", "tree"),
    "warm": ("flow", "segment", "eval", "verifier", "tree"),
}


@dataclass(frozen=True)
class ChaosSettings:
    """Size of the tiny run and of the chaos. ``moments`` >= 20 for a full run, >= 5 for CI's quick mode."""

    data_dir: Path
    model_dir: Path
    moments: int = 20
    seed: int = 0
    arms: tuple[str, ...] = ("cold", "warm")
    num_stages: int = 3
    prompts_per_stage: int = 4
    group_size: int = 2
    max_new_tokens: int = 6
    updates_per_stage: int = 3
    max_delay_s: float | None = None
    """A kill comes U(0, max_delay_s) seconds after a job is seen alive; None: the arm's uninterrupted wall time
    divided by twice its moments, so that the moments spread over the run on a fast or a loaded machine alike and
    the last is reached before the run completes (the mean delay sums to a quarter of the run; each resume's own
    progress, a job pre-started while another runs included, is what makes up the rest)."""
    data_edit: bool = True
    """Each arm edits its training file once between a kill and the resume and expects the resume refused."""
    eval_every_stage: bool = True
    """Evaluate every stage's policy (an eval job per stage in cold execution); False: the final policy only."""
    shared_reference: bool = False
    """One uninterrupted run is the reference of every arm: a warm one (fewer job starts, so the faster) when warm
    is an arm. Cold and warm execution commit bitwise-equal files (tests/e2e/test_warm.py), so the cold arm is then
    checked against warm execution too. False: each arm its own."""
    stops: bool = True
    """Each arm's 3rd, 6th, 9th, ... moments send SIGINT or SIGTERM (to the flow's group or pid) instead of a SIGKILL
    and check the stop (:class:`StopCheck`); False: every moment is a SIGKILL."""
    stop_grace_s: float = 25.0
    """The run's ``orchestration.stop_grace_s`` (its default): a stop must end the run within it, and an evicted
    job its share (:func:`mugrpo.common.preemption.job_grace_s`: 20 s of 25, what the launchers tell the jobs)."""
    evictions: bool = True
    """The warm arm's 2nd, 5th, 8th, ... moments and the cold arm's 4th, 10th, 16th, ... send SIGTERM to one job's
    process group with its grace (a Kubernetes eviction of the job's pod) instead of a SIGKILL and check the eviction
    (:class:`EvictionCheck`); False: none (those cold moments are overlap moments again)."""
    checkpoint_every: int = 2
    """The tiny run's ``train.checkpoint_every``: every 2nd of its 3 updates per stage, so a resume starts from a
    mid-stage checkpoint as well as from a stage's last, a train job saves an unscheduled checkpoint on a notice, and
    a SIGKILL between two checkpoints loses updates that a notice saves (the work-lost figures)."""


#: CI's quick mode (``bench/chaos.py --quick``, tests/e2e/test_chaos.py): 7 moments on a 2-stage run (cold: an overlap
#: SIGKILL, a waiting SIGKILL, a stop, an eviction; warm: a SIGKILL, an eviction, a stop), the final policy evaluated
#: only, one shared reference run; it fits in 5 minutes on a quiet 2-core machine (docs/reliability.md).
QUICK = {"moments": 7, "num_stages": 2, "eval_every_stage": False, "shared_reference": True}


@dataclass(frozen=True)
class Moment:
    """One kill: in ``arm``, ``delay`` x max_delay_s seconds after a job is seen alive (since the flow's (re)start
    or the previous kill), of the role at ``pick`` (in [0, 1)) among the roles then alive (sorted, plus ``tree``)."""

    index: int
    arm: str
    delay: float
    pick: float
    at: str = "any"
    """``any``: the delay after a job is seen alive; ``overlap`` (cold arm): the first instant a stage is inside its
    checkpoint overlap (the policy of stage k+1 committed, stage k's manifest not yet: stage k's train job finishing
    its checkpoint and stage k+1's generation started beside it, :mod:`mugrpo.execution.pipeline`), the delay unused;
    ``waiting`` (cold arm): the first instant a pre-started job waits at its start gate, and the victim is that
    job, the flow or the whole tree (:func:`waiting_job`)."""
    stop: tuple[str, str] | None = None
    """A stop moment: (signal name, target) with target ``group`` (the flow's process group) or ``pid`` (the flow
    alone), sent instead of a SIGKILL at the moment's instant; None: a SIGKILL of the picked role."""
    evict: bool = False
    """An eviction moment (``at`` is ``any``): at the moment's instant, SIGTERM to the process group of one working
    job (not waiting at its start gate; picked with ``pick`` among them), as Kubernetes evicts a pod, and SIGKILL of
    what is left of the group once its grace is over (:func:`_evict`)."""

    @property
    def kind(self) -> str:
        """``stop`` (SIGINT/SIGTERM to the run), ``eviction`` (SIGTERM to one job) or ``SIGKILL``."""
        return "stop" if self.stop is not None else "eviction" if self.evict else "SIGKILL"

    def role(self, alive_roles: set[str]) -> str:
        """The victim role among ``alive_roles`` (``tree`` is always a choice)."""
        choices = sorted(alive_roles | {"tree"})
        return choices[int(self.pick * len(choices))]


@dataclass
class StopCheck:
    """What one stop moment saw: the signal, its target, the seconds from the signal to the flow's exit, the exit
    code, the job roles alive at the signal, and every promise of a stop that did not hold (``problems``)."""

    index: int
    signal: str
    target: str
    roles: list[str]
    seconds: float = 0.0
    exit_code: int | None = None
    problems: list[str] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)
    """What each train job that the stop preempted recorded (``train.preempted.json``: done, saved, dropped)."""

    @property
    def ok(self) -> bool:
        """Every promise held: exit code, grace, nothing left, lease released, resume printed, a train job's
        ``train.preempted.json`` true to the checkpoints."""
        return not self.problems


@dataclass
class EvictionCheck:
    """What one eviction moment saw: the job (role, pid), the seconds from its SIGTERM to its exit, its exit as the
    flow's log tells it (``exit 75``: its ``preempted:`` line; ``exit 0``; ``killed by SIGTERM``...), what the flow did
    then (``retried it``; ``went on``: the job had finished; ``exited N``: the job's retries were spent by an earlier
    moment), and every promise of a notice that did not hold (``problems``)."""

    index: int
    role: str
    pid: int
    seconds: float = 0.0
    exit: str = "unknown"
    flow: str = ""
    problems: list[str] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)
    """What a preempted train job recorded (``train.preempted.json``: done, saved, dropped)."""

    @property
    def ok(self) -> bool:
        """The job exited within its grace, with 75 or 0 (a job that handles the notice), leaving nothing behind."""
        return not self.problems


@dataclass
class MomentWork:
    """The work one reached moment of ``kind`` (:attr:`Moment.kind`) threw away (:mod:`bench.support.chaos.
    accounting`)."""

    index: int
    kind: str
    loss: Loss


@dataclass
class ArmResult:
    """One arm: what each moment did, the uninterrupted run's wall time, the invariants' outcome."""

    arm: str
    reference_s: float = 0.0
    chaos_s: float = 0.0
    events: list[str] = field(default_factory=list)
    killed: int = 0
    not_reached: int = 0
    completed: bool = False
    check: RunCheck | None = None
    data_edit: str | None = None  # what the data-edit moment saw; None: it did not run
    data_edit_refused: bool = False
    stops: list[StopCheck] = field(default_factory=list)
    evictions: list[EvictionCheck] = field(default_factory=list)
    work: list[MomentWork] = field(default_factory=list)


#: The order of the moment kinds on the summary's work-lost line.
KINDS = ("SIGKILL", "eviction", "stop")


@dataclass
class ChaosReport:
    """Every arm's result; :attr:`summary` is the line the harness prints."""

    seed: int
    moments: int
    arms: list[ArmResult]

    @property
    def resumed(self) -> int:
        """Kills after which the run resumed and completed."""
        return sum(a.killed for a in self.arms if a.completed)

    @property
    def ok(self) -> bool:
        """Every moment was reached and resumed, every arm completed, every invariant holds and every stop kept its
        promises."""
        edits = all(a.data_edit_refused for a in self.arms if a.data_edit is not None)
        stops = all(c.ok for a in self.arms for c in a.stops)
        evictions = all(c.ok for a in self.arms for c in a.evictions)
        return (
            self.resumed == self.moments
            and edits
            and stops
            and evictions
            and all(a.completed and a.check and a.check.ok for a in self.arms)
        )

    @property
    def work_lost(self) -> dict[str, tuple[int, float, float]]:
        """Per moment kind that was reached: (moments, mean updates redone, mean shards redone)."""
        out = {}
        for kind in KINDS:
            rows = [w.loss for a in self.arms for w in a.work if w.kind == kind]
            if rows:
                out[kind] = (
                    len(rows),
                    sum(r.updates for r in rows) / len(rows),
                    sum(r.shards for r in rows) / len(rows),
                )
        return out

    @property
    def summary(self) -> str:
        """``N/N resumed, 0 lost, 0 duplicated, weights equal, ...``, then the work lost per moment kind
        (:attr:`work_lost`), then one line per thing that differed."""
        checks = [a.check for a in self.arms if a.check is not None]
        lost, dup = sum(c.lost for c in checks), sum(c.duplicated for c in checks)
        equal = len(checks) == len(self.arms) and all(c.weights_equal for c in checks)
        line = f"{self.resumed}/{self.moments} resumed, {lost} lost, {dup} duplicated, "
        line += "weights equal" if equal else "weights DIFFER"
        edits = [a for a in self.arms if a.data_edit is not None]
        if edits:
            line += f", {sum(a.data_edit_refused for a in edits)}/{len(edits)} data edits refused"
        stops = [c for a in self.arms for c in a.stops]
        if stops:
            line += f", {sum(c.ok for c in stops)}/{len(stops)} stops clean"
        evictions = [c for a in self.arms for c in a.evictions]
        if evictions:
            line += f", {sum(c.ok for c in evictions)}/{len(evictions)} evictions clean"
        work = "; ".join(
            f"{kind} x{n}: {updates:.1f} updates, {shards:.1f} shards"
            for kind, (n, updates, shards) in self.work_lost.items()
        )
        lines = [line, f"work lost per moment (mean; completed updates trained again, shards sampled again): {work}"]
        problems = [f"  {a.arm}: {p}" for a in self.arms for p in (a.check.problems if a.check else ["no check"])]
        problems += [f"  {a.arm}: data edit NOT refused: {a.data_edit}" for a in edits if not a.data_edit_refused]
        problems += [
            f"  {a.arm}: moment {c.index}: {c.signal} to the {c.target}: {p}" for a in self.arms for c in a.stops
            for p in c.problems
        ]  # fmt: skip
        problems += [
            f"  {a.arm}: moment {c.index}: SIGTERM to the {c.role} job's group: {p}" for a in self.arms
            for c in a.evictions for p in c.problems
        ]  # fmt: skip
        problems += [f"  {a.arm}: run did not complete" for a in self.arms if not a.completed]
        problems += [f"  {a.arm}: {a.not_reached} moments not reached" for a in self.arms if a.not_reached]
        return "\n".join([*lines[: 2 if work else 1], *problems])


def train_file(work: Path, arm: str) -> Path:
    """The arm's copy of the training rows in the harness's work folder (the data-edit moment edits it)."""
    return work / f"{arm}-train.jsonl"


def tiny_config(s: ChaosSettings, root: Path, arm: str) -> dict:
    """The tiny multi-stage run of ``arm`` (cold or warm execution), rooted at ``root``; it trains on the arm's copy
    of the first GSM8K rows (:func:`train_file`)."""
    return {
        "run": {"id": RUN_ID, "root": str(root), "seed": s.seed, "num_stages": s.num_stages},
        "model": {"source": str(s.model_dir), "max_context": 512},
        "data": {
            "train": {
                "name": "gsm8k",
                "path": str(train_file(root.parent, arm)),
                "answer_kind": "gsm8k",
                "limit": s.num_stages * s.prompts_per_stage,
            }
        },
        "generation": {
            "prompts_per_stage": s.prompts_per_stage,
            "shard_size": 2,
            "engine_kwargs": {"num_threads": 1},
            "sampling": {"temperature": 1.0, "max_new_tokens": s.max_new_tokens, "n": s.group_size},
        },
        "reward": {"components": {"math_correctness": 1.0, "format": 0.5}, "num_workers": 1},
        "train": {
            "updates_per_stage": s.updates_per_stage,
            "rollouts_per_update": s.prompts_per_stage * s.group_size // 2,
            "micro_batch_size": 2,
            "checkpoint_every": s.checkpoint_every,
            "skip_zero_variance_groups": False,
            "lr": 1e-3,
        },
        "eval": {
            "every_stage": s.eval_every_stage,
            "benchmarks": [
                {
                    "dataset": {"name": "gsm8k", "path": str(s.data_dir / "gsm8k/test.jsonl"), "answer_kind": "gsm8k"},
                    "num_prompts": 2,
                    "max_new_tokens": 4,
                }
            ],
        },
        # retries 1 (the default), at once: a job killed or evicted is re-run inside the flow by Prefect's retry (exit
        # 75 of a preempted job is transient, tasks/launchers/errors.py), as on Kubernetes; a job's second failure, a
        # kill of the flow or a stop ends the flow, and a user's resume follows
        "orchestration": {
            "retries": 1,
            "retry_delay_s": 0,
            "stop_grace_s": s.stop_grace_s,
            "execution": arm,
            **({"segment_stages": s.num_stages} if arm == "warm" else {}),
        },
        "tracking": {"sinks": []},
    }


#: Every OVERLAP_EVERY-th moment of the cold arm, its first included, is an overlap moment (:attr:`Moment.at`).
OVERLAP_EVERY = 3
#: The signals and targets of the stop moments, in turn: each pair once in every four stops (tests/e2e/test_stops.py
#: rotates the same way over its moments).
STOP_SIGNALS = (("SIGINT", "group"), ("SIGTERM", "pid"), ("SIGTERM", "group"), ("SIGINT", "pid"))
#: Seconds a stop may take beyond the grace: the harness's polling and the interpreter's exit.
STOP_SLACK_S = 5.0


def draw_moments(s: ChaosSettings) -> list[Moment]:
    """``s.moments`` moments from ``s.seed``: arms in turn (equal shares), delay fraction and pick uniform in [0, 1);
    the cold arm's 1st, 7th, 13th, ... moments wait for a checkpoint overlap (:data:`OVERLAP_EVERY`), its 2nd, 5th,
    8th, ... for a pre-started job waiting at its start gate; each arm's 3rd, 6th, 9th, ... are stop moments
    (``s.stops``), their signal and target in turn from :data:`STOP_SIGNALS`; the cold arm's 4th, 10th, 16th, ... and
    the warm arm's 2nd, 5th, 8th, ... are eviction moments (``s.evictions``; without them the cold ones are overlap
    moments). The same seed gives the same moments (and the same delays and picks with or without stops and
    evictions)."""
    rng = random.Random(s.seed)
    moments = []
    for i in range(s.moments):
        arm = s.arms[i % len(s.arms)]
        ordinal = sum(m.arm == arm for m in moments)
        place, cycle = ordinal % OVERLAP_EVERY, ordinal // OVERLAP_EVERY
        if arm == "cold":
            evict = s.evictions and place == 0 and cycle % 2 == 1
            at = "any" if evict else {0: "overlap", 1: "waiting"}.get(place, "any")
        else:
            evict, at = s.evictions and place == 1, "any"
        stop = None
        if s.stops and place == OVERLAP_EVERY - 1:
            stop = STOP_SIGNALS[sum(m.stop is not None for m in moments) % len(STOP_SIGNALS)]
        moments.append(Moment(i, arm, rng.random(), rng.random(), at, stop, evict))
    return moments


def _waits(p, run_dir: Path) -> bool:
    """Whether job process ``p`` waits at its start gate (a marker of its spec's ``start_after`` not committed)."""
    try:
        markers = json.loads(Path(cmdline(p.pid)[-1]).read_text()).get("start_after", [])
    except (OSError, IndexError, ValueError):
        return False
    return any(not (run_dir.parent / m).exists() for m in markers)


def waiting_job(tree: list, run_dir: Path) -> object | None:
    """A job process of ``tree`` waiting at its start gate (a pre-started job: some marker of its spec's
    ``start_after`` not committed yet, :mod:`mugrpo.coordination.start_gate`), or None."""
    return next((p for p in tree if p.role in JOB_ROLES and _waits(p, run_dir)), None)


def working_jobs(tree: list, run_dir: Path) -> list:
    """The job processes of ``tree`` not waiting at their start gate (an eviction moment's candidates), by role and
    pid."""
    return sorted((p for p in tree if p.role in JOB_ROLES and not _waits(p, run_dir)), key=lambda p: (p.role, p.pid))


def in_overlap(run_dir: Path, num_stages: int) -> int | None:
    """The stage k whose checkpoint overlap the run is in (policies/stage=k+1 committed, stages/stage=k.json not
    yet), or None."""
    for k in range(num_stages - 1):
        if (run_dir / f"policies/stage={k + 1}/_COMPLETE").exists() and not (
            run_dir / f"stages/stage={k}.json"
        ).exists():
            return k
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def prefect_server(home: Path, start_timeout_s: float = 180.0) -> Iterator[str]:
    """A local ``prefect server start`` (SQLite in ``home``) for the harness's flow processes; yields its API URL.

    Raises:
        RuntimeError: the server exited or did not answer /api/health within ``start_timeout_s``.
    """
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
    )
    cli = str(Path(sys.executable).with_name("prefect"))
    log = open(home / "server.log", "wb")  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(
        [cli, "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui", "--analytics-off"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {proc.returncode}: see {home / 'server.log'}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.status == 200 and json.loads(r.read()) is True:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prefect server did not answer within {start_timeout_s:.0f} s")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


class RunProcess:
    """``mugrpo run CONFIG`` as a child process (the flow process), its output appended to ``log``."""

    def __init__(self, config: Path, env: dict[str, str], log: Path) -> None:
        self.config, self.env, self.log = config, env, log
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        """Start (or resume: the same command) the run, as a terminal starts it: the leader of its own process group
        (a stop moment signals that group)."""
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mugrpo.cli", "run", str(self.config)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1

    def running(self) -> bool:
        """Whether the flow process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout_s: float) -> int | None:
        """The flow's exit code, or None if it is still running after ``timeout_s``."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, n: int = 30) -> str:
        """The last ``n`` lines of the run's output."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def _job_alive(run: RunProcess) -> bool:
    return any(p.role in JOB_ROLES for p in process_tree(run.proc.pid))


def _kill_moment(
    run: RunProcess,
    m: Moment,
    max_delay_s: float,
    run_dir: Path,
    s: ChaosSettings,
    result: ArmResult,
    ledger: WorkLedger,
) -> str | None:
    """Kill per ``m``: ``m.delay * max_delay_s`` seconds after a job is seen alive, or (an overlap moment) once
    the run is inside a checkpoint overlap (:func:`in_overlap`). A stop moment signals the flow instead and appends
    its :class:`StopCheck` to ``result.stops``; an eviction moment sends SIGTERM to a working job's group once one
    works and appends its :class:`EvictionCheck` to ``result.evictions``. Every reached moment appends the work it
    threw away to ``result.work`` (``ledger``, :mod:`bench.support.chaos.accounting`).

    Returns:
        What was killed or stopped, or None when the run completed first.

    Raises:
        RuntimeError: the run failed three times without being killed (a real failure, not chaos).
    """
    failures = 0
    num_stages = s.num_stages
    delay_s = m.delay * max_delay_s
    while True:
        if not run.running():
            run.start()
        if m.at == "overlap":
            while run.running() and (in_overlap(run_dir, num_stages) is None or not _job_alive(run)):
                time.sleep(0.01)
        elif m.at == "waiting":
            while run.running() and waiting_job(process_tree(run.proc.pid), run_dir) is None:
                time.sleep(0.01)
        else:
            while run.running() and not _job_alive(run):
                time.sleep(0.02)
            deadline = time.monotonic() + delay_s
            while run.running() and time.monotonic() < deadline:
                time.sleep(0.02)
            while m.evict and run.running() and not working_jobs(process_tree(run.proc.pid), run_dir):
                time.sleep(0.02)  # between two jobs, or only pre-started ones waiting: the next one that works
        stage = in_overlap(run_dir, num_stages) if m.at == "overlap" else None
        tree = process_tree(run.proc.pid) if run.running() else []
        if not tree:  # the flow exited before the moment
            if run.proc.wait() == 0:
                return None
            failures += 1
            if failures >= 3:
                raise RuntimeError(f"the run failed {failures} times without a kill:\n{run.tail()}")
            continue  # it failed on its own (or of the previous moment's kill; kept in the log): resume
        waiting = waiting_job(tree, run_dir) if m.at == "waiting" else None
        if m.at == "waiting" and waiting is None:
            continue  # it left the gate between the two looks: wait for the next one
        jobs = _jobs(tree, run_dir, num_stages)
        ledger.read()
        since = ledger.offset
        if m.stop is not None:
            check = _stop(run, m, tree, run_dir, s)
            if check is None:
                return None  # the run completed as the signal came
            result.stops.append(check)
            loss = _account(run, m, _settle(jobs, since, run_dir, s), ledger, result)
            verdict = "clean" if check.ok else "; ".join(check.problems)
            doing = ", ".join(check.roles) or "no job"
            return (
                f"moment {m.index:2d}: {check.signal} to the {check.target} {delay_s:5.1f} s after a job was seen "
                f"({doing} running): exit {check.exit_code} after {check.seconds:.1f} s, {verdict}; "
                f"{loss.describe()}{_saved(check.saved)}"
            )
        if m.evict:
            working = working_jobs(tree, run_dir)
            if not working:
                continue
            victim = working[int(m.pick * len(working))]
            evicted = _evict(run, m, victim, tree, jobs, since, ledger, s)
            if evicted is None:
                continue  # it ended between the listing and the signal: the next one
            check, settled = evicted
            result.evictions.append(check)
            loss = _account(run, m, settled, ledger, result)
            verdict = "clean" if check.ok else "; ".join(check.problems)
            return (
                f"moment {m.index:2d}: SIGTERM to the {victim.role} job's group (pid {victim.pid}) {delay_s:5.1f} s "
                f"after a job was seen: {check.exit} after {check.seconds:.1f} s, the flow {check.flow}, {verdict}; "
                f"{loss.describe()}{_saved(check.saved)}"
            )
        # a waiting moment kills the waiting job, the flow or the whole tree while the job waits
        role = m.role({waiting.role, "flow"} if waiting else {p.role for p in tree} & set(ROLES))
        if role == "tree":
            victims = [p.pid for p in tree]
        elif waiting is not None and role == waiting.role:
            victims = [waiting.pid]
        else:
            victims = [next(p.pid for p in tree if p.role == role)]
        hit = kill(victims)
        if not hit:  # it ended between the listing and the kill: try again
            continue
        if role in ("flow", "tree"):
            run.wait(timeout_s=300)
            kill([p.pid for p in tree if p.pid not in hit and alive(p.pid)])  # orphans (a pod takes them down)
        elif role in JOB_ROLES:  # the flow retries the job (orchestration.retries) or exits when its retries are spent
            wait_gone(hit)
            kill([p.pid for p in _descendants(tree, hit[0]) if alive(p.pid)])  # its verifier workers, as a pod's end
        loss = _account(run, m, _settle(jobs, since, run_dir, s), ledger, result)
        if m.at == "overlap":
            event = f"moment {m.index:2d}: {role} (pid {hit[0]}) killed inside stage {stage}'s checkpoint overlap"
        elif waiting is not None:
            what = "the waiting job" if role == waiting.role else f"while a {waiting.role} job waited at its gate"
            event = f"moment {m.index:2d}: {role} (pid {hit[0]}) killed: {what}"
        else:
            event = f"moment {m.index:2d}: {role} (pid {hit[0]}) killed {delay_s:5.1f} s after a job was seen"
        return f"{event}; {loss.describe()}"


@dataclass(frozen=True)
class _Job:
    """A job process at a moment's instant: what it trains and samples (:func:`bench.support.chaos.accounting.
    job_stages`), and whether it waited at its start gate."""

    pid: int
    role: str
    trains: frozenset[int]
    samples: frozenset[int]
    waiting: bool


def _jobs(tree: list, run_dir: Path, num_stages: int) -> list[_Job]:
    out = []
    for p in tree:
        if p.role in JOB_ROLES:
            trains, samples = job_stages(p.role, cmdline(p.pid), num_stages)
            out.append(_Job(p.pid, p.role, frozenset(trains), frozenset(samples), _waits(p, run_dir)))
    return out


def _descendants(tree: list, pid: int) -> list:
    """The processes of ``tree`` (parents before children) under ``pid``."""
    under, out = {pid}, []
    for p in tree:
        if p.ppid in under:
            under.add(p.pid)
            out.append(p)
    return out


#: Seconds the harness waits for the flow to log the end of a job a moment took down while the flow goes on (the
#: launcher logs the job's last lines first). A pre-started job killed while it waited is followed later, and printed
#: nothing: the harness does not wait for it.
LOG_WAIT_S = 10.0


@dataclass
class _Settled:
    """The jobs a moment took down, what was committed of their stages once they were gone (stage -> committed
    updates of the stages they trained, committed shards of those they sampled), and the log's offset at the
    moment's instant."""

    dead: list[_Job]
    updates: dict[int, int]
    shards: dict[int, int]
    since: int


def _settle(jobs: list[_Job], since: int, run_dir: Path, s: ChaosSettings) -> _Settled:
    """What the moment's victims left: call it as soon as they are gone (a retried job commits more soon after)."""
    dead = [j for j in jobs if not alive(j.pid)]
    trains = set().union(*(j.trains for j in dead))
    samples = set().union(*(j.samples for j in dead))
    return _Settled(
        dead,
        {k: committed_updates(run_dir, k, s.updates_per_stage) for k in sorted(trains)},
        {k: committed_shards(run_dir, k) for k in sorted(samples)},
        since,
    )


def _job_end(run: RunProcess, ledger: WorkLedger, job: _Job, since: int) -> tuple[str, int] | None:
    """The flow's line about the end of ``job`` after byte ``since`` of the log (``... job pid N finished``, the
    launch of its retry, or the flow's own error line), and its end offset; None when none came in
    :data:`LOG_WAIT_S` or the flow exited."""
    return ledger.wait_for((f"pid {job.pid} ", f"launching {job.role} job (attempt "), since, LOG_WAIT_S, run.running)


def _account(run: RunProcess, m: Moment, settled: _Settled, ledger: WorkLedger, result: ArmResult) -> Loss:
    """The work lost by the jobs ``settled`` found dead (the flow's log read up to the end of each, not into the
    lines of a retry), appended to ``result.work``."""
    until = None
    if run.running():
        ends = [_job_end(run, ledger, j, settled.since) for j in settled.dead if not j.waiting]
        if run.running():
            until = max([settled.since, *(e[1] for e in ends if e is not None)])
    samples = set().union(*(j.samples for j in settled.dead))
    loss = ledger.lost(settled.updates, samples, settled.shards, until)
    result.work.append(MomentWork(m.index, m.kind, loss))
    return loss


def _saved(records: list[str]) -> str:
    return f"; {'; '.join(records)}" if records else ""


#: Processes that handle a preemption notice (:mod:`mugrpo.common.preemption`): on SIGTERM they save what
#: fits in their grace and exit 75 (0 when their work ended first). The segment job (warm execution) saves nothing in
#: flight: its SIGTERM ends it at once with its ``preempted:`` line and exit 75, what it committed kept, so its eviction
#: is reported with the work it lost, not held against it.
NOTICE_ROLES = ("generate", "train", "eval")
#: How the launcher's line about a failed job reads (:func:`tasks.launchers.protocol.launch_job`).
_FAILED = re.compile(r"failed after [\d.]+ s: ([^;'\"]+)")


def _exit_of(role: str, text: str, end: str | None) -> str:
    """A job's exit as the flow's log tells it: ``text`` (the log from the signal to the flow's line ``end`` about
    the job) holds the job's own ``preempted:`` line when it stopped on the notice (exit 75)."""
    if f"[{role}] preempted:" in text or (end is not None and " preempted after " in end):
        return f"exit {PREEMPTED_EXIT_CODE}"
    if end is None:
        return "no line of the flow about its end"
    if " finished in " in end:
        return "exit 0"
    if m := _FAILED.search(end):
        return m.group(1).strip()
    return "no preemption line"  # the flow retried it (its launch line is ``end``)


def _evict(
    run: RunProcess, m: Moment, victim, tree: list, jobs: list[_Job], since: int, ledger: WorkLedger, s: ChaosSettings
) -> tuple[EvictionCheck, _Settled] | None:
    """Evict ``victim`` as Kubernetes evicts a pod: SIGTERM to its process group, SIGKILL of whatever is left of it
    once its grace (:func:`mugrpo.common.preemption.job_grace_s` of ``s.stop_grace_s``, the grace the launcher tells
    the job) is over or the job exited. Checks the promises of a notice for a job of :data:`NOTICE_ROLES`: it exits
    within the grace (plus :data:`STOP_SLACK_S`) with 75 (preempted) or 0 (its work ended first), as the flow's log
    tells it, leaving no process behind; a train job's ``train.preempted.json`` agrees with its checkpoints. Then the
    flow retries the job (``went on``) or exits (its retries spent by an earlier moment).

    Returns:
        The check and what the eviction left (:func:`_settle`, ``jobs`` being the run's jobs at the signal and
        ``since`` the log's offset then), or None when the job was gone before the signal.
    """
    grace_s = job_grace_s(s.stop_grace_s)
    check = EvictionCheck(m.index, victim.role, victim.pid)
    since_wall = time.time()
    t0 = time.monotonic()
    try:
        if os.getpgid(victim.pid) == victim.pid:  # a job leads its own process group (its session)
            os.killpg(victim.pid, signal.SIGTERM)
        else:
            os.kill(victim.pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    left = wait_gone([victim.pid], timeout_s=grace_s + STOP_SLACK_S)
    check.seconds = time.monotonic() - t0
    if left:
        check.problems.append(f"still running {grace_s + STOP_SLACK_S:.0f} s after its SIGTERM (grace {grace_s:.0f} s)")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.pid, signal.SIGKILL)
        wait_gone([victim.pid])
    settled = _settle(jobs, since, ledger.run_dir, s)  # before the flow's retry of the job commits more
    check.saved = _check_records(ledger.run_dir, since_wall, s, check.problems)
    leftovers = wait_gone([p.pid for p in _descendants(tree, victim.pid)])
    if leftovers:
        if victim.role in NOTICE_ROLES:
            named = [f"{p.role} {p.pid}" for p in tree if p.pid in leftovers]
            check.problems.append(f"processes of its group left behind after its exit: {named}")
        kill(leftovers)  # the end of the pod
    job = next(j for j in jobs if j.pid == victim.pid)
    end = _job_end(run, ledger, job, since)
    check.exit = _exit_of(victim.role, ledger.text(since, end[1] if end else None), end[0] if end else None)
    if victim.role in NOTICE_ROLES and check.exit not in ("exit 0", f"exit {PREEMPTED_EXIT_CODE}"):
        check.problems.append(f"{check.exit}: expected exit {PREEMPTED_EXIT_CODE} (preempted) or 0")
    if end is not None and f"launching {victim.role} job (attempt " in end[0]:
        check.flow = "retried it"
    else:  # the job finished, or failed past its retries and the flow says so as it exits
        code = run.wait(timeout_s=60) if end is not None and "Error:" in end[0] else run.proc.poll()
        check.flow = "went on" if code is None else f"exited {code}"
    return check, settled


def _check_records(run_dir: Path, since_wall: float, s: ChaosSettings, problems: list[str]) -> list[str]:
    """The ``train.preempted.json`` records written since ``since_wall``, one line each; a record whose saved update
    is not the stage's latest committed checkpoint is a problem."""
    out = []
    for k, rec in sorted(preempted_records(run_dir, since_wall).items()):
        saved, committed = rec.get("saved"), committed_updates(run_dir, k, s.updates_per_stage)
        out.append(f"train stage {k} preempted: done {rec.get('done')}, saved {saved}, dropped {rec.get('dropped')}")
        if saved != committed:
            problems.append(f"train.preempted.json of stage {k}: saved {saved}, the latest checkpoint {committed}")
    return out


def _stop(run: RunProcess, m: Moment, tree: list, run_dir: Path, s: ChaosSettings) -> StopCheck | None:
    """Send the stop moment's signal to the flow's group or pid and check the promises of a stop (:mod:`tasks.stops`):
    exit code 128 + the signal within ``s.stop_grace_s`` + :data:`STOP_SLACK_S`; no process of ``tree`` (the run's
    processes at the signal) alive 5 s later (a leftover is listed, then SIGKILLed so the harness goes on); the run
    lease (``_lease.json``) released; the resume command printed; a train job's ``train.preempted.json`` (its jobs got
    SIGTERM and their share of the grace) agrees with the checkpoints. Returns None when the run exited 0 (it
    completed before the signal took hold)."""
    grace_s = s.stop_grace_s
    name, target = m.stop
    sig = getattr(signal, name)
    roles = sorted({p.role for p in tree} & set(JOB_ROLES))
    check = StopCheck(m.index, name, target, roles)
    offset = run.log.stat().st_size
    since_wall = time.time()
    t0 = time.monotonic()
    try:
        if target == "group":
            os.killpg(run.proc.pid, sig)
        else:
            os.kill(run.proc.pid, sig)
    except ProcessLookupError:
        pass
    code = run.wait(timeout_s=grace_s + 60)
    check.seconds = time.monotonic() - t0
    if code is None:
        check.problems.append(f"still running {grace_s + 60:.0f} s after {name}")
        kill([p.pid for p in process_tree(run.proc.pid)])
        code = run.proc.wait()
    check.exit_code = code
    if code == 0:
        return None
    if code != 128 + sig:
        check.problems.append(f"exit code {code}, expected {128 + sig}")
    if check.seconds > grace_s + STOP_SLACK_S:
        check.problems.append(f"exit {check.seconds:.1f} s after {name}, grace {grace_s:.0f} s")
    left = wait_gone([p.pid for p in tree])
    if left:
        named = [f"{p.role} {p.pid}: {' '.join(cmdline(p.pid))[:80]}" for p in tree if p.pid in left]
        check.problems.append(f"processes left behind: {named}")
        kill(left)
    try:
        released = json.loads((run_dir / "_lease.json").read_text()).get("released") is True
    except (OSError, ValueError):
        released = False
    if not released:
        check.problems.append("the run lease was not released")
    with run.log.open("rb") as f:
        f.seek(offset)
        said = f.read().decode(errors="replace")
    if RESUME_HINT not in said and RESTART_HINT not in said:
        check.problems.append("no resume command printed")
    check.saved = _check_records(run_dir, since_wall, s, check.problems)
    return check


def _data_edit_moment(run: RunProcess, train: Path) -> tuple[bool, str]:
    """Reverse the training file in place (``tac``), re-run the stopped run and expect the refusal: exit 2 before
    Prefect starts, one block naming the file and its recorded and current sha256. Restores the file.

    Returns:
        (refused as expected, what happened).
    """
    original = train.read_bytes()
    train.write_bytes(b"".join(reversed(original.splitlines(keepends=True))))
    try:
        out = subprocess.run(
            [sys.executable, "-m", "mugrpo.cli", "run", str(run.config)],
            env=run.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        train.write_bytes(original)
    text = out.stdout + out.stderr
    refused = (
        out.returncode == 2
        and text.count("changed since the run started") == 1
        and f"data.train: {train}" in text
        and "recorded sha256" in text
        and "Traceback" not in text
    )
    tail = " | ".join(text.strip().splitlines()[-6:])
    return refused, f"exit {out.returncode}: {tail}"


def _write_train_file(s: ChaosSettings, work: Path, arm: str) -> None:
    rows = (s.data_dir / "gsm8k/train.jsonl").read_text().splitlines(keepends=True)
    train_file(work, arm).write_text("".join(rows[: max(40, s.num_stages * s.prompts_per_stage)]))


def _reference(arm: str, s: ChaosSettings, work: Path, env: dict[str, str], say) -> tuple[Path, float]:
    """Run ``arm``'s config uninterrupted; returns its root and wall seconds.

    Raises:
        RuntimeError: the run failed (with the tail of its output).
    """
    root = work / f"{arm}-reference"
    root.mkdir(parents=True, exist_ok=True)
    _write_train_file(s, work, arm)
    (work / f"{root.name}.yaml").write_text(yaml.safe_dump(tiny_config(s, root, arm)))
    t0 = time.monotonic()
    ref = RunProcess(work / f"{root.name}.yaml", env, work / f"{root.name}.log")
    ref.start()
    if ref.wait(timeout_s=1800) != 0:
        raise RuntimeError(f"the uninterrupted {arm} run failed:\n{ref.tail()}")
    seconds = time.monotonic() - t0
    say(f"[{arm}] uninterrupted run: {seconds:.0f} s")
    return root, seconds


def _run_arm(
    arm: str,
    moments: list[Moment],
    s: ChaosSettings,
    work: Path,
    env: dict[str, str],
    say,
    reference: tuple[Path, float] | None = None,
) -> ArmResult:
    """Run ``arm`` under chaos and check it against ``reference`` (root, seconds) or its own uninterrupted run."""
    result = ArmResult(arm)
    ref_root, result.reference_s = reference or _reference(arm, s, work, env, say)
    root = work / f"{arm}-chaos"
    root.mkdir(parents=True, exist_ok=True)
    _write_train_file(s, work, arm)
    (work / f"{root.name}.yaml").write_text(yaml.safe_dump(tiny_config(s, root, arm)))

    t0 = time.monotonic()
    run = RunProcess(work / f"{arm}-chaos.yaml", env, work / f"{arm}-chaos.log")
    max_delay_s = s.max_delay_s or result.reference_s / (2 * max(len(moments), 1))
    say(f"[{arm}] kills come U(0, {max_delay_s:.0f}) s after a job is seen alive")
    ledger = WorkLedger(run.log, root / RUN_ID, s.updates_per_stage)
    try:
        for m in moments:
            event = _kill_moment(run, m, max_delay_s, root / RUN_ID, s, result, ledger)
            if event is None:
                result.not_reached += 1
                event = f"moment {m.index:2d}: not reached (the run had completed)"
            else:
                result.killed += 1
            result.events.append(event)
            say(f"[{arm}] {event}")
            if s.data_edit and result.data_edit is None and result.killed and not run.running():
                _edit_data(result, run, train_file(work, arm), say)
        if s.data_edit and result.data_edit is None:  # no kill stopped the run: edit before the last (re)start
            if run.running():
                run.wait(timeout_s=1800)
            _edit_data(result, run, train_file(work, arm), say)
        if not run.running():
            run.start()
        code = run.wait(timeout_s=1800)
    finally:  # the run is in a session of its own: nothing else takes it down if the harness fails
        if run.running():
            kill([p.pid for p in process_tree(run.proc.pid)])
    result.completed = code == 0
    if not result.completed:
        say(f"[{arm}] final resume ended with {code}:\n{run.tail()}")
    result.chaos_s = time.monotonic() - t0
    result.check = check_run(root / RUN_ID, ref_root / RUN_ID, s.num_stages)
    say(f"[{arm}] {result.killed} kills, {run.starts} starts, {result.chaos_s:.0f} s; invariants ok: {result.check.ok}")
    return result


def _edit_data(result: ArmResult, run: RunProcess, train: Path, say) -> None:
    result.data_edit_refused, result.data_edit = _data_edit_moment(run, train)
    verdict = "refused as expected" if result.data_edit_refused else "NOT REFUSED"
    say(
        f"[{result.arm}] data edit: {train.name} reversed between a kill and the resume: {verdict} ({result.data_edit})"
    )


def run_chaos(
    s: ChaosSettings, work: Path | None = None, api_url: str | None = None, say: Callable[[str], None] = print
) -> ChaosReport:
    """Draw the moments, run each arm uninterrupted and under chaos, and check the invariants.

    Args:
        s: settings (model dir, data dir, moments, seed).
        work: folder for the runs and logs (default: a new temporary folder, kept).
        api_url: a running Prefect server's API URL (default: start one for the harness).
        say: progress sink (one line per moment).

    Raises:
        RuntimeError: an uninterrupted reference run failed, or the Prefect server did not start.
    """
    work = Path(work or tempfile.mkdtemp(prefix="mugrpo-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    moments = draw_moments(s)
    with _server(api_url, work) as url:
        # the run slot (flows/exclusive.py) of a SIGKILLed flow frees only after its >= 60 s lease: off here
        env = {**os.environ, "PREFECT_API_URL": url, "PYTHONUNBUFFERED": "1", "MUGRPO_RUN_SLOT": "off"}
        first = "warm" if "warm" in s.arms else s.arms[0]
        shared = _reference(first, s, work, env, say) if s.shared_reference else None
        arms = [_run_arm(a, [m for m in moments if m.arm == a], s, work, env, say, shared) for a in s.arms]
    return ChaosReport(s.seed, s.moments, arms)


@contextmanager
def _server(api_url: str | None, work: Path) -> Iterator[str]:
    if api_url is not None:
        yield api_url
        return
    home = work / "prefect-home"
    home.mkdir(exist_ok=True)
    with prefect_server(home) as url:
        yield url
