"""LoRA policies (train.lora, mugrpo/policy/adapters.py) between the train and generate jobs: the train job trains
adapters on synthetic rollouts with real advantages and publishes only them; the generate job of the next stage
merges them into the base and samples; the behavior log-probs it records are the trainer's adapter policy's, token
by token. Real job processes, the tiny policy, peft's LoRA layers.
"""

from __future__ import annotations

import torch
from _tiny import generate_spec, start_job, train_spec, write_spec
from safetensors.torch import load_file

from bench.support.synthetic import commit_synthetic_stage
from mugrpo.commits.tables import read_table
from mugrpo.policy.adapters import is_adapter_dir, load_trainable, merged_policy_dir
from mugrpo.policy.models import load_policy, response_logprobs
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store

RUN = "lora-jobs"


def test_the_next_stage_samples_the_trained_adapter(tiny_model_dir, tmp_path):
    store, layout = Store(str(tmp_path / "store")), RunLayout(RUN)
    commit_synthetic_stage(store, RUN, tiny_model_dir, num_prompts=8, group_size=4, seed=2)
    train = write_spec(
        train_spec(store.local_path(""), RUN, train={"lora": {"rank": 4, "alpha": 8.0}, "lr": 5e-2}),
        tmp_path / "train.spec.json",
    )
    log = tmp_path / "train.log"
    assert start_job("train", train, log).wait(timeout=300) == 0, log.read_text()
    adapter = store.local_path(layout.policy_dir(1))
    assert is_adapter_dir(adapter)
    trained = load_file(str(adapter / "adapter_model.safetensors"))
    assert max(float(t.abs().max()) for n, t in trained.items() if "lora_B" in n) > 0  # it learned

    gen = write_spec(
        generate_spec(store.local_path(""), RUN, stage=1, policy_dir=layout.policy_dir(1), num_prompts=4),
        tmp_path / "gen.spec.json",
    )
    assert start_job("generate", gen, tmp_path / "gen.log").wait(timeout=300) == 0, (tmp_path / "gen.log").read_text()
    rows = read_table(store, layout.rollout_shard(1, 0), "rollouts").to_pylist()

    policy = load_trainable(store, adapter).eval()  # the trainer's view: base + unmerged adapters
    _, tokenizer = load_policy(tiny_model_dir)
    with torch.no_grad():
        expected = response_logprobs(
            policy, [r["prompt_token_ids"] for r in rows], [r["response_token_ids"] for r in rows], [1.0] * len(rows)
        )
    for row, lp in zip(rows, expected, strict=True):
        torch.testing.assert_close(torch.tensor(row["behavior_logprobs"]), torch.tensor(lp), atol=1e-4, rtol=0)
    # and the merged weights are not the base's: the sampler did not ignore the adapter
    merged = load_file(str(merged_policy_dir(store, adapter) / "model.safetensors"))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert any(not torch.equal(merged[n], base[n]) for n in base if "proj" in n)
