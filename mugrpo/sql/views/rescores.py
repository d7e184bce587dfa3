"""``rescores`` and ``reward_flips``: the re-scorings of ``mugrpo rescore`` (:mod:`mugrpo.orchestration.rescore`).

- ``rescores``: one row per rollout re-scored by ``mugrpo rescore``: the re-scoring's ``name``, its reward,
  components, status, extracted answer, group advantage, and the stored ``old_reward`` (every
  ``rescores/NAME/stage=k/shard=*.parquet`` of the target's runs; empty with its columns when there is none).
- ``reward_flips``: each re-scored rollout beside its stored row (response, gold, both extracted answers) and its
  ``flip``: ``false_negative`` (new reward higher), ``false_positive`` (lower), NULL (equal).
"""

from __future__ import annotations

from mugrpo.sql.readonly import PROTOCOL, sql_string
from mugrpo.sql.views.base import Build

NAMES = ("rescores", "reward_flips")
#: Listed after every other view (``.tables``, :data:`mugrpo.sql.catalog.VIEWS`), though created right after the tables.
LISTED_LAST = True

#: ``reward_flips``: each re-scored rollout beside its stored row. A flip is a changed reward: ``false_negative``
#: where the re-scoring's reward is higher (the run's verifier under-credited the rollout), ``false_positive`` where
#: it is lower, NULL where they are equal (:func:`mugrpo.orchestration.rescore.flip_kind`).
REWARD_FLIPS_VIEW = """
    SELECT s.run_id, s.stage, s.name, s.prompt_id, s.sample_idx, s.old_reward, s.reward AS new_reward,
           CASE WHEN s.reward > s.old_reward THEN 'false_negative'
                WHEN s.reward < s.old_reward THEN 'false_positive' END AS flip,
           r.response_text, r.ground_truth, r.extracted_answer, s.extracted_answer AS new_extracted_answer
    FROM rescores s LEFT JOIN rollouts r
      ON r.run_id = s.run_id AND r.stage = s.stage AND r.prompt_id = s.prompt_id AND r.sample_idx = s.sample_idx
     AND coalesce(r.is_probe, false) = s.excluded"""


def create(build: Build) -> None:
    from mugrpo.orchestration.rescore import RESCORE_SCHEMA

    paths = [p for files in build.target.runs.values() for p in files.rescores]
    empty = build.register("empty_rescores", RESCORE_SCHEMA.empty_table())
    source = empty
    if paths:  # the `stage` folder is the only key=value one: the name folder is a column of the files
        files = ", ".join(sql_string(f"{PROTOCOL}://{p}") for p in paths)
        source = f"read_parquet([{files}], hive_partitioning = true, hive_types = {{'stage': INTEGER}})"
    build.view("rescores", f"SELECT * FROM {source}")
    build.view("reward_flips", REWARD_FLIPS_VIEW)
