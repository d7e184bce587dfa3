"""``auto`` precision: one choice, made once at run start, recorded and kept for the run's life.

Three keys take ``auto`` (their default): ``model.dtype`` (the sampling and eval engines' weights),
``train.mixed_precision`` (the trainer's autocast) and ``train.checkpoint_dtype`` (what checkpoints and published
policies hold). A config that names its precision computes the same bits on any machine: an explicit
``model.dtype`` decides the train keys left at ``auto`` (:data:`FOLLOW_MODEL_DTYPE`), as it decides
``train.recompute_behavior_logprobs`` (:data:`FOLLOWERS`), and the hardware is not asked:

=====================  ===============================  ===============================
``model.dtype``        ``train.mixed_precision: auto``  ``train.checkpoint_dtype: auto``
=====================  ===============================  ===============================
``bfloat16``           ``bf16``                         ``bfloat16``
``float32``            ``no``                           ``float32``
``float16``            ``no`` (fp16 autocast is         ``float32`` (checkpoints hold
                       refused)                         fp32 or bf16)
=====================  ===============================  ===============================

Only when ``model.dtype`` itself is ``auto`` does the hardware decide, all ``auto`` keys together:

========================  ===============================  =========================
where bf16 is native      ``model.dtype: bfloat16``,       ``train.checkpoint_dtype:
(:func:`mugrpo.common.    ``train.mixed_precision: bf16``  bfloat16``
hardware.bf16_verdict`)
elsewhere                 ``float32``, ``no``              ``float32``
========================  ===============================  =========================

Were each ``auto`` key to ask the hardware on its own, a lab config (``model.dtype: float32`` with
``train.checkpoint_dtype: auto``) would round its weights and moments to bf16 at every checkpoint on a CPU with bf16
units and not on one without; tests/e2e/test_precision_machines.py runs one as both machines and compares the weights.

A new run resolves with this machine's verdict (:func:`resolve_precision`); its run.json records the resolved config
and a ``precision`` block with the source of each key, the reason and the probe figures (none when
``MUGRPO_AUTO_PRECISION`` pins the choice and no bf16 runs: the hardware decides nothing, and the command line then
imports no torch). A resumed run keeps what it
recorded: ``auto`` takes the stored value, whatever the resuming machine would pick; an explicit value that differs is
a semantic change and is refused like any other (:mod:`mugrpo.orchestration.resume`). A bf16 run on a machine that
emulates bf16, started explicitly or resumed there, runs with one loud warning that gives the measured slowdown
(:func:`emulation_warning`).

``auto`` exists in the config layer alone: job specs (:mod:`mugrpo.generation.spec`, :mod:`mugrpo.trainer.spec`,
:class:`mugrpo.evaluation.worker.EvalSpec`, :class:`mugrpo.execution.warm.SegmentSpec`) and the engines refuse it
(:func:`mugrpo.common.dtypes.torch_dtype`, :func:`mugrpo.common.dtypes.refuse_auto`); their ``from_config`` build
from :func:`concrete`.

The choice follows the field's practice on hardware with bf16 units (Kalamkar et al. 2019, arXiv 1905.12322: bf16
training matches fp32 with fp32 master weights; every GPU RL stack samples in bf16) and avoids its blind spot on CPUs
without them, where bf16 GEMMs fall back to scalar code (pytorch/pytorch#146508).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mugrpo.config.tree import Config

AUTO = "auto"
#: Each ``auto`` key and what it resolves to for the two choices.
CHOICES: dict[str, dict[str, str]] = {
    "model.dtype": {"bf16": "bfloat16", "fp32": "float32"},
    "train.mixed_precision": {"bf16": "bf16", "fp32": "no"},
    "train.checkpoint_dtype": {"bf16": "bfloat16", "fp32": "float32"},
}
#: What the train keys left at ``auto`` take from a ``model.dtype`` the config names (or the run recorded): the
#: precision a config names decides the rest, on any machine. float16 samples in fp16 and trains in fp32 with fp32
#: checkpoints: fp16 autocast is refused (loss scaling skips inf steps, which the job's NaN/inf guard stops on), and a
#: checkpoint holds fp32 or bf16; a config that wants bf16 training beside fp16 sampling says so.
FOLLOW_MODEL_DTYPE: dict[str, dict[str, str]] = {
    "bfloat16": {"train.mixed_precision": "bf16", "train.checkpoint_dtype": "bfloat16"},
    "float32": {"train.mixed_precision": "no", "train.checkpoint_dtype": "float32"},
    "float16": {"train.mixed_precision": "no", "train.checkpoint_dtype": "float32"},
}
#: ``auto`` keys that follow the resolved ``model.dtype`` rather than the hardware: recompute the behavior log-probs
#: with the trainer exactly when the engines sample in a dtype other than fp32 (docs/precision.md).
FOLLOWERS: dict[str, Any] = {"train.recompute_behavior_logprobs": lambda dtype: dtype != "float32"}
#: Resolved values that compute in bf16 (the emulation warning looks for these).
BF16_VALUES = {"bfloat16", "bf16"}


@dataclass(frozen=True)
class ResolvedPrecision:
    """A config with every ``auto`` precision key replaced, and the record run.json keeps of the choice.

    Attributes:
        config: the concrete config (no ``auto`` left in :data:`CHOICES`' keys).
        record: ``{"model.dtype": ..., "train.mixed_precision": ..., "train.checkpoint_dtype": ..., "requested":
            {key: value as written}, "source": {key: "auto" | "config" | "recorded" | "model.dtype"}, "reason": str,
            "hardware": Bf16Verdict.to_json(), or None where no probe ran}``.
        warning: the loud warning to print once (bf16 on a machine that emulates it), or None.
    """

    config: Config
    record: dict[str, Any] = field(default_factory=dict)
    warning: str | None = None


def _get(cfg: Config, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _with(cfg: Config, values: dict[str, Any]) -> Config:
    sections: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        section, name = key.split(".")
        sections.setdefault(section, {})[name] = value
    return cfg.model_copy(
        update={s: getattr(cfg, s).model_copy(update=fields) for s, fields in sections.items()}, deep=False
    )


#: The reason a record gives for keys set in the config and for keys kept from run.json.
_REASONS = {"config": "set in the config", "recorded": "kept from the run's start (run.json)"}


def resolve_precision(cfg: Config, stored: Config | None = None, verdict=None) -> ResolvedPrecision:
    """Replace ``auto`` in :data:`CHOICES`' keys of ``cfg``.

    Each key takes, in this order: its value in ``cfg`` (source ``"config"``); its value in ``stored`` (a resume:
    ``"recorded"``); for the train keys, what :data:`FOLLOW_MODEL_DTYPE` gives for the ``model.dtype`` settled so
    far (``"model.dtype"``); only what is left, the hardware's choice (``"auto"``: every key when ``model.dtype`` is
    ``auto`` in a new run).

    Args:
        cfg: the config as written (YAML + overrides).
        stored: the run's stored config when it continues (``auto`` takes its value), None for a new run.
        verdict: a :class:`mugrpo.common.hardware.Bf16Verdict` (default: this machine's, probed once per process
            when the hardware is asked or bf16 runs).

    Returns:
        The concrete config, the record for run.json, and the emulation warning if bf16 runs where it is emulated.
    """
    from mugrpo.common.hardware import auto_choice, bf16_verdict, pinned_choice

    requested = {key: _get(cfg, key) for key in CHOICES}
    values: dict[str, str] = {}
    source: dict[str, str] = {}
    for key, value in requested.items():
        if value != AUTO:
            values[key], source[key] = value, "config"
        elif stored is not None and _get(stored, key) != AUTO:
            values[key], source[key] = _get(stored, key), "recorded"
    follows = FOLLOW_MODEL_DTYPE.get(values.get("model.dtype", AUTO), {})
    for key, value in follows.items():
        if key not in values:
            values[key], source[key] = value, "model.dtype"
    autos = [k for k in requested if k not in values]
    uses_bf16 = any(v in BF16_VALUES for v in values.values())
    # The hardware is probed where it decides (an auto key, unless MUGRPO_AUTO_PRECISION pins the choice), where bf16
    # runs (the emulation warning), and on a resume (it records the resuming machine's verdict, unless pinned).
    hardware_decides = pinned_choice() is None
    probe = (autos and hardware_decides) or uses_bf16 or (stored is not None and hardware_decides)
    hardware = verdict if verdict is not None else (bf16_verdict() if probe else None)
    parts = [_REASONS[kind] for kind in _REASONS if kind in source.values()]
    followed = [k for k in CHOICES if source.get(k) == "model.dtype"]
    if followed:
        verb = "follows" if len(followed) == 1 else "follow"
        parts.append(f"{', '.join(followed)} {verb} model.dtype={values['model.dtype']}, not the hardware")
    if autos:
        choice, hardware_reason = auto_choice(hardware)
        for key in autos:
            values[key], source[key] = CHOICES[key][choice], AUTO
        parts.append(hardware_reason)
    record = {
        **values,
        "requested": requested,
        "source": source,
        "reason": "; ".join(parts),
        "hardware": hardware.to_json() if hardware is not None else None,
    }
    followers = {}
    for key, rule in FOLLOWERS.items():
        if _get(cfg, key) == AUTO:
            kept = _get(stored, key) if stored is not None else AUTO
            followers[key] = kept if kept != AUTO else rule(values["model.dtype"])
    record.update(followers)
    warning = emulation_warning(values, hardware)
    return ResolvedPrecision(_with(cfg, {**values, **followers}), record, warning)


def emulation_warning(values: dict[str, str], verdict) -> str | None:
    """The loud warning for bf16 keys on a machine without native bf16 (None when there is nothing to say)."""
    bf16 = [k for k, v in values.items() if v in BF16_VALUES]
    if not bf16 or verdict is None or verdict.native:
        return None
    slow = f"{verdict.slowdown:.0f}x slower than fp32 here" if verdict.slowdown else "emulated here"
    return (
        f"WARNING: {', '.join(f'{k}={values[k]}' for k in bf16)} runs bf16 on a machine without bf16 units: "
        f"bf16 is {slow} ({verdict.reason}). Expect this run to be that much slower. A new run with "
        "model.dtype, train.mixed_precision and train.checkpoint_dtype left at auto would run fp32 here."
    )


def concrete(cfg: Config) -> Config:
    """``cfg`` with no ``auto`` precision left (resolved as a new run on this machine would:
    :func:`resolve_precision`); ``cfg`` itself when it has none.

    The job specs' ``from_config`` call this, so a spec built from a config outside a run (a bench, a test) is
    concrete too (the specs themselves refuse ``auto``); inside a run the flow passes the config
    :func:`resolve_precision` made at its start, and this returns it unchanged."""
    if all(_get(cfg, key) != AUTO for key in [*CHOICES, *FOLLOWERS]):
        return cfg
    return resolve_precision(cfg).config


def describe(record: dict[str, Any]) -> str:
    """One line for the run's start: the resolved values and why."""
    values = ", ".join(f"{k}={record[k]}" for k in CHOICES)
    return f"precision: {values} ({record.get('reason', '')})"
