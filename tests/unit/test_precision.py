"""bf16 mixed precision: fp32 log-probs and loss under autocast, fp32 master weights and AdamW moments,
a bf16 tiny-model run end to end (generate, train, eval) with the update-1 ratio at 1, and the ratio statistics.

Training jobs with bf16 run in their own process: accelerate's AcceleratorState is a per-process singleton whose
mixed precision cannot change once set (other tests run fp32 training in the pytest process).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from _tiny import DEFAULT, REPO_ROOT, job_env, tiny_config, write_spec
from safetensors.torch import load_file

from mugrpo.config import Config
from mugrpo.engines.transformers_engine import TransformersEngine
from mugrpo.evaluation.worker import EvalSpec, run_eval
from mugrpo.generation import GenerateSpec, run_generate
from mugrpo.losses import LossContext, PolicyLossConfig, compute_policy_loss
from mugrpo.policy.models import load_policy
from mugrpo.storage.layout import RunLayout
from mugrpo.storage.store import Store
from mugrpo.trainer.batch import collate
from mugrpo.trainer.data import load_rollouts
from mugrpo.trainer.forward import PolicyTokenLogprobs
from mugrpo.trainer.precision import autocast_context, check_fp32_master, ratio_stats
from mugrpo.trainer.spec import TrainSpec

RUN = "bf16-test"


@pytest.fixture
def rollouts(tmp_path, tiny_model_dir):
    """8 committed synthetic rollouts (real tokens, fp32 teacher-forced behavior log-probs) and their store."""
    from bench.support.synthetic import commit_synthetic_stage

    store = Store(str(tmp_path / "store"))
    commit_synthetic_stage(store, RUN, tiny_model_dir, num_prompts=2, group_size=4, seed=3, response_tokens=(4, 24))
    return load_rollouts(store, RUN, [0], skip_zero_variance_groups=False)


def test_logprobs_and_loss_are_fp32_under_bf16_autocast(tiny_model_dir, rollouts):
    """The decoder's matmuls run in bf16 (their outputs are bf16) while the gathered log-probs, entropies, the
    loss and every gradient are fp32; the values stay close to the fp32 ones but are not bitwise equal."""
    policy, _ = load_policy(tiny_model_dir)
    model = PolicyTokenLogprobs(policy.train())
    batch = collate(rollouts.rollouts, [0] * len(rollouts.rollouts), pad_token_id=2)
    linear_dtypes = []
    hook = (
        policy.get_decoder()
        .layers[0]
        .mlp.down_proj.register_forward_hook(lambda module, args, out: linear_dtypes.append(out.dtype))
    )
    with torch.no_grad():
        reference, _ = model(batch, return_entropy=False)
    with autocast_context("cpu", "bf16"):
        logprobs, entropy = model(batch)
        out = compute_policy_loss(
            logprobs,
            batch.behavior_logprobs,
            batch.advantages,
            batch.response_mask,
            PolicyLossConfig(name="mu_grpo"),
            context=LossContext(global_num_tokens=float(batch.response_mask.sum()), global_num_seqs=8.0),
        )
    hook.remove()
    assert linear_dtypes == [torch.float32, torch.bfloat16]  # fp32 pass, then the autocast pass in bf16
    assert logprobs.dtype == entropy.dtype == out.loss.dtype == torch.float32
    mask = batch.response_mask
    gap = (logprobs.detach() - reference)[mask].abs().max().item()
    assert 0 < gap < 0.5  # bf16 really ran (not bitwise fp32), and stays near fp32
    out.loss.backward()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    check_fp32_master(model.parameters(), optimizer)  # fp32 gradients
    optimizer.step()
    check_fp32_master(model.parameters(), optimizer)  # fp32 AdamW moments
    assert all(s["exp_avg_sq"].dtype == torch.float32 for s in optimizer.state.values())


def test_check_fp32_master_names_what_is_not_fp32():
    layer = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(layer.parameters())
    layer(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    check_fp32_master(layer.parameters(), optimizer)
    optimizer.state[layer.weight]["exp_avg"] = optimizer.state[layer.weight]["exp_avg"].bfloat16()
    with pytest.raises(TypeError, match=r"optimizer state 'exp_avg' of parameter #0 \(4, 4\) has dtype torch.bfloat16"):
        check_fp32_master(layer.parameters(), optimizer)
    layer.bfloat16()
    with pytest.raises(TypeError, match=r"parameter #0 \(4, 4\) has dtype torch.bfloat16; master weights"):
        check_fp32_master(layer.parameters(), torch.optim.AdamW(layer.parameters()))


def test_ratio_stats():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -30.0, 0.0]])
    behavior = torch.tensor([[-1.0, -2.0, -3.5], [-1.0, -2.0, 5.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    s = ratio_stats(logprobs, behavior, mask)
    assert s.num_tokens == 5 and s.below_veto_delta == 1  # exp(-28) < 1e-4; the masked token is ignored
    assert s.max_abs_log_ratio == pytest.approx(28.0) and s.ratio_max == pytest.approx(torch.e**0.5)
    assert s.ratio_mean == pytest.approx((3 + torch.e**0.5 + torch.e**-28) / 5)
    assert s.ratio_p1 < 1 < s.ratio_p99
    with pytest.raises(ValueError, match="selects no token"):
        ratio_stats(logprobs, behavior, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="same shape"):
        ratio_stats(logprobs, behavior[:, :2], mask)


def test_bf16_engine_logprobs_are_fp32_and_fp32_logits_are_closer(tiny_model_dir):
    """A bf16 engine samples with fp32 log-probs; with an fp32 LM head (``fp32_logits``) they are closer to the
    fp32 teacher-forced log-probs of the same tokens than with bf16-rounded logits."""
    from mugrpo.engines import SamplingParams
    from mugrpo.policy.models import response_logprobs

    prompts = [[1, 504, 3458, 314], [1, 9216, 28, 314, 2418]]
    params = SamplingParams(temperature=1.0, max_new_tokens=12, n=2, seed=4)
    fp32_model, _ = load_policy(tiny_model_dir)
    errors = {}
    for fp32_logits in (False, True):
        engine = TransformersEngine.from_dir(tiny_model_dir, dtype="bfloat16", fp32_logits=fp32_logits)
        assert engine.model.dtype == torch.bfloat16
        groups = engine.generate(prompts, params)
        samples = [(p, s) for p, g in zip(prompts, groups, strict=True) for s in g]
        reference = response_logprobs(fp32_model, [p for p, _ in samples], [s.response_token_ids for _, s in samples])
        got = torch.tensor([lp for _, s in samples for lp in s.behavior_logprobs], dtype=torch.float64)
        want = torch.tensor([lp for r in reference for lp in r], dtype=torch.float64)
        errors[fp32_logits] = (got - want).abs().mean().item()
        engine.close()
    assert 0 < errors[True] < errors[False] < 0.5, errors


def _bf16_config(root: Path, tiny_model_dir: Path, **train) -> Config:
    raw = tiny_config(
        root,
        tiny_model_dir,
        run_id=RUN,
        run={"num_stages": 1},
        model={"dtype": "bfloat16"},
        data={"train": {"limit": DEFAULT}},
        generation={"sampling": {"max_new_tokens": 8}},
        loss={"name": "mu_grpo", "veto_delta": 1e-4},
        train={
            "updates_per_stage": 2,
            "rollouts_per_update": 2,  # 4 of the stage's 8 rollouts are trained on (and recomputed)
            "checkpoint_every": 2,
            "mixed_precision": "bf16",
            "checkpoint_dtype": "float32",  # explicit: left at auto it would follow model.dtype to bf16 checkpoints
            **train,
        },
        eval={"every_stage": DEFAULT},
        orchestration=DEFAULT,
    )
    return Config.model_validate(raw)


@pytest.mark.slow
def test_bf16_run_end_to_end_has_update1_ratio_one(tmp_path, tiny_model_dir):
    """Generate (bf16 engine) -> train (bf16 autocast, recomputed behavior log-probs) -> eval (bf16 engine).

    With ``recompute_behavior_logprobs`` the behavior log-probs are the trainer's own, computed under the same
    autocast: the update-1 ratio is 1 within 1e-6 (measured: exactly 1), so the veto cannot fire at update 1. The
    published policy, the checkpoint's weights and AdamW moments are fp32.
    """
    root = tmp_path / "store"
    # The tiny random policy earns reward 0 everywhere (zero advantages, zero policy gradient): weight decay moves
    # the weights so that update 2 sees a changed policy.
    cfg = _bf16_config(root, tiny_model_dir, recompute_behavior_logprobs=True, weight_decay=0.1)
    store, layout = Store(str(root)), RunLayout(RUN)
    store.upload_dir(tiny_model_dir, layout.policy_dir(0))
    run_generate(GenerateSpec.from_config(cfg, 0, 0))
    spec_path = write_spec(TrainSpec.from_config(cfg, 0, 0), tmp_path / "train.spec.json")
    proc = subprocess.run(
        [sys.executable, "-m", "mugrpo.jobs.train", str(spec_path)],
        env=job_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    steps = pq.read_table(store.local_path(layout.train_steps_dir(0))).sort_by("stage_update").to_pydict()
    assert steps["ratio_mean"][0] == pytest.approx(1.0, abs=1e-6)
    assert steps["ratio_max"][0] == pytest.approx(1.0, abs=1e-6)
    assert steps["veto_token_frac"][0] == 0.0 and abs(steps["approx_kl_behavior"][0]) < 1e-6
    assert steps["approx_kl_behavior"][1] != 0  # update 2 sees a changed policy

    before = load_file(str(store.local_path(layout.policy_dir(0)) / "model.safetensors"))
    after = load_file(str(store.local_path(layout.policy_dir(1)) / "model.safetensors"))
    assert {t.dtype for t in after.values()} == {torch.float32}  # fp32 master weights published
    assert any(not torch.equal(before[k], after[k]) for k in before)
    optimizer_state = torch.load(
        store.local_path(layout.checkpoint_dir(0, 2)) / "optimizer.pt", map_location="cpu", weights_only=True
    )
    moments = [t for t in _tensors(optimizer_state["state"]) if t.dim() > 0]  # exp_avg, exp_avg_sq per parameter
    assert len(moments) == 2 * len(before) and {t.dtype for t in moments} == {torch.float32}

    run_eval(EvalSpec.from_config(cfg, 1))
    evals = pq.read_table(store.local_path(layout.evals_dir(1)))
    assert evals.num_rows == 2


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _tensors(v)
