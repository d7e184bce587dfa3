"""The training job on a tiny random policy (CPU): data order, log-probs, a full run, micro-batch invariance,
bad rollouts and the NaN/inf guard. Real files, real processes; nothing is mocked.

The rollouts are synthetic but real: token ids from the policy's tokenizer, behavior log-probs from a
teacher-forced forward of the same policy (:mod:`bench.support.synthetic`), so importance ratios start at 1.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from _tiny import REPO_ROOT, job_env, policy_weights, train_spec, write_spec

from bench.support.synthetic import commit_rollouts, commit_synthetic_stage, synthetic_rollout_rows
from mugrpo.commits.manifest import checkpoint_steps, latest_checkpoint, read_job_manifest, write_job_manifest
from mugrpo.commits.tables import read_table
from mugrpo.common.seeds import derive_seed
from mugrpo.policy.models import load_policy, response_logprobs
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.batch import collate
from mugrpo.trainer.commit import nonfinite_report_path
from mugrpo.trainer.data import load_rollouts, make_minibatch_order
from mugrpo.trainer.forward import PolicyTokenLogprobs
from mugrpo.trainer.loop import run_training
from mugrpo.trainer.optim import LRSchedule
from mugrpo.trainer.setup import enable_activation_checkpointing
from mugrpo.trainer.spec import TrainSpec
from schemas import SCHEMA_VERSIONS, FileRecord

RUN = "trainer-test"


def _spec(root: Path, **train) -> TrainSpec:
    return train_spec(root, RUN, train=train)


@pytest.fixture
def stage_root(tmp_path, tiny_model_dir) -> Path:
    """A store holding policies/stage=0 and 8 groups x 4 committed synthetic rollouts of stage 0."""
    root = tmp_path / "store"
    commit_synthetic_stage(Store(str(root)), RUN, tiny_model_dir, num_prompts=8, group_size=4, seed=1)
    return root


# --- pieces -------------------------------------------------------------------------------------------------------


def test_forward_logprobs_match_a_full_forward(tiny_model_dir):
    """Right-padded, no attention mask, hidden-state gather + chunked log-softmax == plain teacher forcing."""
    model, tokenizer = load_policy(tiny_model_dir)
    rows = synthetic_rollout_rows(tiny_model_dir, run_id=RUN, num_prompts=3, group_size=2, response_tokens=(2, 12))
    from mugrpo.trainer.data import _to_rollout

    rollouts = [_to_rollout(r, "test") for r in rows]
    eos = tokenizer.eos_token_id
    assert all(r.response_token_ids[-1] == eos == tokenizer.pad_token_id for r in rollouts)
    batch = collate(rollouts, list(range(len(rollouts))), pad_token_id=eos)
    assert batch.response_mask.sum(dim=1).tolist() == [r.num_tokens for r in rollouts]  # EOS (= pad) counted
    wrapper = PolicyTokenLogprobs(model, chunk_size=7)
    for temps in ([0.7] * len(rollouts), [0.7, 1.0, 1.3, 0.7, 1.0, 1.3]):
        batch.temperatures = torch.tensor(temps)
        with torch.no_grad():
            logprobs, entropy = wrapper(batch)
        expected = response_logprobs(
            model, [r.prompt_token_ids for r in rollouts], [r.response_token_ids for r in rollouts], temps
        )
        for i, r in enumerate(rollouts):
            torch.testing.assert_close(logprobs[i, : r.num_tokens], torch.tensor(expected[i]), atol=2e-5, rtol=0)
        assert torch.isfinite(entropy).all() and (entropy[batch.response_mask] > 0).all()


def test_minibatch_order_is_seeded_and_covers_each_epoch(tmp_path, tiny_model_dir):
    store = Store(str(tmp_path))
    commit_synthetic_stage(store, RUN, tiny_model_dir, num_prompts=6, group_size=4, zero_variance_prompts=2)
    data = load_rollouts(store, RUN, [0], skip_zero_variance_groups=True)
    assert data.counts["zero_variance_groups_dropped"] == 2 and len(data.rollouts) == 16
    order = make_minibatch_order(data, rollouts_per_update=5, group_minibatches=False, seed=7)
    assert order.minibatches_per_epoch == 3
    epoch0 = [i for u in range(3) for i in order.minibatch(u)]
    assert len(set(epoch0)) == 15  # one epoch: distinct rollouts (one left out)
    same = make_minibatch_order(data, rollouts_per_update=5, group_minibatches=False, seed=7)
    other = make_minibatch_order(data, rollouts_per_update=5, group_minibatches=False, seed=8)
    assert [same.minibatch(u) for u in range(6)] == [order.minibatch(u) for u in range(6)]
    assert [other.minibatch(u) for u in range(6)] != [order.minibatch(u) for u in range(6)]
    assert order.minibatch(3) != order.minibatch(0)  # epoch 1 is reshuffled
    grouped = make_minibatch_order(data, rollouts_per_update=8, group_minibatches=True, seed=7)
    for u in range(4):
        prompts = [data.rollouts[i].prompt_id for i in grouped.minibatch(u)]
        assert len(prompts) == 8 and all(prompts.count(p) == 4 for p in prompts)  # whole groups


def test_lr_schedule_warmup_then_cosine():
    schedule = LRSchedule(1.0, warmup_updates=2, total_updates=6, name="cosine")
    lrs = [schedule.lr(u) for u in range(1, 7)]
    assert lrs[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert lrs[3:] == pytest.approx([0.5 * (1 + torch.cos(torch.tensor(torch.pi * k / 4)).item()) for k in (1, 2, 3)])
    with pytest.raises(ValueError, match="unknown lr schedule"):
        LRSchedule(1.0, 0, 4, "step")


# --- the job ------------------------------------------------------------------------------------------------------


@pytest.mark.slow  # starts the job as a process: make test-all runs it
def test_full_job_run(stage_root, tmp_path):
    """Subprocess run: 4 train_steps rows with sane metrics, a checkpoint, policies/stage=1, a manifest; the
    re-run is a no-op."""
    spec_path = write_spec(_spec(stage_root, recompute_behavior_logprobs=True), tmp_path / "train.spec.json")
    proc = subprocess.run(
        [sys.executable, "-m", "mugrpo.jobs.train", str(spec_path)],
        env=job_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store, layout = Store(str(stage_root)), RunLayout(RUN)

    steps = pq.read_table(store.local_path(layout.train_steps_dir(0))).sort_by("stage_update").to_pydict()
    assert steps["stage_update"] == [1, 2, 3, 4] and steps["update"] == [1, 2, 3, 4]
    assert steps["staleness"] == [0, 1, 2, 3]
    assert steps["ratio_mean"][0] == pytest.approx(1.0, abs=1e-4)  # behavior log-probs = the trainer's
    assert abs(steps["approx_kl_behavior"][0]) < 1e-6 and steps["approx_kl_behavior"][-1] > 1e-4  # it learned
    assert all(n > 0 for n in steps["grad_norm"]) and steps["lr"] == [1e-3] * 4
    assert all(s == 8 for s in steps["num_sequences"]) and all(t > 0 for t in steps["tokens_per_second"])
    assert all(e > 0 for e in steps["entropy"]) and steps["kl_ref"] == [None] * 4
    assert checkpoint_steps(store, layout, 0) == [4]  # step 2 pruned (keep_checkpoints=1)

    assert store.is_complete_dir(layout.policy_dir(1))
    before, after = policy_weights(store, layout.policy_dir(0)), policy_weights(store, layout.policy_dir(1))
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)
    configs = [json.loads((store.local_path(layout.policy_dir(k)) / "config.json").read_text()) for k in (0, 1)]
    assert configs[1]["use_cache"] == configs[0]["use_cache"]  # training settings do not leak into the policy
    trained, tokenizer = load_policy(store.local_path(layout.policy_dir(1)))  # a loadable HF dir with tokenizer
    assert tokenizer.eos_token_id == 2 and trained.generation_config.eos_token_id is not None

    manifest = read_job_manifest(store, RUN, 0, "train")
    timings = manifest.timings
    assert manifest.counts["updates"] == 4 and set(timings) == {"switch", "train", "recompute", "checkpoint", "total"}
    assert 0 < timings["switch"] < timings["total"]
    # The behavior log-prob recompute pass ran (recompute_behavior_logprobs) and is training time, not switch:
    # switch and train (which holds it) are disjoint parts of the total.
    assert 0 < timings["recompute"] < timings["train"]
    assert 0 < timings["checkpoint"] < timings["train"] - timings["recompute"]  # two checkpoints (2 and 4)
    assert timings["switch"] + timings["train"] <= timings["total"]
    paths = {f.path for f in manifest.files}
    assert {"train_steps/stage=0/part-00002.parquet", "train_steps/stage=0/part-00004.parquet"} <= paths
    assert "policies/stage=1/model.safetensors" in paths
    for record in manifest.files:  # every listed file verifies
        store.read_bytes(layout.abs(record.path), expected_sha256=record.sha256)

    again = run_training(_spec(stage_root, recompute_behavior_logprobs=True))
    assert again == manifest  # already committed: nothing rerun, nothing rewritten


def test_micro_batch_size_does_not_change_the_update(tiny_model_dir, tmp_path):
    """Global-count normalization: micro-batches of 2 and of 4 give the same loss, grad norms and weights.

    The lr is small because Adam's step m / (sqrt(v) + eps) turns fp32 summation-order noise in near-zero gradient
    entries (|g| ~ eps) into differences of up to ~lr; the grad norm (before clipping) is the scale-sensitive check.
    """
    results = {}
    commit_synthetic_stage(
        Store(str(tmp_path / "micro2")),
        RUN,
        tiny_model_dir,
        num_prompts=4,
        group_size=4,
        seed=3,
        response_tokens=(2, 30),
    )
    shutil.copytree(tmp_path / "micro2", tmp_path / "micro4")  # the very same committed rollouts
    for micro in (2, 4):
        root = tmp_path / f"micro{micro}"
        run_training(_spec(root, updates_per_stage=2, micro_batch_size=micro, checkpoint_every=2, lr=1e-5))
        store = Store(str(root))
        steps = read_table(store, RunLayout(RUN).train_steps_part(0, 2), "train_steps").to_pydict()
        results[micro] = (steps, policy_weights(store, RunLayout(RUN).policy_dir(1)))
    (steps2, w2), (steps4, w4) = results[2], results[4]
    assert steps2["grad_norm"] == pytest.approx(steps4["grad_norm"], rel=1e-5)
    assert steps2["loss"] == pytest.approx(steps4["loss"], rel=1e-5, abs=1e-7)
    w0 = policy_weights(Store(str(tmp_path / "micro2")), RunLayout(RUN).policy_dir(0))
    assert max((w2[n] - w0[n]).abs().max().item() for n in w0) > 1e-5  # the weights did move
    for name in w2:
        torch.testing.assert_close(w2[name], w4[name], atol=1e-6, rtol=0)


@pytest.mark.slow  # starts two torchrun processes: make test-all runs it
def test_two_data_parallel_processes_give_the_update_of_one(tiny_model_dir, tmp_path):
    """DDP for real: 2 CPU processes (torchrun, gloo) each take half of every minibatch; with the loss normalized by
    the whole minibatch's counts they publish the policy one process publishes, up to fp32 summation order.
    (FSDP cannot run here: accelerate shards only on accelerators; no GPU is lent to CI.)"""
    commit_synthetic_stage(Store(str(tmp_path / "one")), RUN, tiny_model_dir, num_prompts=8, group_size=4, seed=1)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    python = [sys.executable, "-m"]
    launchers = {
        "one": python,
        "two": [*python, "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m"],
    }
    out, weights, steps = {}, {}, {}
    for name, launcher in launchers.items():
        spec = write_spec(_spec(tmp_path / name, micro_batch_size=2), tmp_path / f"{name}.spec.json")
        proc = subprocess.run(
            [*launcher, "mugrpo.jobs.train", str(spec)],
            env={**job_env(), "ACCELERATE_USE_CPU": "true"},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = proc.stdout + proc.stderr
        store = Store(str(tmp_path / name))
        weights[name] = policy_weights(store, RunLayout(RUN).policy_dir(1))
        steps[name] = pq.read_table(store.local_path(RunLayout(RUN).train_steps_dir(0))).sort_by("stage_update")
    assert "not distributed, on cpu" in out["one"] and "2 processes, MULTI_CPU, on cpu" in out["two"]
    one, two = steps["one"].to_pydict(), steps["two"].to_pydict()
    assert one["stage_update"] == two["stage_update"] == [1, 2, 3, 4]  # rank 0 alone writes the table
    assert two["num_sequences"] == [8] * 4  # metrics are reduced over both ranks
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-4, abs=1e-6)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    # The health panel gathers every rank's tokens: the same statistics as one process, the same batch identity.
    assert two["batch_id"] == one["batch_id"] and two["t_eta"] == one["t_eta"]
    for column in ("ess", "kl_sampler", "sampler_ratio_p1", "sampler_ratio_p99", "sampler_ratio_max", "logit_var"):
        assert two[column] == pytest.approx(one[column], rel=1e-4, abs=1e-6), column
    assert two["sampler_clip_frac"] == one["sampler_clip_frac"]
    w0 = policy_weights(Store(str(tmp_path / "one")), RunLayout(RUN).policy_dir(0))
    assert max((weights["one"][n] - w0[n]).abs().max().item() for n in w0) > 1e-3  # the weights did move
    for name in w0:
        torch.testing.assert_close(weights["two"][name], weights["one"][name], atol=2e-5, rtol=0)


def test_wrong_rollout_schema_version_is_a_clear_error(stage_root, tmp_path, capsys):
    """A rollout shard stamped with another schema version stops the job (exit 2) naming file and version."""
    from mugrpo.jobs.train import main

    store, layout = Store(str(stage_root)), RunLayout(RUN)
    manifest = read_job_manifest(store, RUN, 0, "generate")
    rel = layout.abs(manifest.files[0].path)
    table = read_table(store, rel, "rollouts")
    meta = {**table.schema.metadata, b"mugrpo.schema_version": str(SCHEMA_VERSIONS["rollouts"] + 1).encode()}
    buf = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(meta), buf)
    digest = store.write_bytes(rel, buf.getvalue())
    manifest.files[0] = FileRecord(path=manifest.files[0].path, sha256=digest, bytes=len(buf.getvalue()))
    write_job_manifest(store, manifest)

    with pytest.raises(SystemExit) as exc:
        main([str(write_spec(_spec(stage_root), tmp_path / "spec.json"))])
    assert exc.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "schema version" in err and "shard=00000.parquet" in err
    assert not store.exists(layout.checkpoints_dir(0)) and not store.exists(layout.policy_dir(1))


def test_nonfinite_gradient_stops_the_job_and_keeps_the_last_checkpoint(tiny_model_dir, tmp_path, capsys):
    """One rollout with an absurd but finite advantage (1e30, e.g. a reward normalized by a ~0 std) passes the
    loader's finiteness checks, gives a finite loss but an infinite gradient norm. The job must stop at the first
    update whose minibatch holds it, record that minibatch's prompt ids, and leave the previous checkpoint intact."""
    root = tmp_path / "store"
    store, layout = Store(str(root)), RunLayout(RUN)
    commit_synthetic_stage(store, RUN, tiny_model_dir, num_prompts=6, group_size=4, seed=5)
    spec = _spec(root, updates_per_stage=6, checkpoint_every=1)
    data = load_rollouts(store, RUN, [0], skip_zero_variance_groups=True)
    order = make_minibatch_order(
        data, rollouts_per_update=8, group_minibatches=False, seed=derive_seed(spec.seed, 0, "train-data-order")
    )
    first, second = set(order.minibatch(0)), order.minibatch(1)
    victim = next(i for i in second if i not in first)  # first drawn by update 2
    bad = data.rollouts[victim]
    rows = [
        r
        for f in read_job_manifest(store, RUN, 0, "generate").files
        for r in read_table(store, layout.abs(f.path), "rollouts").to_pylist()
    ]
    for r in rows:
        if (r["prompt_id"], r["sample_idx"]) == (bad.prompt_id, bad.sample_idx):
            r["advantage"] = 1e30
    commit_rollouts(store, RUN, 0, rows)

    from mugrpo.jobs.train import main

    with pytest.raises(SystemExit) as exc:
        main([str(write_spec(spec, tmp_path / "s.json"))])
    assert exc.value.code == 3
    err = " ".join(capsys.readouterr().err.split())
    assert "non-finite grad_norm" in err and bad.prompt_id in err
    report = store.read_json(nonfinite_report_path(layout, 0))
    assert report["stage_update"] == 2 and report["what"] == "grad_norm" and report["last_checkpoint"] == 1
    assert report["prompt_ids"] == sorted({data.rollouts[i].prompt_id for i in second})
    assert latest_checkpoint(store, layout, 0) == 1 and not store.exists(layout.checkpoint_dir(0, 2))
    store.download_dir(layout.checkpoint_dir(0, 1), tmp_path / "verify")  # every checksum still matches
    assert [r["stage_update"] for r in read_table(store, layout.train_steps_part(0, 1), "train_steps").to_pylist()] == [
        1
    ]
    assert not store.exists(layout.train_steps_part(0, 2)) and not store.exists(layout.policy_dir(1))
    assert read_job_manifest(store, RUN, 0, "train") is None
    assert json.loads(json.dumps(report)) == report  # plain JSON: survives a round trip unchanged
    assert set(report) >= {"stage_update", "what", "last_checkpoint", "prompt_ids"}


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir):
    """The decoder is called directly (not through the CausalLM forward): checkpointing must still apply and
    leave the gradients unchanged."""
    from mugrpo.trainer.data import _to_rollout

    rows = synthetic_rollout_rows(tiny_model_dir, run_id=RUN, num_prompts=2, group_size=2)
    batch = collate([_to_rollout(r, "test") for r in rows], [0, 0, 1, 1], pad_token_id=2)
    grads, saved = [], []
    for checkpointing in (False, True):
        model, _ = load_policy(tiny_model_dir)
        if checkpointing:
            enable_activation_checkpointing(model)
        model.train()
        count = [0]

        def pack(tensor, count=count):
            count[0] += 1
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            logprobs, _ = PolicyTokenLogprobs(model, chunk_size=16)(batch)
        (logprobs * batch.response_mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        saved.append(count[0])
    assert saved[1] < saved[0] / 3  # activations kept for backward: checkpointing keeps only the layer inputs
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-5)
