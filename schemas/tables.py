"""Arrow schemas for the rollout, train-step and eval tables (docs/design.md, "The rollout row")."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import pyarrow as pa

META_TABLE = b"mugrpo.table"
META_VERSION = b"mugrpo.schema_version"

_ts = pa.timestamp("us", tz="UTC")

#: One row per sampled response. A group (all G samples of one prompt) never spans two shards.
ROLLOUT_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("stage", pa.int32(), nullable=False),
        pa.field("policy_version", pa.int64(), nullable=False),  # optimizer updates before generation
        pa.field("prompt_id", pa.string(), nullable=False),  # content hash of the prompt row
        pa.field("sample_idx", pa.int32(), nullable=False),  # 0..G-1 within the group
        pa.field("group_size", pa.int32(), nullable=False),
        pa.field("prompt_text", pa.string(), nullable=False),
        pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_text", pa.string(), nullable=False),
        pa.field("response_token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("behavior_logprobs", pa.list_(pa.float32()), nullable=False),  # one per response token
        pa.field("finish_reason", pa.string(), nullable=False),  # "stop" | "length"
        pa.field("num_tokens", pa.int32(), nullable=False),  # response tokens
        pa.field("reward", pa.float32(), nullable=False),
        pa.field("reward_components", pa.map_(pa.string(), pa.float32()), nullable=False),
        pa.field("reward_status", pa.string(), nullable=False),  # "ok" | "timeout" | "error: ..."
        pa.field("ground_truth", pa.string(), nullable=False),
        pa.field("extracted_answer", pa.string()),
        pa.field("advantage", pa.float32(), nullable=False),  # group-normalized
        pa.field("zero_variance", pa.bool_(), nullable=False),  # all rewards of the group equal
        pa.field("temperature", pa.float32(), nullable=False),
        pa.field("top_p", pa.float32(), nullable=False),
        pa.field("top_k", pa.int32(), nullable=False),  # 0 = off (v2)
        pa.field("min_p", pa.float32(), nullable=False),  # 0 = off (v2)
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("engine", pa.string(), nullable=False),
        pa.field("created_at", _ts, nullable=False),
        # v3 (AGPO, arXiv 2605.20722); NULL in v1/v2 files and, except is_probe, in runs without AGPO.
        pa.field("is_probe", pa.bool_()),  # a probe response: sampled at tau_base, scored, never trained on
        pa.field("probe_sigma", pa.float64()),  # the prompt's probe reward dispersion
        pa.field("probe_vote_entropy", pa.float64()),  # the prompt's probe vote entropy E (nats)
        pa.field("probe_skew", pa.float64()),  # the prompt's probe skew k3 (clamped to +-10)
        pa.field("agpo_u", pa.float64()),  # U = w_r sigma + w_e E + w_k |k3|
        pa.field("agpo_c", pa.float64()),  # c = (U - EMA) / (EMA + 1e-8); the row's temperature is tau(c)
        # v4 (reasoning-gym, mugrpo.data.gym); NULL in v1-v3 files and for problems read from a file.
        pa.field("task", pa.string()),  # the reasoning-gym task that generated the prompt
        pa.field("task_metadata", pa.string()),  # the task entry's metadata as JSON (difficulty, expression...)
    ]
)


#: One row per optimizer update.
TRAIN_STEP_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("stage", pa.int32(), nullable=False),
        pa.field("update", pa.int64(), nullable=False),  # global optimizer update index (1-based, after the step)
        pa.field("stage_update", pa.int64(), nullable=False),  # update index within the stage (1-based)
        pa.field("policy_loss", pa.float64(), nullable=False),
        pa.field("loss", pa.float64(), nullable=False),
        pa.field("clip_frac_low", pa.float64()),
        pa.field("clip_frac_high", pa.float64()),
        pa.field("veto_token_frac", pa.float64()),
        pa.field("veto_response_frac", pa.float64()),
        pa.field("trigger_count", pa.float64()),
        pa.field("ratio_mean", pa.float64()),
        pa.field("ratio_max", pa.float64()),
        pa.field("ratio_mean_neg_adv", pa.float64()),  # E[ratio | A<0]
        pa.field("approx_kl_behavior", pa.float64()),
        pa.field("kl_ref", pa.float64()),
        pa.field("entropy", pa.float64()),
        pa.field("grad_norm", pa.float64(), nullable=False),
        pa.field("lr", pa.float64(), nullable=False),
        pa.field("num_sequences", pa.int64(), nullable=False),
        pa.field("num_tokens", pa.int64(), nullable=False),  # response tokens in the update
        pa.field("seconds", pa.float64(), nullable=False),
        pa.field("tokens_per_second", pa.float64(), nullable=False),
        pa.field("staleness", pa.int64(), nullable=False),  # updates since the rollouts' behavior policy
        pa.field("mean_reward", pa.float64()),
        pa.field("created_at", _ts, nullable=False),
        # v2: every other metric of the loss (e.g. ConSPO's conspo_valid_groups), name -> value; NULL in v1 files.
        pa.field("loss_metrics", pa.map_(pa.string(), pa.float64())),
        # v3: the replay buffer (arXiv 2606.04560); NULL when replay is off and in v1/v2 files.
        pa.field("num_fresh", pa.int64()),  # this update's fresh rollouts
        pa.field("num_replayed", pa.int64()),  # replayed rollouts drawn from the buffer
        pa.field("replay_age_mean", pa.float64()),  # mean age (updates) of the replayed rollouts
        pa.field("replay_age_max", pa.int64()),
        pa.field("replay_buffer_size", pa.int64()),  # entries eligible for the draw (after eviction, before insert)
        pa.field("replay_evicted_age", pa.int64()),  # evicted before this update's draw (age > tau_max)
        pa.field("replay_evicted_capacity", pa.int64()),  # evicted by the FIFO capacity at this update's insert
        # v4: the health panel (docs/sql.md, "Health panel"); NULL in v1-v3 files. w = pi_theta / q per response
        # token, q the sampler's log-probs as the engine reported them (not the stage-start recompute).
        pa.field("ess", pa.float64()),  # (sum w)^2 / (N sum w^2), in (0, 1] (Kong 1992; arXiv 2602.17616)
        pa.field("kl_sampler", pa.float64()),  # KL(q || pi_theta), k3 estimator on the sampled tokens
        pa.field("sampler_ratio_p1", pa.float64()),  # 1st percentile of w
        pa.field("sampler_ratio_p99", pa.float64()),  # 99th percentile of w
        pa.field("sampler_ratio_max", pa.float64()),
        pa.field("sampler_clip_frac", pa.float64()),  # w outside the loss's clip range; NULL: the loss has none
        pa.field("logit_var", pa.float64()),  # mean raw-logit variance over the vocabulary (arXiv 2609.11956)
        pa.field("s_eta", pa.float64()),  # staleness * lr (arXiv 2607.01083)
        pa.field("t_eta", pa.float64()),  # sum of lr over the run's updates 1..update (arXiv 2607.01083)
        pa.field("batch_id", pa.string()),  # sha256[:16] of the update's sorted rollout keys stage/prompt_id/sample_idx
    ]
)

#: Columns added to train_steps in version 3.
TRAIN_STEP_V3_COLUMNS = (
    "num_fresh",
    "num_replayed",
    "replay_age_mean",
    "replay_age_max",
    "replay_buffer_size",
    "replay_evicted_age",
    "replay_evicted_capacity",
)
#: Columns added to train_steps in version 4: the health panel, filled by the trainer (mugrpo.trainer.health).
TRAIN_STEP_V4_COLUMNS = (
    "ess",
    "kl_sampler",
    "sampler_ratio_p1",
    "sampler_ratio_p99",
    "sampler_ratio_max",
    "sampler_clip_frac",
    "logit_var",
    "s_eta",
    "t_eta",
    "batch_id",
)
#: train_steps version 3 = version 4 without the health panel (read as NULL).
TRAIN_STEP_SCHEMA_V3 = pa.schema([f for f in TRAIN_STEP_SCHEMA if f.name not in TRAIN_STEP_V4_COLUMNS])
#: train_steps version 2 = version 3 without the replay columns (read as NULL).
TRAIN_STEP_SCHEMA_V2 = pa.schema([f for f in TRAIN_STEP_SCHEMA_V3 if f.name not in TRAIN_STEP_V3_COLUMNS])
#: train_steps version 1 = version 2 without ``loss_metrics`` (read as NULL).
TRAIN_STEP_SCHEMA_V1 = pa.schema([f for f in TRAIN_STEP_SCHEMA_V2 if f.name != "loss_metrics"])

#: One row per rollout used by an update (fresh or replayed) of a run with the replay buffer: the audit of which
#: rollout was used by which update (the ``replay`` SQL view).
REPLAY_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("stage", pa.int32(), nullable=False),  # the stage whose update used the rollout
        pa.field("update", pa.int64(), nullable=False),  # global optimizer update (1-based)
        pa.field("stage_update", pa.int64(), nullable=False),
        pa.field("rollout_stage", pa.int32(), nullable=False),  # the rollout's reference: stage, prompt, sample
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("sample_idx", pa.int32(), nullable=False),
        pa.field("replayed", pa.bool_(), nullable=False),  # False: one of the update's fresh rollouts
        pa.field("birth_update", pa.int64(), nullable=False),  # policy_version of the rollout
        pa.field("age", pa.int64(), nullable=False),  # update - 1 - birth_update
        pa.field("advantage", pa.float64(), nullable=False),  # frozen at birth
        pa.field("priority", pa.float64()),  # (|A| + eps)^alpha; NULL for fresh rows
    ]
)

#: One row per evaluation sample.
EVAL_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("stage", pa.int32(), nullable=False),  # policy of stage k (stage=K is the final policy)
        pa.field("benchmark", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("sample_idx", pa.int32(), nullable=False),
        pa.field("k", pa.int32(), nullable=False),
        pa.field("prompt_text", pa.string(), nullable=False),
        pa.field("response_text", pa.string(), nullable=False),
        pa.field("num_tokens", pa.int32(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("ground_truth", pa.string(), nullable=False),
        pa.field("extracted_answer", pa.string()),
        pa.field("correct", pa.bool_(), nullable=False),
        pa.field("reward_status", pa.string(), nullable=False),
        pa.field("temperature", pa.float32(), nullable=False),
        pa.field("top_p", pa.float32(), nullable=False),
        pa.field("created_at", _ts, nullable=False),
        # v2 (reasoning-gym benchmarks); NULL in v1 files and for benchmarks read from a file.
        pa.field("task", pa.string()),
        pa.field("task_metadata", pa.string()),  # JSON
    ]
)

TABLES: dict[str, pa.Schema] = {
    "rollouts": ROLLOUT_SCHEMA,
    "train_steps": TRAIN_STEP_SCHEMA,
    "evals": EVAL_SCHEMA,
    "replay": REPLAY_SCHEMA,
}

#: Current version of each table's schema. Readers accept exactly these versions.
#: rollouts v2: + top_k, min_p (the trainer replays the engine's truncation, mugrpo.policy.truncation); v3: + the AGPO
#: probe columns (is_probe, probe statistics, U, c); v4: + task, task_metadata (reasoning-gym problems).
#: train_steps v2: + loss_metrics (a loss's own metrics, e.g. ConSPO's); v3: + the replay-buffer columns; v4: + the
#: health panel (ess, kl_sampler, sampler ratio percentiles, sampler_clip_frac, logit_var, s_eta, t_eta, batch_id).
#: evals v2: + task, task_metadata.
SCHEMA_VERSIONS: dict[str, int] = {"rollouts": 4, "train_steps": 4, "evals": 2, "replay": 1}

_AGPO_COLUMNS = {"is_probe", "probe_sigma", "probe_vote_entropy", "probe_skew", "agpo_u", "agpo_c"}
_TASK_COLUMNS = {"task", "task_metadata"}
#: rollouts version 3 = version 4 without the task columns (read as NULL).
ROLLOUT_SCHEMA_V3 = pa.schema([f for f in ROLLOUT_SCHEMA if f.name not in _TASK_COLUMNS])
#: rollouts version 2 = version 3 without the AGPO columns (read as NULL; is_probe NULL means not a probe).
ROLLOUT_SCHEMA_V2 = pa.schema([f for f in ROLLOUT_SCHEMA_V3 if f.name not in _AGPO_COLUMNS])
#: rollouts version 1 = version 2 without ``top_k`` / ``min_p`` (v1 engines applied neither: read as 0 = off).
ROLLOUT_SCHEMA_V1 = pa.schema([f for f in ROLLOUT_SCHEMA_V2 if f.name not in ("top_k", "min_p")])

#: The value of a column that files of older versions lack, where NULL would be wrong: v1 rollouts were never
#: top-k or min-p truncated, so their ``top_k`` / ``min_p`` are 0 (off). mugrpo's own reader
#: (:func:`mugrpo.commits.tables.read_table`) and the ``mugrpo sql`` views both fill these; every other added column
#: reads as NULL. A plain Parquet reader (DuckDB, pandas, polars) sees NULL for all of them (docs/sql.md).
OLDER_DEFAULTS: dict[tuple[str, str], object] = {("rollouts", "top_k"): 0, ("rollouts", "min_p"): 0.0}

#: Older versions a reader still accepts: (table, version) -> the schema of that version. Columns added since are
#: filled by :func:`mugrpo.commits.tables.read_table` (a stated default, else NULL); the SQL views read files by column
#: name. evals version 1 = version 2 without the task columns (read as NULL).
EVAL_SCHEMA_V1 = pa.schema([f for f in EVAL_SCHEMA if f.name not in _TASK_COLUMNS])

OLDER_SCHEMAS: dict[tuple[str, int], pa.Schema] = {
    ("train_steps", 1): TRAIN_STEP_SCHEMA_V1,
    ("train_steps", 2): TRAIN_STEP_SCHEMA_V2,
    ("train_steps", 3): TRAIN_STEP_SCHEMA_V3,
    ("rollouts", 3): ROLLOUT_SCHEMA_V3,
    ("rollouts", 2): ROLLOUT_SCHEMA_V2,
    ("rollouts", 1): ROLLOUT_SCHEMA_V1,
    ("evals", 1): EVAL_SCHEMA_V1,
}


def rollout_key(stage: int, prompt_id: str, sample_idx: int) -> str:
    """A rollout row's identity in the rollouts table: ``"{stage}/{prompt_id}/{sample_idx}"`` (the stage that
    generated it, the content hash of its prompt, its index in its group)."""
    return f"{stage}/{prompt_id}/{sample_idx}"


def batch_identity(keys: Iterable[str]) -> str:
    """``train_steps.batch_id`` of an update: the first 16 hex digits of sha256 over the :func:`rollout_key` of its
    rollouts (fresh and replayed, every rank's), sorted and newline-joined, so it depends neither on the order of
    the rows nor on how they were cut into micro-batches or ranks."""
    return hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:16]
