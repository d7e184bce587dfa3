"""ConSPO (arXiv 2605.12969): the loss by hand and against a float64 finite-difference reference, the margin
schedule, micro-batch invariance, labels from the rollout rows, config checks, and a tiny end-to-end training run
that is resumed from a checkpoint (the training progress lambda_t, hence the margin, survives resume exactly)."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from _tiny import train_spec
from safetensors.torch import load_file

from bench.support.synthetic import commit_rollouts, commit_synthetic_stage, synthetic_rollout_rows
from mugrpo.commits.manifest import read_job_manifest
from mugrpo.commits.tables import read_table
from mugrpo.config import ConfigError, load_config
from mugrpo.losses import (
    LossContext,
    PolicyLossConfig,
    compute_policy_loss,
    count_valid_groups,
    margin_schedule,
    positive_labeler,
    reduce_metrics,
    row_inputs,
    training_progress,
)
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.batch import collate
from mugrpo.trainer.data import RolloutDataError, load_rollouts, make_minibatch_order, update_statistics
from mugrpo.trainer.loop import run_training
from mugrpo.trainer.spec import TrainSpec

RUN = "conspo-test"

# Two groups. Group 0 (valid): rows 0, 1 positive, rows 2, 3 negative, lengths 2, 3, 1, 4. Group 1: all negative.
TOKENS = [
    [-1.0, -3.0],  # s = -2.0   positive
    [-0.5, -1.0, -1.5],  # s = -1.0   positive
    [-2.0],  # s = -2.0   negative
    [-1.0, -2.0, -1.5, -1.5],  # s = -1.5   negative
    [-0.3, -0.7],  # s = -0.5   negative (group 1)
    [-1.0, -1.0, -1.0],  # s = -1.0   negative (group 1)
]
GROUPS = [0, 0, 0, 0, 1, 1]
POSITIVE = [True, True, False, False, False, False]


def _padded(rows):
    width = max(len(r) for r in rows)
    logprobs = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        logprobs[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = True
    return logprobs, mask


def _loss(logprobs, mask, config, groups=GROUPS, positive=POSITIVE, progress=0.25, **context):
    return compute_policy_loss(
        logprobs,
        logprobs.detach(),
        torch.zeros(len(groups)),
        mask,
        config,
        context=LossContext(
            group_index=torch.tensor(groups), progress=progress, inputs={"positive": torch.tensor(positive)}, **context
        ),
    )


def _reference_loss(flat: list[float], tau: float, margin: float) -> float:
    """Plain float64 ConSPO loss of the fixed example, from its flattened token log-probs (a loop, no torch)."""
    rows, k = [], 0
    for row in TOKENS:
        rows.append(flat[k : k + len(row)])
        k += len(row)
    scores = [sum(r) / len(r) for r in rows]
    group_losses = []
    for g in sorted(set(GROUPS)):
        pos = [scores[i] for i in range(len(rows)) if GROUPS[i] == g and POSITIVE[i]]
        neg = [scores[i] for i in range(len(rows)) if GROUPS[i] == g and not POSITIVE[i]]
        if not pos or not neg:
            continue
        terms = []
        for s in pos:
            logits = [(s - margin) / tau] + [n / tau for n in neg]
            top = max(logits)
            lse = top + math.log(sum(math.exp(x - top) for x in logits))
            terms.append(-tau * (logits[0] - lse))
        group_losses.append(sum(terms) / len(terms))
    return sum(group_losses) / len(group_losses)


def test_hand_computed_value_gradient_and_metrics():
    # tau = 1, M = 0.4, alpha = 0.5, lambda = 0.25 -> rho = 0.5 -> m = 0.2.
    config = PolicyLossConfig(name="conspo", conspo={"tau": 1.0, "margin": 0.4, "margin_alpha": 0.5})
    logprobs, mask = _padded(TOKENS)
    logprobs.requires_grad_()
    out = _loss(logprobs, mask, config)
    out.loss.backward()

    # Anchor 0 (s = -2): logits [-2.2, -2.0, -1.5]; anchor 1 (s = -1): logits [-1.2, -2.0, -1.5].
    def softmax(xs):
        z = sum(math.exp(x) for x in xs)
        return [math.exp(x) / z for x in xs]

    p0, p1 = softmax([-2.2, -2.0, -1.5]), softmax([-1.2, -2.0, -1.5])
    expected = 0.5 * (-math.log(p0[0]) - math.log(p1[0]))  # one valid group, mean over its 2 positives
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)
    # dL/ds_i+ = (p_i0 - 1) / N+; dL/ds_j- = sum_i p_ij / N+; dL/dlogprob_t = dL/ds / |o|.
    ds = [(p0[0] - 1) / 2, (p1[0] - 1) / 2, (p0[1] + p1[1]) / 2, (p0[2] + p1[2]) / 2, 0.0, 0.0]
    expected_grad = torch.zeros_like(logprobs)
    for i, row in enumerate(TOKENS):
        expected_grad[i, : len(row)] = ds[i] / len(row)
    torch.testing.assert_close(logprobs.grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert (logprobs.grad[4:] == 0).all()  # the all-negative group is discarded

    m = out.metrics
    assert m["conspo_valid_groups"].item() == 1 and m["conspo_discarded_groups"].item() == 1
    assert m["conspo_score_gap"].item() == pytest.approx(-1.5 - (-1.75))  # mean s+ - mean s-
    assert m["conspo_infonce_acc"].item() == pytest.approx(0.5)  # -1 beats both negatives, -2 does not
    assert m["conspo_margin"].item() == pytest.approx(0.2)
    assert m["conspo_progress"].item() == pytest.approx(0.25)
    assert m["clip_frac_high"].item() == 0 and m["veto_token_frac"].item() == 0
    assert m["ratio_mean"].item() == pytest.approx(1.0)


def test_gradient_matches_float64_finite_differences():
    """The paper's defaults (tau 10, M 0.01) at lambda = alpha / 2: autograd (fp32) vs central differences of a
    plain float64 implementation."""
    config = PolicyLossConfig(name="conspo")
    margin = margin_schedule(0.15, 0.01, 0.3)
    logprobs, mask = _padded(TOKENS)
    logprobs.requires_grad_()
    out = _loss(logprobs, mask, config, progress=0.15)
    out.loss.backward()
    flat = [x for row in TOKENS for x in row]
    assert out.loss.item() == pytest.approx(_reference_loss(flat, 10.0, margin), rel=1e-6)
    h, k = 1e-6, 0
    for i, row in enumerate(TOKENS):
        for t in range(len(row)):
            up, down = list(flat), list(flat)
            up[k] += h
            down[k] -= h
            numeric = (_reference_loss(up, 10.0, margin) - _reference_loss(down, 10.0, margin)) / (2 * h)
            assert logprobs.grad[i, t].item() == pytest.approx(numeric, abs=2e-6), (i, t)
            k += 1


def test_margin_schedule_and_training_progress():
    M, alpha = 0.01, 0.3
    assert margin_schedule(0.0, M, alpha) == 0.0
    assert margin_schedule(alpha / 2, M, alpha) == pytest.approx(M / 2)
    assert margin_schedule(alpha, M, alpha) == pytest.approx(M)
    assert margin_schedule(1.0, M, alpha) == pytest.approx(M)
    assert margin_schedule(alpha / 4, M, alpha) == pytest.approx(M / 2 * (1 - math.cos(math.pi / 4)))
    assert training_progress(0, 32) == 0.0 and training_progress(8, 32) == 0.25 and training_progress(40, 32) == 1.0
    with pytest.raises(ValueError, match="progress"):
        margin_schedule(1.5, M, alpha)
    with pytest.raises(ValueError, match="total_updates"):
        training_progress(0, 0)


def _random_groups(seed):
    """5 groups (sizes 3, 4, 2, 3, 4): valid ones, an all-positive, an all-negative, and an empty response."""
    gen = torch.Generator().manual_seed(seed)
    groups = [0] * 3 + [1] * 4 + [2] * 2 + [3] * 3 + [4] * 4
    positive = [1, 0, 0] + [1, 1, 0, 1] + [1, 1] + [0, 0, 0] + [0, 1, 0, 0]
    lengths = torch.tensor([5, 2, 7, 1, 3, 6, 4, 2, 2, 7, 3, 5, 4, 6, 0, 3])
    mask = torch.arange(7) < lengths.unsqueeze(-1)
    behavior = -torch.rand(len(groups), 7, generator=gen) * 3
    logprobs = behavior + torch.randn(len(groups), 7, generator=gen) * 0.5
    ref = behavior + torch.randn(len(groups), 7, generator=gen) * 0.2
    return logprobs, behavior, mask, torch.tensor(groups), torch.tensor(positive, dtype=torch.bool), ref


def test_micro_batching_changes_nothing_with_the_global_valid_group_count():
    logprobs0, behavior, mask, groups, positive, ref = _random_groups(0)
    config = PolicyLossConfig(name="conspo", kl_coef=0.1, conspo={"tau": 2.0, "margin": 0.3})
    nonempty = mask.any(-1)
    valid = count_valid_groups(groups.tolist(), positive.tolist(), nonempty.tolist())
    assert valid == 3  # groups 0, 1, 4; group 2 all positive, group 3 all negative
    common = dict(progress=0.4, global_num_tokens=float(mask.sum()), global_num_seqs=float(nonempty.sum()))

    def run(rows, lp, context, inputs=None):
        inputs = inputs or {}
        return compute_policy_loss(
            lp[rows],
            behavior[rows],
            torch.zeros(len(groups))[rows],
            mask[rows],
            config,
            context=LossContext(
                group_index=groups[rows],
                ref_logprobs=ref[rows],
                inputs={"positive": positive[rows], **inputs},
                **context,
            ),
        )

    whole = logprobs0.clone().requires_grad_()
    out_whole = run(slice(0, 16), whole, common)
    out_whole.loss.backward()
    split = logprobs0.clone().requires_grad_()
    outputs = [
        run(rows, split, common, {"num_valid_groups": float(valid)})
        for rows in (slice(0, 3), slice(3, 9), slice(9, 16))  # group boundaries
    ]
    sum(o.loss for o in outputs).backward()
    torch.testing.assert_close(sum(o.loss for o in outputs), out_whole.loss)
    torch.testing.assert_close(split.grad, whole.grad)
    assert whole.grad.abs().sum() > 0 and (whole.grad[~mask] == 0).all()
    merged, alone = reduce_metrics(outputs), out_whole.metrics
    for name in ("loss", "conspo_valid_groups", "conspo_discarded_groups", "conspo_score_gap", "conspo_infonce_acc"):
        assert merged[name].item() == pytest.approx(alone[name].item(), rel=1e-5, abs=1e-7), name
    assert merged["conspo_valid_groups"].item() == 3 and merged["conspo_discarded_groups"].item() == 2


def test_kl_term_is_the_one_of_the_other_losses():
    logprobs, behavior, mask, groups, positive, ref = _random_groups(1)
    extra = {}
    for name in ("conspo", "grpo"):
        losses = []
        for kl_coef in (0.0, 0.2):
            out = compute_policy_loss(
                logprobs,
                behavior,
                torch.zeros(len(groups)),
                mask,
                PolicyLossConfig(name=name, kl_coef=kl_coef),
                context=LossContext(group_index=groups, progress=0.5, ref_logprobs=ref, inputs={"positive": positive}),
            )
            losses.append(out.loss)
        extra[name] = losses[1] - losses[0]
    assert extra["conspo"].item() > 0
    torch.testing.assert_close(extra["conspo"], extra["grpo"])


def test_loss_needs_labels_groups_and_progress_and_rejects_token_ratio_options():
    logprobs, mask = _padded(TOKENS)
    with pytest.raises(ValueError, match="conspo needs LossContext.progress"):
        compute_policy_loss(
            logprobs,
            logprobs,
            torch.zeros(6),
            mask,
            PolicyLossConfig(name="conspo"),
            context=LossContext(group_index=torch.tensor(GROUPS)),
        )
    with pytest.raises(ValueError, match="loss.name=conspo needs the loss input 'positive'"):
        compute_policy_loss(
            logprobs,
            logprobs,
            torch.zeros(6),
            mask,
            PolicyLossConfig(name="conspo"),
            context=LossContext(group_index=torch.tensor(GROUPS), progress=0.5),
        )
    with pytest.raises(ValueError, match=r"LossContext.inputs\['positive'\] has shape"):
        _loss(logprobs, mask, PolicyLossConfig(name="conspo"), positive=[True, False])
    with pytest.raises(ValueError, match="veto"):
        _loss(logprobs, mask, PolicyLossConfig(name="conspo", veto_enabled=True))
    with pytest.raises(ValueError, match="tis_cap"):
        _loss(logprobs, mask, PolicyLossConfig(name="conspo", tis_cap=2.0))
    with pytest.raises(ValueError, match="progress must lie in"):
        LossContext(progress=1.5)


def test_config_demands_whole_groups_and_a_positive_rule_that_fits_the_rewards():
    shipped = load_config("configs/gsm8k-smollm2-conspo.yaml")
    main = load_config("configs/gsm8k-smollm2.yaml")
    assert shipped.loss.name == "conspo" and shipped.train.group_minibatches
    assert shipped.train.updates_per_stage == main.train.updates_per_stage
    assert shipped.generation == main.generation and shipped.train.lr == main.train.lr
    with pytest.raises(ConfigError, match="set train.group_minibatches=true"):
        load_config("configs/gsm8k-smollm2-conspo.yaml", ["train.group_minibatches=false"])
    with pytest.raises(ConfigError, match="reward.components is \\['format'\\]"):
        load_config(
            "configs/gsm8k-smollm2-conspo.yaml",
            [
                "loss.conspo.positive_rule=correctness",
                "loss.conspo.positive_threshold=null",
                "reward.components={format: 1.0}",
            ],
        )
    with pytest.raises(ConfigError, match="needs positive_threshold"):
        load_config("configs/gsm8k-smollm2-conspo.yaml", ["loss.conspo.positive_threshold=null"])
    with pytest.raises(ConfigError, match="only used with positive_rule=reward_threshold"):
        load_config("configs/gsm8k-smollm2-conspo.yaml", ["loss.conspo.positive_rule=correctness"])
    with pytest.raises(ValueError, match="group_minibatches"):
        TrainSpec(root="r", run_id=RUN, stage=0, policy_version=0, loss={"name": "conspo"})


def test_labels_come_from_the_rollout_rows(tmp_path, tiny_model_dir):
    store = Store(str(tmp_path))
    rows = synthetic_rollout_rows(tiny_model_dir, run_id=RUN, num_prompts=3, group_size=4, seed=2)
    rows[0]["reward_components"] = [("math_correctness", 1.0), ("format", 0.5)]
    rows[0]["reward"] = 1.5
    commit_rollouts(store, RUN, 0, rows)
    correctness = row_inputs(PolicyLossConfig(name="conspo"))
    data = load_rollouts(store, RUN, [0], skip_zero_variance_groups=True, row_inputs=correctness)
    key = {(r["prompt_id"], r["sample_idx"]): i for i, r in enumerate(rows)}  # load_rollouts sorts the rows
    order_of = [key[(r.prompt_id, r.sample_idx)] for r in data.rollouts]
    assert [r.inputs["positive"] for r in data.rollouts] == [rows[i]["reward"] >= 1.0 for i in order_of]
    threshold = row_inputs(
        PolicyLossConfig(name="conspo", conspo={"positive_rule": "reward_threshold", "positive_threshold": 1.2})
    )
    by_reward = load_rollouts(store, RUN, [0], skip_zero_variance_groups=True, row_inputs=threshold)
    assert [r.inputs["positive"] for r in by_reward.rollouts] == [i == 0 for i in order_of]
    assert by_reward.fingerprint != data.fingerprint  # a checkpoint is tied to its labels
    assert positive_labeler(PolicyLossConfig(name="mu_grpo")) is None and row_inputs(PolicyLossConfig()) == {}
    assert load_rollouts(store, RUN, [0], skip_zero_variance_groups=True).rollouts[0].inputs == {}

    order = make_minibatch_order(data, rollouts_per_update=8, group_minibatches=True, seed=0)
    indices = order.minibatch(0)
    group_of = {i: g for g, members in enumerate(data.groups) for i in members}
    stats = update_statistics([data.rollouts[i] for i in indices], [group_of[i] for i in indices])
    assert stats == {"num_valid_groups": 2.0}  # every synthetic group holds a 1 and a 0
    batch = collate([data.rollouts[i] for i in indices], [0] * 4 + [1] * 4, pad_token_id=2)
    assert batch.inputs["positive"].tolist() == [data.rollouts[i].inputs["positive"] for i in indices]
    assert batch.inputs["positive"].dtype == torch.bool

    rows[5]["reward_components"] = [("format", 0.0)]
    commit_rollouts(Store(str(tmp_path / "bad")), RUN, 0, rows)
    with pytest.raises(RolloutDataError, match=r"sample_idx=1: loss input 'positive': .*'math_correctness'"):
        load_rollouts(Store(str(tmp_path / "bad")), RUN, [0], skip_zero_variance_groups=True, row_inputs=correctness)


def _spec(root, **train) -> TrainSpec:
    settings = {"group_minibatches": True, "skip_zero_variance_groups": False, **train}
    # A large margin ramped over the whole run: every update has another m_t, so a wrong lambda on resume shows.
    loss = {"name": "conspo", "conspo": {"tau": 1.0, "margin": 1.0, "margin_alpha": 1.0}}
    return train_spec(root, RUN, total_updates=8, keep_checkpoints=2, train=settings, loss=loss)


def test_tiny_end_to_end_run_then_resume_from_a_checkpoint_is_exact(tmp_path, tiny_model_dir):
    """Train 4 updates on 6 groups of 4 (one all-negative group) with micro-batches of one group; then drop the last
    checkpoint, the published policy and the job manifest, and re-run: the job resumes after update 2 and
    reproduces updates 3-4 (loss, grad norm) and the final weights bit for bit."""
    root = tmp_path / "store"
    store, layout = Store(str(root)), RunLayout(RUN)
    commit_synthetic_stage(store, RUN, tiny_model_dir, num_prompts=6, group_size=4, seed=5, zero_variance_prompts=1)
    manifest = run_training(_spec(root))
    assert manifest.counts["updates"] == 4
    steps = read_table(store, layout.train_steps_part(0, 4), "train_steps").to_pydict()
    first = read_table(store, layout.train_steps_part(0, 2), "train_steps").to_pydict()
    assert all(math.isfinite(x) for x in first["loss"] + steps["loss"])
    assert all(g > 0 for g in first["grad_norm"] + steps["grad_norm"])  # 2 groups per update, at most 1 discarded
    metrics = [dict(m) for m in first["loss_metrics"] + steps["loss_metrics"]]  # ConSPO's metrics, per update
    assert all(m["conspo_valid_groups"] + m["conspo_discarded_groups"] == 2 for m in metrics)
    assert sum(m["conspo_discarded_groups"] for m in metrics[:3]) == 1  # epoch 1 draws the all-negative group once
    assert [m["conspo_progress"] for m in metrics] == [0.0, 1 / 8, 2 / 8, 3 / 8]
    assert [m["conspo_margin"] for m in metrics] == pytest.approx([margin_schedule(u / 8, 1.0, 1.0) for u in range(4)])
    before = load_file(str(store.local_path(layout.policy_dir(0)) / "model.safetensors"))
    after = load_file(str(store.local_path(layout.policy_dir(1)) / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it learned something

    store.delete(layout.checkpoint_dir(0, 4), recursive=True)
    store.delete(layout.policy_dir(1), recursive=True)
    store.delete(layout.job_manifest(0, "train"))
    resumed = run_training(_spec(root))
    assert resumed.counts["resumed_from"] == 2
    again = read_table(store, layout.train_steps_part(0, 4), "train_steps").to_pydict()
    assert again["loss"] == steps["loss"] and again["grad_norm"] == steps["grad_norm"]
    assert again["loss_metrics"] == steps["loss_metrics"]  # same lambda_t, margin and group counts after resume
    final = load_file(str(store.local_path(layout.policy_dir(1)) / "model.safetensors"))
    assert all(torch.equal(after[k], final[k]) for k in after)
    assert read_job_manifest(store, RUN, 0, "train").counts["resumed_from"] == 2


def test_micro_batches_of_one_or_two_groups_give_the_same_update(tmp_path, tiny_model_dir):
    """The trainer passes the whole update's valid-group count: micro-batches of one group (micro_batch_size 4) and
    of two groups (8) give the same loss, gradient norm and weights (see test_trainer's micro-batch test for the lr)."""
    commit_synthetic_stage(Store(str(tmp_path / "m4")), RUN, tiny_model_dir, num_prompts=4, group_size=4, seed=3)
    shutil.copytree(tmp_path / "m4", tmp_path / "m8")  # the very same committed rollouts
    results = {}
    for micro in (4, 8):
        root = tmp_path / f"m{micro}"
        run_training(_spec(root, updates_per_stage=2, micro_batch_size=micro, lr=1e-5))
        store, layout = Store(str(root)), RunLayout(RUN)
        steps = read_table(store, layout.train_steps_part(0, 2), "train_steps").to_pydict()
        results[micro] = (steps, load_file(str(store.local_path(layout.policy_dir(1)) / "model.safetensors")))
    (s4, w4), (s8, w8) = results[4], results[8]
    assert [dict(m)["conspo_valid_groups"] for m in s4["loss_metrics"]] == [2.0, 2.0]
    assert s4["loss"] == pytest.approx(s8["loss"], rel=1e-5) and s4["grad_norm"] == pytest.approx(
        s8["grad_norm"], rel=1e-5
    )
    for name in w4:
        torch.testing.assert_close(w4[name], w8[name], atol=1e-6, rtol=0)
