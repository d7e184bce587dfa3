"""``auto`` precision: one choice, made once at run start from the hardware, recorded and kept for the run's life.

Three keys take ``auto`` (their default): ``model.dtype`` (the sampling and eval engines' weights),
``train.mixed_precision`` (the trainer's autocast) and ``train.checkpoint_dtype`` (what checkpoints and published
policies hold). ``auto`` resolves all three together:

========================  ===============================  =========================
where bf16 is native      ``model.dtype: bfloat16``,       ``train.checkpoint_dtype:
(:func:`mugrpo.common.    ``train.mixed_precision: bf16``  bfloat16``
hardware.bf16_verdict`)
elsewhere                 ``float32``, ``no``              ``float32``
========================  ===============================  =========================

A new run resolves with this machine's verdict (:func:`resolve_precision`); its run.json records the resolved config
and a ``precision`` block with the reason and the probe figures. A resumed run keeps what it recorded: ``auto`` takes
the stored value, whatever the resuming machine would pick; an explicit value that differs is a semantic change and is
refused like any other (:mod:`mugrpo.orchestration.resume`). A bf16 run on a machine that emulates bf16, started
explicitly or resumed there, runs with one loud warning that gives the measured slowdown (:func:`emulation_warning`).

The choice follows the field's practice on hardware with bf16 units (Kalamkar et al. 2019, arXiv 1905.12322: bf16
training matches fp32 with fp32 master weights; every GPU RL stack samples in bf16) and avoids its blind spot on CPUs
without them, where bf16 GEMMs fall back to scalar code (pytorch/pytorch#146508).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mugrpo.config.tree import Config

AUTO = "auto"
#: Set by the process that printed the precision line and its warning before the run flow started (the command line),
#: so that the flow, in the same process, does not print them a second time.
SHOWN_ENV = "MUGRPO_PRECISION_SHOWN"
#: Each ``auto`` key and what it resolves to for the two choices.
CHOICES: dict[str, dict[str, str]] = {
    "model.dtype": {"bf16": "bfloat16", "fp32": "float32"},
    "train.mixed_precision": {"bf16": "bf16", "fp32": "no"},
    "train.checkpoint_dtype": {"bf16": "bfloat16", "fp32": "float32"},
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
            {key: value as written}, "source": {key: "auto" | "config" | "recorded"}, "reason": str,
            "hardware": Bf16Verdict.to_json() or None}``.
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


def resolve_precision(cfg: Config, stored: Config | None = None, verdict=None) -> ResolvedPrecision:
    """Replace ``auto`` in :data:`CHOICES`' keys of ``cfg``.

    Args:
        cfg: the config as written (YAML + overrides).
        stored: the run's stored config when it continues (``auto`` takes its value), None for a new run.
        verdict: a :class:`mugrpo.common.hardware.Bf16Verdict` (default: this machine's, probed once per process).

    Returns:
        The concrete config, the record for run.json, and the emulation warning if bf16 runs where it is emulated.
    """
    from mugrpo.common.hardware import auto_choice, bf16_verdict

    requested = {key: _get(cfg, key) for key in CHOICES}
    values: dict[str, str] = {}
    source: dict[str, str] = {}
    reason = "set in the config"
    for key, value in requested.items():
        if value != AUTO:
            values[key], source[key] = value, "config"
        elif stored is not None and _get(stored, key) != AUTO:
            values[key], source[key] = _get(stored, key), "recorded"
            reason = "kept from the run's start (run.json)"
    autos = [k for k, s in requested.items() if s == AUTO and k not in values]
    uses_bf16 = any(v in BF16_VALUES for v in values.values())
    probe = autos or uses_bf16 or stored is not None  # a resume records the resuming machine's verdict
    hardware = verdict if verdict is not None else (bf16_verdict() if probe else None)
    if autos:
        choice, reason = auto_choice(hardware)
        for key in autos:
            values[key], source[key] = CHOICES[key][choice], AUTO
    record = {
        **values,
        "requested": requested,
        "source": source,
        "reason": reason,
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
    """``cfg`` with no ``auto`` precision left (resolved on this machine); ``cfg`` itself when it has none.

    Job specs call this, so a spec built outside a run (a bench, a test) is concrete too; inside a run the flow
    passes the config :func:`resolve_precision` made at its start, and this returns it unchanged."""
    if all(_get(cfg, key) != AUTO for key in [*CHOICES, *FOLLOWERS]):
        return cfg
    return resolve_precision(cfg).config


def concrete_train(train: Any) -> Any:
    """A :class:`mugrpo.config.TrainSection` with its ``auto`` keys resolved on this machine (itself when it has
    none): for a training spec built without a run config (a bench, a test)."""
    from mugrpo.common.hardware import auto_choice

    keys = {k.split(".")[1]: k for k in [*CHOICES, *FOLLOWERS] if k.startswith("train.")}
    if all(getattr(train, name) != AUTO for name in keys):
        return train
    choice = auto_choice()[0]
    update = {
        name: CHOICES[key][choice] for name, key in keys.items() if key in CHOICES and getattr(train, name) == AUTO
    }
    for name, key in keys.items():
        if key in FOLLOWERS and getattr(train, name) == AUTO:
            update[name] = FOLLOWERS[key](CHOICES["model.dtype"][choice])
    return train.model_copy(update=update)


def describe(record: dict[str, Any]) -> str:
    """One line for the run's start: the resolved values and why."""
    values = ", ".join(f"{k}={record[k]}" for k in CHOICES)
    return f"precision: {values} ({record.get('reason', '')})"
