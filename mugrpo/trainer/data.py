"""The trainer's data source: committed rollouts read through the generation job's manifest, and a deterministic
order of minibatches over them.

Minibatch order (docs/design.md, "Resume semantics": same seed -> same data order): the sampling units (single
responses, or whole groups with ``group_minibatches``) are shuffled once per epoch with a permutation seeded by
(seed, epoch), and each epoch is cut into ``len(units) // units_per_update`` minibatches (the remainder of an
epoch is left out, like ``drop_last``; a different remainder each epoch). Update ``u`` therefore draws a
minibatch that is a pure function of ``(seed, u)``: the data cursor of a checkpoint is just the number of updates
done plus a fingerprint of the rollout set that checks the data did not change under a resume.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mugrpo.algorithms import declared_columns, excluded, excluding_columns
from mugrpo.commits.manifest import read_job_manifest
from mugrpo.commits.tables import RolloutDataError, read_table
from mugrpo.losses import ROLLOUT_INPUTS, RowFn
from mugrpo.policy.truncation import Truncation
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store

#: Rollout columns the trainer reads, besides the algorithms' declared columns and what the loss's rollout inputs read.
ROLLOUT_COLUMNS = [
    "stage",
    "policy_version",
    "prompt_id",
    "sample_idx",
    "prompt_token_ids",
    "response_token_ids",
    "behavior_logprobs",
    "num_tokens",
    "reward",
    "reward_components",
    "advantage",
    "zero_variance",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
]


@dataclass(frozen=True)
class Rollout:
    """One response of a group, as the trainer needs it.

    ``temperature`` is the temperature of the distribution the behavior log-probs are log-probs of: the
    sampling temperature, or 1.0 for greedy rollouts (T = 0), whose engines report the T = 1 policy
    (:mod:`mugrpo.engines.base`). ``truncation`` is the min-p / top-k / top-p the engine sampled with (none for
    greedy rows); the trainer computes its log-probs under the same truncation (:mod:`mugrpo.policy.truncation`).
    ``sampler_logprobs`` keeps the engine's log-probs when a stage-start recompute replaced ``behavior_logprobs``
    (the health panel measures the importance weights against the sampler). ``columns`` holds the row's values of
    the algorithms' declared columns (:attr:`mugrpo.algorithms.Algorithm.columns`, NULL as None), ``inputs`` the
    loss's rollout inputs computed from the row (:mod:`mugrpo.losses.inputs`), both by name.
    """

    stage: int
    policy_version: int
    prompt_id: str
    sample_idx: int
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    behavior_logprobs: list[float]
    reward: float
    advantage: float
    temperature: float
    truncation: Truncation = Truncation()
    zero_variance: bool = False  # the row's group has equal rewards (the estimator's ``zero_variance`` flag)
    columns: Mapping[str, Any] = field(default_factory=dict)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    #: Sampled greedily (stored temperature 0): ``train.learner_temperature`` leaves such rows at T = 1.
    greedy: bool = False
    #: The engine's log-probs of the response when ``behavior_logprobs`` were replaced by the trainer's recompute
    #: (``train.recompute_behavior_logprobs``); None: ``behavior_logprobs`` are the engine's.
    sampler_logprobs: list[float] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.response_token_ids)


@dataclass
class RolloutSet:
    """The rollouts of the stages a training job draws from, sorted by (stage, prompt_id, sample_idx).

    Attributes:
        rollouts: kept rollouts.
        groups: row indices of each group (one prompt of one stage), in rollout order.
        fingerprint: sha256 over the manifests' file checksums and the filter: identifies the data of a resume.
        counts: rows_read, groups_read, zero_variance_groups_dropped, rows, groups.
    """

    rollouts: list[Rollout]
    groups: list[list[int]]
    fingerprint: str
    counts: dict[str, int] = field(default_factory=dict)


def _row_error(where: str, row: dict, message: str) -> RolloutDataError:
    return RolloutDataError(
        f"{where}: rollout prompt_id={row['prompt_id']!r} sample_idx={row['sample_idx']}: {message}"
    )


def _f32(value: float) -> float:
    """The shortest decimal of a float32 column value (0.8999999761581421 -> 0.9): the value the engine was given."""
    return float(str(np.float32(value)))


def _to_rollout(
    row: dict, where: str, row_inputs: Mapping[str, RowFn] | None = None, columns: Sequence[str] = ()
) -> Rollout:
    """Validate one rollout row (lengths, finiteness) and convert it, with its declared ``columns`` and each of
    ``row_inputs`` applied to it."""
    response, logprobs = row["response_token_ids"], row["behavior_logprobs"]
    if not len(response) == len(logprobs) == row["num_tokens"]:
        raise _row_error(
            where,
            row,
            f"{len(response)} response tokens, {len(logprobs)} behavior log-probs and num_tokens={row['num_tokens']} "
            "must be equal",
        )
    if not row["prompt_token_ids"]:
        raise _row_error(where, row, "empty prompt_token_ids")
    bad = [i for i, v in enumerate(logprobs) if not math.isfinite(v)]
    if bad:
        raise _row_error(where, row, f"behavior_logprobs must be finite; not at token positions {bad[:5]}")
    for name in ("advantage", "reward"):
        if not math.isfinite(row[name]):
            raise _row_error(where, row, f"{name} is {row[name]}")
    temperature = float(row["temperature"])
    if not temperature >= 0:
        raise _row_error(where, row, f"temperature {temperature} is negative")
    inputs = {}
    for name, fn in (row_inputs or {}).items():
        try:
            inputs[name] = fn(row)
        except ValueError as e:
            raise _row_error(where, row, f"loss input {name!r}: {e}") from None
    try:
        truncation = Truncation(top_p=_f32(row["top_p"]), top_k=int(row["top_k"]), min_p=_f32(row["min_p"]))
    except ValueError as e:
        raise _row_error(where, row, str(e)) from None
    return Rollout(
        stage=row["stage"],
        policy_version=row["policy_version"],
        prompt_id=row["prompt_id"],
        sample_idx=row["sample_idx"],
        prompt_token_ids=list(row["prompt_token_ids"]),
        response_token_ids=list(response),
        behavior_logprobs=list(logprobs),
        reward=float(row["reward"]),
        advantage=float(row["advantage"]),
        temperature=temperature if temperature > 0 else 1.0,
        truncation=truncation if temperature > 0 else Truncation(),  # greedy rows are never truncated
        zero_variance=bool(row["zero_variance"]),
        columns={name: row[name] for name in columns},
        inputs=inputs,
        greedy=temperature == 0,
    )


def load_rollouts(
    store: Store,
    run_id: str,
    stages: list[int],
    *,
    skip_zero_variance_groups: bool,
    row_inputs: Mapping[str, RowFn] | None = None,
) -> RolloutSet:
    """Read the committed rollouts of ``stages`` through each stage's generation job manifest.

    Each of ``row_inputs`` (the loss's rollout inputs, :func:`mugrpo.losses.row_inputs`) is applied to every row
    (``Rollout.inputs``); their rules are part of the data fingerprint. The algorithms' declared columns are read
    into ``Rollout.columns``.

    Rows a declared ``excludes`` column marks (:func:`mugrpo.algorithms.excluded`: e.g. a group sampled to plan a
    shard) are never trained on: they are left out here (counted as ``excluded_rows``).

    Every file is checked against the sha256 the manifest recorded and against the rollout schema and version
    (:func:`mugrpo.commits.tables.read_table`).

    Raises:
        RolloutDataError: a stage's generation job has not committed, a row is invalid (named by file, prompt_id
            and sample_idx), or no rollout is left to train on.
        mugrpo.commits.tables.SchemaError: a file is not a rollout table of the supported schema version.
        mugrpo.storage.store.ChecksumError: a file changed after the manifest was written.
    """
    layout = RunLayout(run_id)
    rows: list[tuple[dict, str]] = []
    row_inputs = dict(row_inputs or {})
    digest = hashlib.sha256(f"skip_zero_variance_groups={skip_zero_variance_groups}".encode())
    for fn in row_inputs.values():
        digest.update(fn.describe().encode())
    fields = [c.field for c in declared_columns()]
    declared = [f.name for f in fields]
    read_by_inputs = [c for n in row_inputs for c in ROLLOUT_INPUTS[n].columns]
    wanted = list(dict.fromkeys(ROLLOUT_COLUMNS + declared + read_by_inputs))
    for stage in sorted(set(stages)):
        manifest = read_job_manifest(store, run_id, stage, "generate")
        if manifest is None:
            raise RolloutDataError(
                f"stage {stage}: the generation job has not committed "
                f"({store.uri(layout.job_manifest(stage, 'generate'))} does not exist)"
            )
        owner = RunLayout(manifest.run_id)  # a fork's inherited stage: the parent's manifest, paths in its run
        prefix = owner.rel(owner.rollouts_dir(stage)) + "/"
        for record in sorted(manifest.files, key=lambda r: r.path):
            if not record.path.startswith(prefix):
                continue
            rel = owner.abs(record.path)
            table = read_table(store, rel, "rollouts", expected_sha256=record.sha256, extra=fields)
            digest.update(f"{record.path}:{record.sha256}".encode())
            where = store.uri(rel)
            rows.extend((row, where) for row in table.select(wanted).to_pylist())
    excluding = excluding_columns()
    excluded_rows = sum(1 for row, _ in rows if excluded(row, excluding))
    rows = [(row, where) for row, where in rows if not excluded(row, excluding)]
    rows.sort(key=lambda item: (item[0]["stage"], item[0]["prompt_id"], item[0]["sample_idx"]))

    by_group: dict[tuple[int, str], list[tuple[dict, str]]] = {}
    for row, where in rows:
        by_group.setdefault((row["stage"], row["prompt_id"]), []).append((row, where))
    rollouts: list[Rollout] = []
    groups: list[list[int]] = []
    dropped = 0
    for members in by_group.values():
        if skip_zero_variance_groups and all(row["zero_variance"] for row, _ in members):
            dropped += 1
            continue
        start = len(rollouts)
        rollouts.extend(_to_rollout(row, where, row_inputs, declared) for row, where in members)
        groups.append(list(range(start, len(rollouts))))
    counts = {
        "rows_read": len(rows),
        "excluded_rows": excluded_rows,
        "groups_read": len(by_group),
        "zero_variance_groups_dropped": dropped,
        "rows": len(rollouts),
        "groups": len(groups),
    }
    return RolloutSet(rollouts, groups, digest.hexdigest(), counts)


def update_statistics(rollouts: Sequence[Rollout], group_index: Sequence[int]) -> dict[str, float]:
    """The update statistics of the rollout inputs the rollouts carry (:attr:`RolloutInput.update_stats`, e.g.
    ConSPO's count of valid groups), over a whole update's ``rollouts`` (every rank's) with their group ids: known
    before the forward pass. {} when they carry none."""
    stats: dict[str, float] = {}
    nonempty = [r.num_tokens > 0 for r in rollouts]
    for name in rollouts[0].inputs if rollouts else ():
        values = [r.inputs[name] for r in rollouts]
        for stat, fn in ROLLOUT_INPUTS[name].update_stats.items():
            stats[stat] = float(fn(values, list(group_index), nonempty))
    return stats


class MinibatchOrder:
    """Which rollouts update ``u`` trains on: a pure function of (seed, u) (see the module docstring).

    Args:
        units: the sampling units, each a list of rollout indices (one index per unit, or one group per unit).
        units_per_update: units per minibatch; capped at ``len(units)`` (then every update sees all the data).
        seed: the data-order seed.

    Raises:
        RolloutDataError: no units.
    """

    def __init__(self, units: list[list[int]], units_per_update: int, seed: int):
        if not units:
            raise RolloutDataError("no rollouts to train on")
        self.units = units
        self.units_per_update = max(1, min(units_per_update, len(units)))
        self.minibatches_per_epoch = len(units) // self.units_per_update
        self.seed = seed

    def _permutation(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
        return rng.permutation(len(self.units))

    def position(self, update: int) -> tuple[int, int]:
        """(epoch, minibatch index within the epoch) of 0-based update ``update``."""
        return divmod(update, self.minibatches_per_epoch)

    def minibatch(self, update: int) -> list[int]:
        """Rollout indices of 0-based update ``update``, units in drawn order."""
        epoch, index = self.position(update)
        perm = self._permutation(epoch)
        chosen = perm[index * self.units_per_update : (index + 1) * self.units_per_update]
        return [i for unit in chosen.tolist() for i in self.units[unit]]


def make_minibatch_order(
    data: RolloutSet, *, rollouts_per_update: int, group_minibatches: bool, seed: int
) -> MinibatchOrder:
    """The minibatch order of a training job.

    With ``group_minibatches`` the units are whole groups and a minibatch holds
    ``max(1, rollouts_per_update // G)`` groups (G the largest group size), as group-wise losses need
    (:attr:`mugrpo.losses.LossRequirements.whole_groups`); otherwise the units are single responses.
    """
    if group_minibatches:
        largest = max((len(g) for g in data.groups), default=1)
        return MinibatchOrder(data.groups, max(1, rollouts_per_update // largest), seed)
    return MinibatchOrder([[i] for i in range(len(data.rollouts))], rollouts_per_update, seed)


def split_minibatch(
    indices: list[int],
    data: RolloutSet,
    *,
    micro_batch_size: int,
    rank: int,
    world_size: int,
    keep_groups: bool,
) -> list[list[int]]:
    """This process's micro-batches of a minibatch.

    Rows (or whole groups with ``keep_groups``) are dealt to the ``world_size`` data-parallel ranks round-robin,
    then cut into micro-batches of at most ``micro_batch_size`` responses; with ``keep_groups`` a micro-batch
    holds whole groups (at least one), so a group-wise loss sees each group at once.

    Raises:
        RolloutDataError: fewer units than ranks (a rank would have nothing to back-propagate).
    """
    if keep_groups:
        group_of = {i: gi for gi, group in enumerate(data.groups) for i in group}
        units: list[list[int]] = []
        for i in indices:
            if units and group_of[units[-1][-1]] == group_of[i]:
                units[-1].append(i)
            else:
                units.append([i])
    else:
        units = [[i] for i in indices]
    if len(units) < world_size:
        raise RolloutDataError(f"a minibatch of {len(units)} units cannot be split over {world_size} processes")
    mine = units[rank::world_size]
    micro: list[list[int]] = []
    for unit in mine:
        if micro and len(micro[-1]) + len(unit) <= micro_batch_size:
            micro[-1].extend(unit)
        else:
            micro.append(list(unit))
    return micro
