"""Per-token KL estimators (Schulman 2020, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html)."""

from __future__ import annotations

from collections.abc import Callable

from mugrpo.common.lazy import torch

# Bound on |log r| before exp: r in [2.1e-9, 4.9e8] (verl uses the same bound); keeps fp32 finite.
LOG_RATIO_CLAMP = 20.0

KLEstimatorFn = Callable[["torch.Tensor"], "torch.Tensor"]
KL_ESTIMATORS: dict[str, KLEstimatorFn] = {}


def _register(name: str) -> Callable[[KLEstimatorFn], KLEstimatorFn]:
    def add(fn: KLEstimatorFn) -> KLEstimatorFn:
        KL_ESTIMATORS[name] = fn
        return fn

    return add


@_register("k1")
def _k1(log_r: torch.Tensor) -> torch.Tensor:
    """k1 = -log r: unbiased, high variance, can be negative."""
    return -log_r


@_register("k2")
def _k2(log_r: torch.Tensor) -> torch.Tensor:
    """k2 = (log r)^2 / 2: biased, low variance, >= 0."""
    return 0.5 * log_r.square()


@_register("k3")
def _k3(log_r: torch.Tensor) -> torch.Tensor:
    """k3 = (r - 1) - log r: unbiased, low variance, >= 0 (the estimator of GRPO, arXiv 2402.03300, Eq. 4)."""
    log_r = log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.expm1(log_r) - log_r


def kl_estimate(sample_logprobs: torch.Tensor, other_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(p || q) from tokens sampled from p.

    Args:
        sample_logprobs: [B, T] log p(x_t) of the sampled tokens under p (e.g. pi_theta for the reference
            penalty; the behavior policy for the drift metric).
        other_logprobs: [B, T] log q(x_t) under q (e.g. the reference policy), same shape.
        estimator: "k1", "k2" or "k3"; with r = q(x) / p(x): k1 = -log r, k2 = (log r)^2 / 2,
            k3 = (r - 1) - log r.

    Returns:
        [B, T] per-token estimates (differentiable in both inputs); average them over tokens for the KL.

    Raises:
        ValueError: unknown estimator or mismatched shapes.
    """
    try:
        fn = KL_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown kl_estimator {estimator!r}; known: {', '.join(sorted(KL_ESTIMATORS))}") from None
    if sample_logprobs.shape != other_logprobs.shape:
        raise ValueError(f"log-prob shapes differ: {tuple(sample_logprobs.shape)} vs {tuple(other_logprobs.shape)}")
    return fn(other_logprobs - sample_logprobs)
