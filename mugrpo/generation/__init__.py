"""The generation library: a stage's rollouts sampled from the frozen behavior policy, scored, and committed as
sharded Parquet (``python -m mugrpo.jobs.generate`` is its job entry point).

==============  ======================================================================================
module          what
==============  ======================================================================================
``spec``        :data:`GenerateSpec`, the job's spec, and :class:`GenerationError`
``prompts``     which problems a stage samples; rendering and tokenizing them
``shards``      one shard: sampling params, samples, rollout rows with rewards and group advantages
``worker``      :class:`GenerationWorker`: a worker's share of a stage, the algorithms' hooks, resume
``commit``      the worker manifest and the stage's generate manifest
==============  ======================================================================================
"""

from mugrpo.data.datasets import select_problems
from mugrpo.generation.commit import commit_generation
from mugrpo.generation.prompts import PreparedPrompt, prepare_prompts
from mugrpo.generation.shards import sample_shard, shard_params, shard_rows
from mugrpo.generation.spec import GenerateSpec, GenerationError
from mugrpo.generation.worker import GenerationWorker, run_generate

__all__ = [
    "GenerateSpec",
    "GenerationError",
    "GenerationWorker",
    "PreparedPrompt",
    "commit_generation",
    "prepare_prompts",
    "run_generate",
    "sample_shard",
    "select_problems",
    "shard_params",
    "shard_rows",
]
