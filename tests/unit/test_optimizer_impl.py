"""train.optimizer_impl: which torch AdamW implementation the trainer builds, and that auto (the default: torch's
choice, the for-loop step on the CPU) and foreach take bitwise the steps of the for-loop implementation while fused
stays within round-off of them."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from mugrpo.config import TrainSection
from mugrpo.trainer.optim import build_optimizer


def _steps(impl: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in ((64, 32), (32,), (7, 5, 3))]
    optimizer = build_optimizer(params, TrainSection(lr=1e-3, weight_decay=0.01, optimizer_impl=impl))
    for _ in range(4):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()
    return [p.detach() for p in params]


def test_the_default_is_torchs_choice_and_each_name_picks_its_implementation():
    assert TrainSection().optimizer_impl == "auto"
    params = [torch.nn.Parameter(torch.zeros(3))]
    cases = (("auto", None, None), ("for-loop", False, None), ("foreach", True, None), ("fused", None, True))
    for impl, foreach, fused in cases:
        defaults = build_optimizer(params, TrainSection(optimizer_impl=impl)).defaults
        assert (defaults["foreach"], defaults["fused"]) == (foreach, fused), impl


def test_auto_and_foreach_are_bitwise_the_for_loop_and_fused_is_within_round_off():
    loop, auto, foreach, fused = _steps("for-loop"), _steps("auto"), _steps("foreach"), _steps("fused")
    assert all(torch.equal(a, b) for a, b in zip(loop, auto, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(loop, foreach, strict=True))
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(loop, fused, strict=True))


def test_an_unknown_implementation_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="optimizer_impl"):
        TrainSection(optimizer_impl="apex")
