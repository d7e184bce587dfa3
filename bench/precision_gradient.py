"""Is the bf16-autocast policy gradient the fp32 one? Cosine and relative error on real rollouts, one invocation.

    python bench/precision_gradient.py runs/RUN                 # stage 0 rollouts and policy of a run
    python bench/precision_gradient.py runs/RUN --stage 1 --minibatches 4 --threads 1

For each of ``--minibatches`` minibatches of a committed stage (the training job's seeded order, micro-batches of
4), the Mu-GRPO loss gradient at the stage's behavior policy is computed twice from the same fp32 master weights:
in fp32, and under bf16 autocast (the job's ``train.mixed_precision: bf16``), each against its own recomputed
behavior log-probs (ratio 1, as ``recompute_behavior_logprobs`` gives at update 1). The advantages are the
rollouts' own, or, where a minibatch carries none (a stage without reward variance), seeded +-1 per response so
that there is a gradient to compare. Reported: cosine(g_bf16, g_fp32), ||g_bf16 - g_fp32|| / ||g_fp32|| and the
norms, per minibatch; for scale, the same two numbers between the fp32 gradients of the two halves of each
minibatch (how much the gradient changes with the data, not the precision). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import torch


def flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).double()


def gradient(model, batches, loss_config, num_tokens: int, num_seqs: int, mixed_precision: str) -> torch.Tensor:
    """Flat fp64 copy of d(loss)/d(params) over ``batches`` (global-count normalized, as the job does)."""
    from mugrpo.losses import LossContext, compute_policy_loss
    from mugrpo.trainer.precision import autocast_context

    model.zero_grad(set_to_none=True)
    for batch in batches:
        with autocast_context("cpu", mixed_precision):
            logprobs, entropy = model(batch)
        behavior = logprobs.detach()  # recomputed behavior log-probs: ratio 1, as at update 1
        out = compute_policy_loss(
            logprobs,
            behavior,
            batch.advantages,
            batch.response_mask,
            loss_config,
            context=LossContext(global_num_tokens=float(num_tokens), global_num_seqs=float(num_seqs), entropy=entropy),
        )
        out.loss.backward()
    return flat_grad(model)


def compare(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    return {
        "cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=0)),
        "rel_error": float((a - b).norm() / b.norm()),
        "norm_a": float(a.norm()),
        "norm_b": float(b.norm()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a run folder (runs/RUN) with committed rollouts and policies")
    ap.add_argument("--stage", type=int, default=0)
    ap.add_argument("--minibatches", type=int, default=2)
    ap.add_argument("--rollouts-per-update", type=int, default=8)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)

    from mugrpo.losses import PolicyLossConfig
    from mugrpo.policy.models import load_policy
    from mugrpo.storage.store import Store
    from mugrpo.trainer.batch import collate
    from mugrpo.trainer.data import load_rollouts, make_minibatch_order, split_minibatch
    from mugrpo.trainer.forward import PolicyTokenLogprobs

    run_dir = Path(args.run_dir).resolve()
    store = Store(str(run_dir.parent))
    data = load_rollouts(store, run_dir.name, [args.stage], skip_zero_variance_groups=False)
    rng = np.random.default_rng(0)
    if not any(r.advantage for r in data.rollouts):
        data.rollouts = [dataclasses.replace(r, advantage=float(rng.choice([-1.0, 1.0]))) for r in data.rollouts]
    order = make_minibatch_order(data, rollouts_per_update=args.rollouts_per_update, group_minibatches=False, seed=0)
    policy, tokenizer = load_policy(run_dir / "policies" / f"stage={args.stage}")
    model = PolicyTokenLogprobs(policy.train())
    loss_config = PolicyLossConfig(name="mu_grpo")
    results = []
    for u in range(args.minibatches):
        indices = order.minibatch(u)
        micro = split_minibatch(
            indices, data, micro_batch_size=args.micro_batch_size, rank=0, world_size=1, keep_groups=False
        )
        batches = [collate([data.rollouts[i] for i in mb], [0] * len(mb), tokenizer.pad_token_id) for mb in micro]
        tokens = sum(data.rollouts[i].num_tokens for i in indices)
        seqs = len(indices)
        g32 = gradient(model, batches, loss_config, tokens, seqs, "no")
        g16 = gradient(model, batches, loss_config, tokens, seqs, "bf16")
        half = len(batches) // 2
        halves = (
            compare(
                gradient(model, batches[:half], loss_config, tokens, seqs, "no"),
                gradient(model, batches[half:], loss_config, tokens, seqs, "no"),
            )
            if half
            else None
        )
        row = {"minibatch": u, "tokens": tokens, "bf16_vs_fp32": compare(g16, g32), "fp32_half_vs_half": halves}
        results.append(row)
        b = row["bf16_vs_fp32"]
        line = (
            f"minibatch {u} ({tokens} tokens): bf16 vs fp32 cosine {b['cosine']:.5f}, rel. error {b['rel_error']:.4f}, "
            f"norms {b['norm_a']:.4g} / {b['norm_b']:.4g}"
        )
        if halves:
            line += f" | fp32 half vs half: cosine {halves['cosine']:.4f}, rel. difference {halves['rel_error']:.3f}"
        print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
