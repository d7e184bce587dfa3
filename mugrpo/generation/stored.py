"""Stored responses as a rollout engine: a fork with ``run.parent.reuse_rollouts`` (docs/branching.md) re-scores the
parent's committed stage-K responses instead of sampling new ones.

:class:`StoredResponses` answers :meth:`~mugrpo.engines.base.RolloutEngine.generate` with the responses another run
committed for the same prompts, so the generation worker runs its one code path unchanged: the stage's prompt plan,
the shards, the verifier pool with this run's reward config, the group advantages of this run's estimator, the
algorithms' columns and the commit. A response is the parent's row: its token ids, behavior log-probs (float32, read
back bitwise), text, finish reason and temperature. With the parent's reward and advantage config the rows written
equal the parent's in every column but ``created_at``.
"""

from __future__ import annotations

from mugrpo.commits.manifest import read_job_manifest
from mugrpo.commits.tables import read_table
from mugrpo.engines.base import Sample, SamplingParams
from mugrpo.generation.spec import GenerationError
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store

_COLUMNS = [
    "prompt_id",
    "sample_idx",
    "prompt_token_ids",
    "response_token_ids",
    "behavior_logprobs",
    "response_text",
    "finish_reason",
    "temperature",
]


class StoredResponses:
    """A rollout engine over the committed rollouts of stage ``stage`` of run ``source`` (a fork's parent).

    Shards are read lazily, in order, each verified against the sha256 its generate job manifest recorded, so a
    parent file changed or deleted since it committed is refused before any of it is used. Runs whose algorithms
    plan their shards (extra groups) are not served: ``mugrpo fork`` refuses to reuse them
    (:func:`mugrpo.orchestration.fork.plan_fork`).

    Args:
        store: the store both runs live in.
        source: the run whose responses are served.
        stage: the stage whose responses are served.

    Raises:
        GenerationError: ``source`` has not committed the stage's generation.
    """

    def __init__(self, store: Store, source: str, stage: int) -> None:
        self.store, self.source, self.stage = store, source, stage
        manifest = read_job_manifest(store, source, stage, "generate")
        layout = RunLayout(source)
        if manifest is None:
            raise GenerationError(
                f"stage {stage} of run {source!r} has not committed its generation "
                f"({store.uri(layout.job_manifest(stage, 'generate'))} is missing): there are no responses to reuse"
            )
        prefix = layout.rel(layout.rollouts_dir(stage)) + "/"
        self._files = sorted((r for r in manifest.files if r.path.startswith(prefix)), key=lambda r: r.path)
        self._layout = layout
        self._groups: dict[tuple[int, ...], list[dict]] = {}
        #: tokens served so far (the worker's progress line counts generated tokens)
        self.on_tokens = None

    def _read_next_shard(self) -> bool:
        if not self._files:
            return False
        record = self._files.pop(0)
        rel = self._layout.abs(record.path)
        table = read_table(self.store, rel, "rollouts", expected_sha256=record.sha256)
        for row in table.select(_COLUMNS).to_pylist():
            self._groups.setdefault(tuple(row["prompt_token_ids"]), []).append(row)
        return True

    def _group(self, prompt: list[int], n: int) -> list[dict]:
        key = tuple(prompt)
        while len(self._groups.get(key, ())) < n and self._read_next_shard():
            pass
        rows = sorted(self._groups.pop(key, []), key=lambda r: r["sample_idx"])[:n]
        if len(rows) < n or [r["sample_idx"] for r in rows] != list(range(n)):
            raise GenerationError(
                f"run {self.source!r} stage {self.stage} holds {len(rows)} stored responses for a prompt this stage "
                f"samples, not G={n} (sample_idx 0..{n - 1}): the prompt's rendering or the group size differs from "
                "the run whose rollouts are reused"
            )
        return rows

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """The stored G responses of each prompt (outer: prompt, inner: sample_idx 0..G-1), G = ``params.n``.

        Raises:
            GenerationError: a prompt without G stored responses.
            mugrpo.storage.store.ChecksumError: a stored shard differs from its manifest's sha256.
        """
        groups = []
        for prompt in prompt_token_ids:
            rows = self._group(prompt, params.n)
            groups.append(
                [
                    Sample(
                        response_token_ids=list(r["response_token_ids"]),
                        behavior_logprobs=list(r["behavior_logprobs"]),
                        text=r["response_text"],
                        finish_reason=r["finish_reason"],
                        temperature=r["temperature"],
                    )
                    for r in rows
                ]
            )
            if self.on_tokens is not None:
                self.on_tokens(sum(len(r["response_token_ids"]) for r in rows))
        return groups

    def close(self) -> None:
        self._groups.clear()
