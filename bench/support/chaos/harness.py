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
... moments are **overlap moments**: instead of the delay they wait for the first instant the run is inside a
checkpoint overlap (stage k+1's policy committed and stage k not: stage k's train job finishing its checkpoint while
stage k+1's generation starts beside it, :mod:`mugrpo.execution.pipeline`), then pick a role the same way; its 2nd, 5th,
8th, ... are **waiting moments**: they wait for a pre-started job waiting at its start gate (``orchestration.
prestart_jobs``) and kill that job, the flow or the whole tree. Then the run is
resumed the way a user does it, by running ``mugrpo run CONFIG`` again, unless it is still going (a killed verifier
worker is replaced inside its job). Processes a killed job leaves behind (its verifier workers, which a pod would
take down with it) are killed before the resume.

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
"""

from __future__ import annotations

import json
import os
import random
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

from bench.support.chaos.invariants import RunCheck, check_run
from bench.support.chaos.procs import JOB_ROLES, ROLES, alive, cmdline, kill, process_tree, wait_gone
from mugrpo.cli.lifecycle import RESTART_HINT, RESUME_HINT  # the stop's printed hints (no Prefect import)

__all__ = [
    "ARM_ROLES",
    "QUICK",
    "STOP_SIGNALS",
    "ChaosReport",
    "ChaosSettings",
    "Moment",
    "StopCheck",
    "draw_moments",
    "in_overlap",
    "run_chaos",
    "tiny_config",
    "waiting_job",
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
    """The run's ``orchestration.stop_grace_s`` (its default): a stop must end the run within it."""


#: CI's quick mode (``bench/chaos.py --quick``, tests/e2e/test_chaos.py): 6 moments on a 2-stage run, the final policy
#: evaluated only, one shared reference run; it fits in 5 minutes on a quiet 2-core machine (docs/reliability.md).
QUICK = {"moments": 6, "num_stages": 2, "eval_every_stage": False, "shared_reference": True}


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

    @property
    def ok(self) -> bool:
        """Every promise held: exit code, grace, nothing left, lease released, resume printed."""
        return not self.problems


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
        return (
            self.resumed == self.moments
            and edits
            and stops
            and all(a.completed and a.check and a.check.ok for a in self.arms)
        )

    @property
    def summary(self) -> str:
        """``N/N resumed, 0 lost, 0 duplicated, weights equal``, or what differed."""
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
        problems = [f"  {a.arm}: {p}" for a in self.arms for p in (a.check.problems if a.check else ["no check"])]
        problems += [f"  {a.arm}: data edit NOT refused: {a.data_edit}" for a in edits if not a.data_edit_refused]
        problems += [
            f"  {a.arm}: moment {c.index}: {c.signal} to the {c.target}: {p}" for a in self.arms for c in a.stops
            for p in c.problems
        ]  # fmt: skip
        problems += [f"  {a.arm}: run did not complete" for a in self.arms if not a.completed]
        problems += [f"  {a.arm}: {a.not_reached} moments not reached" for a in self.arms if a.not_reached]
        return "\n".join([line, *problems])


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
            "checkpoint_every": 1,
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
        # retries 0: every kill of a job ends the flow, so every moment is followed by a user's resume
        "orchestration": {
            "retries": 0,
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
    the cold arm's 1st, 4th, 7th, ... moments wait for a checkpoint overlap (:data:`OVERLAP_EVERY`), its 2nd, 5th,
    8th, ... for a pre-started job waiting at its start gate; each arm's 3rd, 6th, 9th, ... are stop moments
    (``s.stops``), their signal and target in turn from :data:`STOP_SIGNALS`. The same seed gives the same moments
    (and the same delays and picks with or without stops)."""
    rng = random.Random(s.seed)
    moments = []
    for i in range(s.moments):
        arm = s.arms[i % len(s.arms)]
        ordinal = sum(m.arm == arm for m in moments)
        at = {0: "overlap", 1: "waiting"}.get(ordinal % OVERLAP_EVERY, "any") if arm == "cold" else "any"
        stop = None
        if s.stops and ordinal % OVERLAP_EVERY == OVERLAP_EVERY - 1:
            stop = STOP_SIGNALS[sum(m.stop is not None for m in moments) % len(STOP_SIGNALS)]
        moments.append(Moment(i, arm, rng.random(), rng.random(), at, stop))
    return moments


def waiting_job(tree: list, run_dir: Path) -> object | None:
    """A job process of ``tree`` waiting at its start gate (a pre-started job: some marker of its spec's
    ``start_after`` not committed yet, :mod:`mugrpo.coordination.start_gate`), or None."""
    for p in tree:
        if p.role not in JOB_ROLES:
            continue
        try:
            markers = json.loads(Path(cmdline(p.pid)[-1]).read_text()).get("start_after", [])
        except (OSError, IndexError, ValueError):
            continue
        if any(not (run_dir.parent / m).exists() for m in markers):
            return p
    return None


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
    run: RunProcess, m: Moment, max_delay_s: float, run_dir: Path, s: ChaosSettings, stops: list[StopCheck]
) -> str | None:
    """Kill per ``m``: ``m.delay * max_delay_s`` seconds after a job is seen alive, or (an overlap moment) once
    the run is inside a checkpoint overlap (:func:`in_overlap`). A stop moment signals the flow instead and appends
    its :class:`StopCheck` to ``stops``.

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
        stage = in_overlap(run_dir, num_stages) if m.at == "overlap" else None
        tree = process_tree(run.proc.pid) if run.running() else []
        if not tree:  # the flow exited before the moment
            if run.proc.wait() == 0:
                return None
            failures += 1
            if failures >= 3:
                raise RuntimeError(f"the run failed {failures} times without a kill:\n{run.tail()}")
            continue  # it failed on its own (kept in the log): resume, as a user would
        waiting = waiting_job(tree, run_dir) if m.at == "waiting" else None
        if m.at == "waiting" and waiting is None:
            continue  # it left the gate between the two looks: wait for the next one
        if m.stop is not None:
            check = _stop(run, m, tree, run_dir, s.stop_grace_s)
            if check is None:
                return None  # the run completed as the signal came
            stops.append(check)
            verdict = "clean" if check.ok else "; ".join(check.problems)
            doing = ", ".join(check.roles) or "no job"
            return (
                f"moment {m.index:2d}: {check.signal} to the {check.target} {delay_s:5.1f} s after a job was seen "
                f"({doing} running): exit {check.exit_code} after {check.seconds:.1f} s, {verdict}"
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
        if role != "verifier":
            run.wait(timeout_s=300)  # a killed job fails its task, and the flow (retries 0) exits
            kill([p.pid for p in tree if p.pid not in hit and alive(p.pid)])  # orphans (a pod takes them down)
        if m.at == "overlap":
            return f"moment {m.index:2d}: {role} (pid {hit[0]}) killed inside stage {stage}'s checkpoint overlap"
        if waiting is not None:
            what = "the waiting job" if role == waiting.role else f"while a {waiting.role} job waited at its gate"
            return f"moment {m.index:2d}: {role} (pid {hit[0]}) killed: {what}"
        return f"moment {m.index:2d}: {role} (pid {hit[0]}) killed {delay_s:5.1f} s after a job was seen"


def _stop(run: RunProcess, m: Moment, tree: list, run_dir: Path, grace_s: float) -> StopCheck | None:
    """Send the stop moment's signal to the flow's group or pid and check the promises of a stop (:mod:`tasks.stops`):
    exit code 128 + the signal within ``grace_s`` + :data:`STOP_SLACK_S`; no process of ``tree`` (the run's processes
    at the signal) alive 5 s later (a leftover is listed, then SIGKILLed so the harness goes on); the run lease
    (``_lease.json``) released; the resume command printed. Returns None when the run exited 0 (it completed before
    the signal took hold)."""
    name, target = m.stop
    sig = getattr(signal, name)
    roles = sorted({p.role for p in tree} & set(JOB_ROLES))
    check = StopCheck(m.index, name, target, roles)
    offset = run.log.stat().st_size
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
    try:
        for m in moments:
            event = _kill_moment(run, m, max_delay_s, root / RUN_ID, s, result.stops)
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
