"""Work lost per chaos moment: train updates and generation shards done before the moment that the run does again
after it (docs/reliability.md, "Work lost per moment").

What a moment throws away is only what its victims held in memory: committed files are never redone (the
invariants check that every rollout and every update is committed once). So the harness counts, for every job the
moment took down (SIGKILLed, stopped, or exited on its SIGTERM), the work it had done and not committed:

- **updates redone**: for a job training stage k (a cold ``train`` job, or a warm ``segment`` job), the stage's
  updates completed when the job went down less the stage update of the latest committed checkpoint after it (the
  update a re-run resumes from; the stage's ``updates_per_stage`` once its train manifest exists). Updates completed
  are read from the job's progress lines in the run's log (``train stage k: u/U updates``, one per update: the
  harness's stages have fewer than 10 updates, and the job prints a line per 10%). The update in flight is not
  counted (it was not completed: a SIGKILL loses part of it, a notice finishes it or drops it). Updates completed in
  a notice's grace and not saved count as redone too: they are trained again.
- **shards redone**: for a job sampling stage k (a cold ``generate`` job, or a ``segment`` job), 1 when the job had
  begun sampling and the stage still had uncommitted shards once the moment settled: the shard it was sampling is
  sampled again. Committed shards never are, and the shard a notice lets the job finish committing is kept. A
  segment job's sampling begins with its progress line ``generate stage k: starting  0s``; a cold generate job
  prints no line there, so its sampling counts as begun at its shard plan (``generate stage k: ... owns N (M already
  written)``), printed before it starts its verifier pool and loads its engine. Two biases, both of one shard at
  most: a cold generate job taken down while it loads its engine counts its first shard although it sampled none of
  it (an overcount), and a SIGKILL that cuts off the background commit of a sampled shard while the next one is
  sampled loses both but counts one (an undercount; a commit takes milliseconds).

A job that survives the moment (a verifier worker killed under it, an eval job's neighbour evicted) loses nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Loss", "WorkLedger", "committed_shards", "committed_updates", "job_stages", "preempted_records"]

#: A train progress line (``mugrpo.common.progress.PlainProgress``): ``train stage 1: 2/3 updates (67%) ...``.
PROGRESS = re.compile(r"train stage (\d+): (\d+)/(\d+) updates \(")
#: A generation worker's shard plan (``mugrpo.generation.worker``), printed before it loads its engine.
PLAN = re.compile(r"generate stage (\d+): \d+ prompts x G=\d+ in (\d+) shards; worker \d+ of \d+ owns (\d+) \((\d+) ")
#: A segment job's sampling of a stage begins (its own :class:`mugrpo.common.progress.TokenProgress` starts).
SAMPLING = re.compile(r"\[segment\] generate stage (\d+): starting\s+\d+s\s*$")
#: A stage's generation commit line.
GENERATED = re.compile(r"generate stage (\d+): \d+ rows from \d+ worker")
#: The stage in a job's spec path (``.../jobs/stage=k/train.spec.json``).
SPEC_STAGE = re.compile(r"/jobs/stage=(\d+)/")


def committed_updates(run_dir: Path, stage: int, total: int) -> int:
    """The stage update a re-run of ``stage``'s training resumes from: ``total`` once the stage's train manifest
    exists, else the step of the latest committed checkpoint (``checkpoints/stage=k/step=n/_COMPLETE``), else 0."""
    if (run_dir / "jobs" / f"stage={stage}" / "train.manifest.json").exists():
        return total
    steps = [0]
    for d in (run_dir / "checkpoints" / f"stage={stage}").glob("step=*"):
        m = re.fullmatch(r"step=(\d+)", d.name)
        if m and (d / "_COMPLETE").exists():
            steps.append(int(m.group(1)))
    return max(steps)


def committed_shards(run_dir: Path, stage: int) -> int:
    """Committed rollout shards of ``stage`` (``rollouts/stage=k/shard=NNNNN.parquet``; temporary files apart)."""
    return sum(1 for _ in (run_dir / "rollouts" / f"stage={stage}").glob("shard=*.parquet"))


def job_stages(role: str, argv: list[str], num_stages: int) -> tuple[set[int], set[int]]:
    """(stages it trains, stages it samples) of a job process from its role and command line: a ``train`` or
    ``generate`` job its spec's stage, a ``segment`` job every stage from its spec's on, an ``eval`` job none."""
    m = SPEC_STAGE.search(argv[-1] if argv else "")
    if m is None or role not in ("train", "generate", "segment"):
        return set(), set()
    k = int(m.group(1))
    if role == "segment":
        stages = set(range(k, num_stages))
        return stages, set(stages)
    return ({k}, set()) if role == "train" else (set(), {k})


def preempted_records(run_dir: Path, since: float) -> dict[int, dict]:
    """The ``jobs/stage=k/train.preempted.json`` records (:mod:`mugrpo.trainer.preemption`) written at or after the
    wall-clock time ``since``, by stage."""
    out = {}
    for f in run_dir.glob("jobs/stage=*/train.preempted.json"):
        try:
            if f.stat().st_mtime >= since - 1.0:  # the filesystem's timestamps are coarser than time.time()
                out[int(f.parent.name.split("=", 1)[1])] = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
    return out


@dataclass
class Loss:
    """What one moment threw away: completed updates and sampled shards the run does again (module docstring),
    with one note per stage that lost something."""

    updates: int = 0
    shards: int = 0
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """``lost 1 update(s), 0 shard(s) (train stage 0: 2 done, resumes from 1)``."""
        text = f"lost {self.updates} update(s), {self.shards} shard(s)"
        return f"{text} ({'; '.join(self.notes)})" if self.notes else text


class WorkLedger:
    """Follows the run's log (one file for all its (re)starts) and tells what a moment's dead jobs had done and not
    committed (module docstring).

    Per stage it keeps the last progress count of the stage's training and whether a generation job of the stage
    printed its shard plan. A line of a job that a moment took down is attributed to that moment only: the log is
    read up to the dead jobs' ends (the flow's line about each, when the flow goes on and retries them), then those
    stages are reset to what was committed when the moment settled, so a later moment does not count them again.
    """

    def __init__(self, log: Path, run_dir: Path, updates_per_stage: int) -> None:
        self.log, self.run_dir, self.total = log, run_dir, updates_per_stage
        self.offset = 0  # bytes of the log read (complete lines only)
        self.trained: dict[int, int] = {}
        self.sampling: dict[int, int] = {}  # stage -> its shards, while a job samples it
        self.planned: dict[int, int] = {}  # stage -> its shards, a segment job past its plan, not sampling yet

    def _tail(self, since: int) -> bytes:
        try:
            with self.log.open("rb") as f:
                f.seek(since)
                return f.read()
        except OSError:
            return b""

    def read(self, until: int | None = None) -> str:
        """Consume the log's complete lines from :attr:`offset` up to byte ``until`` (default: its end); returns
        them."""
        data = self._tail(self.offset)
        if until is not None:
            data = data[: max(until - self.offset, 0)]
        data = data[: data.rfind(b"\n") + 1]
        self.offset += len(data)
        text = data.decode(errors="replace")
        for line in text.splitlines():
            if m := PROGRESS.search(line):
                self.trained[int(m.group(1))] = int(m.group(2))
            elif m := PLAN.search(line):
                stage, shards, owned, written = (int(g) for g in m.groups())
                if owned > written:
                    (self.planned if "[segment]" in line else self.sampling)[stage] = shards
            elif (m := SAMPLING.search(line)) and int(m.group(1)) in self.planned:
                self.sampling[int(m.group(1))] = self.planned.pop(int(m.group(1)))
            elif m := GENERATED.search(line):
                self.sampling.pop(int(m.group(1)), None)
                self.planned.pop(int(m.group(1)), None)
        return text

    def lost(
        self,
        committed: dict[int, int],
        sample_stages: set[int],
        shards: dict[int, int] | None = None,
        until: int | None = None,
    ) -> Loss:
        """The work lost by dead jobs that trained the stages of ``committed`` (stage -> the stage update committed
        once they were gone, :func:`committed_updates`) and sampled ``sample_stages`` (``shards``: stage -> its
        shards committed then; default: now), their lines read up to byte ``until`` of the log (default: its end).
        Resets those stages to what was committed."""
        self.read(until)
        loss = Loss()
        for k, saved in sorted(committed.items()):
            done = self.trained.get(k, saved)
            if done > saved:
                loss.updates += done - saved
                loss.notes.append(f"train stage {k}: {done} done, resumes from {saved}")
            self.trained[k] = saved
        for k in sorted(sample_stages):
            total = self.sampling.pop(k, None)
            self.planned.pop(k, None)
            have = (shards or {}).get(k, committed_shards(self.run_dir, k))
            if total is not None and have < total:
                loss.shards += 1
                loss.notes.append(f"generate stage {k}: the shard in flight")
        return loss

    def wait_for(self, needles: tuple[str, ...], since: int, timeout_s: float, alive=None) -> tuple[str, int] | None:
        """The first line of the log from byte ``since`` on that contains one of ``needles``, and the byte offset of
        its end, waiting for it up to ``timeout_s`` seconds while ``alive()`` (default: always) holds; None if none
        came."""
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            data = self._tail(since)
            pos = 0
            for raw in data[: data.rfind(b"\n") + 1].splitlines(keepends=True):
                pos += len(raw)
                line = raw.decode(errors="replace")
                if any(n in line for n in needles):
                    return line.rstrip("\n"), since + pos
            if time.monotonic() > deadline or (alive is not None and not alive()):
                return None
            time.sleep(0.05)

    def text(self, since: int, until: int | None = None) -> str:
        """The log from byte ``since`` to byte ``until`` (default: its end)."""
        data = self._tail(since)
        return data[: None if until is None else max(until - since, 0)].decode(errors="replace")
