"""What a run holds in storage, per stage, and what it will hold at its configured number of stages (``mugrpo
status``). Read from one recursive listing of the run's folder (file names and sizes): no file is opened."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from mugrpo.commits.retention import OPTIMIZER_FILES, describe, kept_stages
from mugrpo.storage.store import Store

#: The columns of a stage's bytes, in the order ``mugrpo status`` shows them.
KINDS = ("policies", "weights", "optimizer", "rollouts", "other")
_STAGE = re.compile(r"stage=(\d+)(?:\.json)?$")


@dataclass
class Bytes:
    """Bytes of one stage (or of the run as a whole) by kind: the policy it published (``policies/stage=k+1``), its
    checkpoints' weights (``model/``) and optimizer state (AdamW moments), its rollouts, and every other file (job
    specs and manifests, train_steps, evaluations, the checkpoints' small files, algorithms' state)."""

    policies: int = 0
    weights: int = 0
    optimizer: int = 0
    rollouts: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, k) for k in KINDS)

    def add(self, other: Bytes) -> None:
        for k in KINDS:
            setattr(self, k, getattr(self, k) + getattr(other, k))


@dataclass
class StorageUse:
    """What :func:`storage_use` found; every figure in bytes.

    Attributes:
        stages: the bytes of each stage 0..K-1 that holds any (what stage k wrote: its rollouts, checkpoints, the
            policy it published, its manifests and evaluation).
        run: the rest: run.json, the initial policy, the final evaluation (stage K), the report.
        own_stages: the stages the run computes itself (a fork's start at its fork stage: the stages below are its
            parent's, stored in the parent's folder and not counted here).
        committed: the run's own committed stages, which the projection averages.
        retention: ``train.keep_optimizer_state`` as it applies (``auto`` resolved by the optimizer state measured).
        per_stage: the average bytes of a committed stage without its optimizer state (None: none committed).
        optimizer_per_stage: the average optimizer state of the stages that still hold theirs (0 when none does).
        kept: the stages that hold optimizer state at the end of the run under the retention.
        projected: the run's bytes once all its stages are committed (None: none committed yet):
            ``run + per_stage x stages + optimizer_per_stage x kept``.
        pruned: what the retention deletes over the whole run: ``optimizer_per_stage x (stages - kept)``.
    """

    stages: dict[int, Bytes]
    run: Bytes
    own_stages: range
    committed: list[int]
    retention: str
    per_stage: int | None = None
    optimizer_per_stage: int = 0
    kept: int = 0
    projected: int | None = None
    pruned: int = 0
    total: Bytes = field(default_factory=Bytes)


def _place(rel: str, num_stages: int) -> tuple[int | None, str]:
    """(stage or None for the run, kind) of the run-relative path ``rel``."""
    parts = rel.split("/")
    stage = next((int(m.group(1)) for p in parts if (m := _STAGE.match(p))), None)
    top = parts[0]
    kind = "other"
    if top == "policies" and stage is not None:
        kind, stage = "policies", (stage - 1 if stage > 0 else None)  # stage k-1's training published it
    elif top == "rollouts":
        kind = "rollouts"
    elif top == "checkpoints" and len(parts) >= 4:  # checkpoints/stage=k/step=n/...
        if len(parts) == 4 and parts[3] in OPTIMIZER_FILES:
            kind = "optimizer"
        elif len(parts) > 4 and parts[3] == "model":
            kind = "weights"
    if stage is not None and stage >= num_stages:
        stage = None  # the final evaluation (stage K) belongs to the run
    return stage, kind


def list_sizes(store: Store, rel: str) -> dict[str, int]:
    """{path relative to ``rel``: bytes} of every file under the folder ``rel``, from one recursive listing
    (fsspec ``find``: a walk locally, paged LIST requests on S3); {} when it does not exist."""
    root = store.full(rel).rstrip("/")
    try:
        found: dict[str, Any] = store.fs.find(root, detail=True)
    except FileNotFoundError:
        return {}
    out = {}
    for path, info in found.items():
        if info.get("type", "file") != "file":
            continue
        if path.startswith(root + "/"):
            out[path[len(root) + 1 :]] = int(info.get("size") or 0)
    return out


def storage_use(store: Store, cfg: Any, committed: list[int]) -> StorageUse:
    """The bytes run ``cfg`` holds per stage (:class:`Bytes`), and the projected total for its configured number of
    stages (``run.num_stages``; units: bytes), from one listing of its folder (:func:`list_sizes`).

    ``committed``: the stages with a stage manifest. The projection averages the run's own committed stages: their
    bytes without optimizer state times the stages, plus the optimizer state of the stages that keep it at the end
    under ``train.keep_optimizer_state`` (``auto`` resolved from the optimizer state measured, as the pruning
    does); :attr:`StorageUse.pruned` is what the retention deletes over the run. With
    ``orchestration.publish_policy_every`` > 1 the latest stage's checkpoint alone is kept (older ones go whole).
    """
    num_stages = cfg.run.num_stages
    stages: dict[int, Bytes] = {}
    run = Bytes()
    for rel, size in list_sizes(store, cfg.layout.run_dir).items():
        stage, kind = _place(rel, num_stages)
        target = run if stage is None else stages.setdefault(stage, Bytes())
        setattr(target, kind, getattr(target, kind) + size)
    first = cfg.run.parent.stage if cfg.run.parent is not None else 0
    own = range(first, num_stages)
    done = sorted(k for k in committed if k in own)
    setting = cfg.train.keep_optimizer_state
    holders = [stages[k].optimizer for k in done if k in stages and stages[k].optimizer > 0]
    optimizer = round(mean(holders)) if holders else 0
    retention, every = describe(setting, optimizer or None), cfg.orchestration.publish_policy_every
    keep = kept_stages(setting, optimizer or None) if every == 1 else 1
    if every > 1:  # the latest stage's checkpoint only, as the pruning of commit_stage leaves it
        retention = f"orchestration.publish_policy_every={every} (older stages' checkpoints deleted whole)"
    kept = len(own) if keep is None else min(keep, len(own))
    use = StorageUse(
        stages=dict(sorted(stages.items())),
        run=run,
        own_stages=own,
        committed=done,
        retention=retention,
        optimizer_per_stage=optimizer,
        kept=kept,
    )
    for b in (*stages.values(), run):
        use.total.add(b)
    if done:
        use.per_stage = round(mean((stages[k].total - stages[k].optimizer) if k in stages else 0 for k in done))
        use.projected = run.total + use.per_stage * len(own) + optimizer * kept
        use.pruned = optimizer * (len(own) - kept)
    return use


def human(n: int | None) -> str:
    """Bytes in decimal units: ``512 B``, ``61.2 MB``, ``1.62 GB``; ``-`` for None."""
    if n is None:
        return "-"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.{2 if n < 10 * scale else 1}f} {unit}"
    return f"{n} B"
