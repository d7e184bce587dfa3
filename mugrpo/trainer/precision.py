"""Trainer precision: bf16 autocast over fp32 master weights, its checks, and the sampler-vs-trainer ratio stats.

Mixed precision as in Micikevicius et al. 2018 ("Mixed Precision Training", arXiv 1710.03740) with bf16 instead of
fp16 (no loss scaling: bf16 has fp32's exponent range). The policy's parameters, their gradients and AdamW's
moments stay fp32 ("master weights"); ``torch.autocast`` runs the decoder's matmuls (linear, attention) in bf16
and keeps fp32 what it lists as fp32 ops. The LM-head projection, log-softmax and log-prob gather
(:func:`mugrpo.policy.logprobs.token_logprobs_from_hidden`), the loss and every reduction run outside autocast in fp32.

On CPU, accelerate's ``Accelerator(mixed_precision="bf16")`` is exactly ``torch.autocast("cpu", dtype=bfloat16)``
(accelerate 1.x sets ``native_amp`` for CPU and wraps the prepared model's forward in that context);
:func:`autocast_context` gives the same context to code that holds no accelerator (benches, the trainer's log-prob
recomputation on an unprepared model).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

#: ``train.mixed_precision`` -> autocast dtype (None = no autocast, plain fp32).
AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"no": None, "bf16": torch.bfloat16}


def autocast_context(device_type: str, mixed_precision: str) -> contextlib.AbstractContextManager:
    """The autocast context of ``train.mixed_precision`` on ``device_type`` ("cpu", "cuda", ...).

    Raises:
        ValueError: ``mixed_precision`` is not a key of :data:`AUTOCAST_DTYPES` (fp16 is refused: see TrainSpec).
    """
    if mixed_precision not in AUTOCAST_DTYPES:
        raise ValueError(f"mixed_precision must be one of {sorted(AUTOCAST_DTYPES)}, got {mixed_precision!r}")
    dtype = AUTOCAST_DTYPES[mixed_precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def batch_invariant_attention(device_type: str) -> contextlib.AbstractContextManager:
    """On CPU, restrict ``scaled_dot_product_attention`` to its math backend; elsewhere do nothing.

    PyTorch's CPU flash-attention kernel tiles the query and key axes by the padded sequence length, so under
    bf16 autocast a response's log-probs change with the micro-batch it is padded into (measured on SmolLM2-135M:
    up to 0.0046 nats between batchings, 0.056 over a 2,000-token stage). The math backend computes each row the
    same way whatever the padding, which makes the trainer's recomputed behavior log-probs
    (``train.recompute_behavior_logprobs``) bitwise equal to the first update's log-probs, so the update-1 ratio
    is exactly 1. It was as fast as flash attention for a SmolLM2 forward + backward of 4 x 162 tokens on CPU.
    On GPUs the math backend would materialize [B, H, L, L] scores: this context leaves them alone.
    """
    if device_type != "cpu":
        return contextlib.nullcontext()
    return sdpa_kernel(SDPBackend.MATH)


def recompute_context_fn(module: torch.nn.Module):
    """``context_fn`` for non-reentrant activation checkpointing: the recomputation in backward runs under
    :func:`batch_invariant_attention` too (the forward already does, inside ``PolicyTokenLogprobs``), so the
    recomputed activations are the forward's (torch.utils.checkpoint checks their metadata).

    Returns:
        a callable giving (forward context, recomputation context); the device is read at call time.
    """

    def context_fn():
        device_type = next(module.parameters()).device.type
        return contextlib.nullcontext(), batch_invariant_attention(device_type)

    return context_fn


def check_fp32_master(parameters: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> None:
    """Check that trainable parameters, their gradients and the optimizer's floating-point state are fp32.

    Mixed precision keeps fp32 master weights and fp32 AdamW moments (arXiv 1710.03740, Sec. 3.1): a bf16 master
    copy would round away updates smaller than 2^-8 of a weight, and bf16 second moments lose small gradients.

    Args:
        parameters: the model's parameters (those with ``requires_grad`` are checked).
        optimizer: the optimizer (accelerate's wrapper or the torch one); its ``state`` tensors are checked
            (AdamW's ``step`` counter is a float32 scalar too).

    Raises:
        TypeError: naming the first parameter, gradient or optimizer state entry that is not float32.
    """
    names = {}
    params = [p for p in parameters if p.requires_grad]
    for i, p in enumerate(params):
        names[id(p)] = f"parameter #{i} {tuple(p.shape)}"
        if p.dtype != torch.float32:
            raise TypeError(f"{names[id(p)]} has dtype {p.dtype}; master weights must be float32")
        if p.grad is not None and p.grad.dtype != torch.float32:
            raise TypeError(f"gradient of {names[id(p)]} has dtype {p.grad.dtype}; expected float32")
    inner = getattr(optimizer, "optimizer", optimizer)
    for param, state in inner.state.items():
        for key, value in state.items():
            if torch.is_tensor(value) and value.is_floating_point() and value.dtype != torch.float32:
                where = names.get(id(param), f"a parameter {tuple(param.shape)}")
                raise TypeError(f"optimizer state {key!r} of {where} has dtype {value.dtype}; expected float32")


@dataclass(frozen=True)
class RatioStats:
    """Token-level importance ratios r = exp(logprob - behavior_logprob) over the masked response tokens.

    Attributes:
        num_tokens: tokens counted.
        ratio_mean: mean of r.
        ratio_p1, ratio_p99: 1st and 99th percentiles of r (linear interpolation).
        ratio_min, ratio_max: extremes of r.
        max_abs_log_ratio: max |log r| (nats).
        mean_abs_log_ratio: mean |log r| (nats).
        below_veto_delta: tokens with r < veto_delta (the Mu-GRPO veto's trigger condition, whatever the sign of
            the advantage: an upper bound of the triggers).
    """

    num_tokens: int
    ratio_mean: float
    ratio_p1: float
    ratio_p99: float
    ratio_min: float
    ratio_max: float
    max_abs_log_ratio: float
    mean_abs_log_ratio: float
    below_veto_delta: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def ratio_stats(
    logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, mask: torch.Tensor, *, veto_delta: float = 1e-4
) -> RatioStats:
    """Importance-ratio statistics of one policy's log-probs against the behavior log-probs of the same tokens.

    At update 1 of a stage the policy is the behavior policy, so every ratio is 1 up to numerics: this measures
    the sampler-vs-trainer mismatch (Yao et al. 2025; Qi et al. 2025, "Defeating the Training-Inference Mismatch
    via FP16", arXiv 2510.26788).

    Args:
        logprobs: [B, R] (or any shape) log pi_theta(token) in nats.
        behavior_logprobs: same shape, log pi_behav(token).
        mask: same shape, bool; True on real response tokens.
        veto_delta: the veto threshold delta (``loss.veto_delta``).

    Raises:
        ValueError: shapes differ or the mask selects no token.
    """
    if not logprobs.shape == behavior_logprobs.shape == mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, behavior_logprobs {tuple(behavior_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must have the same shape"
        )
    log_ratio = (logprobs.double() - behavior_logprobs.double())[mask.bool()]
    if log_ratio.numel() == 0:
        raise ValueError("the mask selects no token")
    ratio = log_ratio.exp()
    quantiles = torch.quantile(ratio, torch.tensor([0.01, 0.99], dtype=torch.float64))
    return RatioStats(
        num_tokens=int(log_ratio.numel()),
        ratio_mean=float(ratio.mean()),
        ratio_p1=float(quantiles[0]),
        ratio_p99=float(quantiles[1]),
        ratio_min=float(ratio.min()),
        ratio_max=float(ratio.max()),
        max_abs_log_ratio=float(log_ratio.abs().max()),
        mean_abs_log_ratio=float(log_ratio.abs().mean()),
        below_veto_delta=int((ratio < veto_delta).sum()),
    )
