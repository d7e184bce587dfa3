"""A synthetic but real stage for trainer tests and the training benchmark: real token ids from the policy's
tokenizer, behavior log-probs from a real teacher-forced forward of the policy (so importance ratios start at 1),
made-up binary rewards with group-normalized advantages, committed exactly as the generation job commits them
(rollout shards, then the ``generate`` job manifest), plus the behavior policy at ``policies/stage={k}``.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from mugrpo.commits.manifest import write_job_manifest
from mugrpo.commits.tables import table_from_rows, write_table
from mugrpo.policy.models import load_policy, response_logprobs
from mugrpo.policy.truncation import Truncation
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.data import Rollout
from schemas import JobManifest


def sampled_rollout(
    index: int,
    prompt_token_ids: list[int],
    response_token_ids: list[int],
    behavior_logprobs: list[float],
    temperature: float = 1.0,
    truncation: Truncation = Truncation(),
) -> Rollout:
    """A stage-0 rollout of a sampler's response (reward and advantage 0, prompt id ``str(index)``): what the trainer
    sees at update 1 with the policy unchanged, to compare its log-probs with the sampler's ``behavior_logprobs``."""
    return Rollout(
        stage=0,
        policy_version=0,
        prompt_id=str(index),
        sample_idx=0,
        prompt_token_ids=prompt_token_ids,
        response_token_ids=response_token_ids,
        behavior_logprobs=behavior_logprobs,
        reward=0.0,
        advantage=0.0,
        temperature=temperature,
        truncation=truncation,
    )


_WORDS = (
    "the answer is so we add then multiply each term by two and subtract three from the total which gives "
    "a final result of boxed nine because twelve minus three equals nine therefore"
).split()


def synthetic_rollout_rows(
    policy_dir: str | Path,
    *,
    run_id: str,
    stage: int = 0,
    policy_version: int = 0,
    num_prompts: int = 8,
    group_size: int = 4,
    response_tokens: tuple[int, int] = (4, 24),
    prompt_repeat: int = 1,
    temperature: float = 1.0,
    seed: int = 0,
    zero_variance_prompts: int = 0,
) -> list[dict]:
    """Rollout rows (ROLLOUT_SCHEMA) for ``num_prompts`` groups of ``group_size`` responses.

    Responses are tokenized word sequences cut to a length drawn from ``response_tokens`` (inclusive) and ended
    with the EOS id (SmolLM2: 2, also its pad id), so the EOS is a real response token. Rewards are 0/1 with at
    least one of each per group, except the first ``zero_variance_prompts`` groups (all 0, advantage 0).
    ``prompt_repeat`` repeats the prompt text to make longer prompts (benchmarks).
    """
    model, tokenizer = load_policy(policy_dir)
    rng = np.random.default_rng(seed)
    eos = tokenizer.eos_token_id
    prompts, responses, meta = [], [], []
    for p in range(num_prompts):
        a, b = int(rng.integers(2, 99)), int(rng.integers(2, 99))
        text = " ".join([f"Question {p}: what is {a} plus {b}? Show your work."] * prompt_repeat)
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        prompt_id = hashlib.sha256(text.encode()).hexdigest()[:16]
        if p < zero_variance_prompts:
            rewards = np.zeros(group_size)
        else:
            rewards = rng.permutation(np.r_[1.0, 0.0, rng.integers(0, 2, size=max(group_size - 2, 0))])[:group_size]
        std = rewards.std()
        advantages = (rewards - rewards.mean()) / (std + 1e-6) if std > 0 else np.zeros(group_size)
        for s in range(group_size):
            length = int(rng.integers(response_tokens[0], response_tokens[1] + 1))
            words = rng.choice(_WORDS, size=length * 2).tolist()
            ids = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"][: length - 1] + [eos]
            prompts.append(prompt_ids)
            responses.append(ids)
            meta.append((prompt_id, text, s, float(rewards[s]), float(advantages[s]), std == 0, a + b))
    logprobs: list[list[float]] = []
    with torch.inference_mode():
        for i in range(0, len(prompts), 16):
            logprobs.extend(response_logprobs(model, prompts[i : i + 16], responses[i : i + 16], temperature))
    now = datetime.now(UTC)
    rows = []
    for prompt_ids, ids, lps, (prompt_id, text, s, reward, adv, zero_var, answer) in zip(
        prompts, responses, logprobs, meta, strict=True
    ):
        rows.append(
            {
                "run_id": run_id,
                "stage": stage,
                "policy_version": policy_version,
                "prompt_id": prompt_id,
                "sample_idx": s,
                "group_size": group_size,
                "prompt_text": text,
                "prompt_token_ids": prompt_ids,
                "response_text": tokenizer.decode(ids),
                "response_token_ids": ids,
                "behavior_logprobs": lps,
                "finish_reason": "stop",
                "num_tokens": len(ids),
                "reward": reward,
                "reward_components": [("math_correctness", reward)],
                "reward_status": "ok",
                "ground_truth": str(answer),
                "extracted_answer": None,
                "advantage": adv,
                "zero_variance": bool(zero_var),
                "temperature": temperature,
                "top_p": 1.0,
                "top_k": 0,
                "min_p": 0.0,
                "seed": seed,
                "engine": "synthetic",
                "created_at": now,
            }
        )
    return rows


def commit_rollouts(store: Store, run_id: str, stage: int, rows: list[dict], *, shard_size: int = 4) -> JobManifest:
    """Write ``rows`` as rollout shards of ``shard_size`` groups, then the ``generate`` job manifest (its commit)."""
    layout = RunLayout(run_id)
    per_shard = shard_size * rows[0]["group_size"]
    files = []
    for shard, start in enumerate(range(0, len(rows), per_shard)):
        rel = layout.rollout_shard(stage, shard)
        table = table_from_rows(rows[start : start + per_shard], "rollouts")
        files.append(write_table(store, rel, table, "rollouts", run_rel=layout.rel(rel)))
    manifest = JobManifest(
        run_id=run_id,
        stage=stage,
        job="generate",
        created_at=datetime.now(UTC),
        files=files,
        counts={"rows": len(rows), "prompts": len({r["prompt_id"] for r in rows})},
    )
    write_job_manifest(store, manifest)
    return manifest


def commit_synthetic_stage(
    store: Store,
    run_id: str,
    policy_dir: str | Path,
    *,
    stage: int = 0,
    shard_size: int = 4,
    upload_policy: bool = True,
    **row_kwargs,
) -> JobManifest:
    """Commit a synthetic stage: the policy at ``policies/stage={stage}``, rollout shards of ``shard_size``
    groups, then the ``generate`` job manifest. ``row_kwargs`` go to :func:`synthetic_rollout_rows`."""
    if upload_policy:
        store.upload_dir(policy_dir, RunLayout(run_id).policy_dir(stage), meta={"stage": stage})
    rows = synthetic_rollout_rows(policy_dir, run_id=run_id, stage=stage, **row_kwargs)
    return commit_rollouts(store, run_id, stage, rows, shard_size=shard_size)
