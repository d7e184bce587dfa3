"""The generic plug-in registry (mugrpo.common.registry) and that every kind of plug-in uses it."""

import pytest

from mugrpo.common.registry import Registry, UnknownNameError
from mugrpo.engines import ROLLOUT_ENGINES, load_builtin_engines
from mugrpo.losses import POLICY_LOSSES
from mugrpo.rewards import REWARD_FUNCTIONS
from mugrpo.schedules.lr import LR_SCHEDULES
from mugrpo.schedules.stages import STAGE_SCHEDULES
from mugrpo.scoring.advantages import ADVANTAGE_ESTIMATORS
from tasks.launchers.protocol import LAUNCHERS


def _square(x: float) -> float:
    return x * x


def test_lookup_iteration_and_unknown_names():
    reg: Registry = Registry("widget")
    reg.register("square")(_square)
    reg.register("abs")(abs)
    assert reg["square"] is _square and list(reg) == ["abs", "square"] and len(reg) == 2 and "abs" in reg
    assert reg.get("cube") is None  # Mapping.get keeps its meaning
    with pytest.raises(UnknownNameError) as info:
        reg["sqare"]
    assert str(info.value) == "unknown widget 'sqare' (did you mean 'square'?); registered: abs, square"
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert str(pytest.raises(UnknownNameError, lambda: Registry("gadget")["x"]).value).endswith("registered: none")


def test_reregistration_rules():
    reg: Registry = Registry("widget")
    reg.register("square")(_square)
    reg.register("square")(_square)  # the same object again: fine

    def _square_copy(x: float) -> float:  # a different definition under a taken name: refused
        return x * x

    with pytest.raises(ValueError, match="widget 'square' is already registered to .*test_registry._square"):
        reg.register("square")(_square_copy)
    # The same definition loaded twice (its module run once as __main__) replaces the entry.
    twin = type(_square)(_square.__code__, {}, "_square")
    twin.__module__, twin.__qualname__ = "__main__", _square.__qualname__
    assert reg.register("square")(twin) is twin and reg["square"] is twin
    with pytest.raises(ValueError, match="non-empty name"):
        reg.register("")
    assert reg.unregister("square") is twin and "square" not in reg
    with pytest.raises(UnknownNameError):
        reg.unregister("square")


def test_every_plugin_kind_is_a_registry_with_its_builtins():
    load_builtin_engines()
    builtins = {
        "policy loss": (POLICY_LOSSES, {"grpo", "mu_grpo", "gspo"}),
        "advantage estimator": (ADVANTAGE_ESTIMATORS, {"grpo", "dr_grpo"}),
        "reward component": (REWARD_FUNCTIONS, {"math_correctness", "format"}),
        "rollout engine": (ROLLOUT_ENGINES, {"transformers", "vllm"}),
        "lr schedule": (LR_SCHEDULES, {"constant", "cosine", "linear"}),
        "launcher": (LAUNCHERS, {"subprocess", "kubernetes"}),
        "stage schedule": (STAGE_SCHEDULES, {"constant", "per_stage"}),
    }
    for kind, (registry, names) in builtins.items():
        assert isinstance(registry, Registry) and registry.kind == kind
        assert names <= set(registry), (kind, list(registry))
