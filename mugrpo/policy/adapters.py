"""LoRA policies (``train.lora``): the trainer trains low-rank adapters on the frozen initial policy, and a stage
publishes only its adapter.

LoRA (Hu et al., arXiv 2106.09685) adds ``(alpha / r) * B A x`` beside each targeted linear layer ``W x``, with
``A`` (r x in) drawn at random and ``B`` (out x r) zero, so the first policy is the base policy exactly. Only ``A``
and ``B`` are trained: a SmolLM2-135M stage then writes an adapter of a few MB and its AdamW moments instead of
0.54 GB of weights and 1.08 GB of moments. For RL with verifiable rewards, LoRA of rank 1-16 on every linear layer
learns as full fine-tuning does at about 10x the learning rate (Schulman et al., "LoRA Without Regret", Thinking
Machines Lab 2025); the paper's rank and learning rate are starting points, not measured here on a CPU.

A published LoRA policy (``policies/stage=k``) is an adapter folder as peft writes it (``adapter_config.json``,
``adapter_model.safetensors``) with the tokenizer and :data:`BASE_REF_FILE`: the run-relative folder of the base
policy (``policies/stage=0``) and the sha256 of each of its files, checked on use. One adapter is trained across all
stages, so its AdamW moments carry over like the full policy's.

A job that samples (generate, eval) merges the adapter into the base once per stage (:func:`merged_policy_dir`:
``W + (alpha / r) B A`` in the base's dtype, written to a local folder), then starts its engine on that plain HF
folder, so every engine, vLLM included, runs unchanged. The trainer keeps the adapter unmerged
(:func:`load_trainable`).

peft is an optional dependency (``pip install -e '.[lora]'``); a config with ``train.lora`` refuses to load without it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mugrpo.commits.policies import local_policy_dir
from mugrpo.storage.cache import cached
from mugrpo.storage.store import COMPLETE_MARKER, ChecksumError, Store, sha256_bytes

if TYPE_CHECKING:  # torch is imported where the weights are touched: a config (`mugrpo status`) never needs it
    import torch

#: File of a LoRA policy folder naming its base policy: ``{"policy": run-relative dir, "files": {name: sha256}}``.
BASE_REF_FILE = "base.ref.json"
#: The adapter's own config file, as peft writes it: its presence makes a folder an adapter policy.
ADAPTER_CONFIG = "adapter_config.json"


class LoraSection(BaseModel):
    """LoRA adapters on the policy (``train.lora``; None: full fine-tuning)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(
        16,
        ge=1,
        le=1024,
        description="r: the adapters' rank. Rank 1-16 matches full fine-tuning in RL at ~10x its learning rate "
        "(Schulman et al. 2025, 'LoRA Without Regret').",
    )
    alpha: float = Field(32.0, gt=0, description="Scale numerator: the adapter's update is (alpha / rank) B A x.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input (0: deterministic).")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="Linear layers that get an adapter: 'all-linear' (every linear layer but the LM head, as the "
        "research above recommends for RL) or module names (e.g. [q_proj, v_proj], the LoRA paper's).",
    )


def require_peft() -> None:
    """Raises ImportError naming the extra when peft is not installed (looked up, not imported: a config is
    validated by read-only commands too, and importing peft takes seconds)."""
    if importlib.util.find_spec("peft") is None:
        raise ImportError("train.lora needs the 'peft' package: pip install -e '.[lora]'")


def is_adapter_dir(path: str | os.PathLike) -> bool:
    """Whether the local folder ``path`` holds a LoRA adapter policy (not a full HF model)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def attach_lora(model: torch.nn.Module, section: LoraSection, seed: int) -> torch.nn.Module:
    """``model`` with fresh trainable LoRA adapters (peft ``get_peft_model``); its own weights frozen. ``A`` is
    drawn from a generator seeded with ``seed`` (the global RNG is left as it was), ``B`` is zero.

    Raises:
        ImportError: peft is missing.
    """
    require_peft()
    import torch
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=section.rank,
        lora_alpha=section.alpha,
        lora_dropout=section.dropout,
        target_modules=section.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def load_adapter(base: torch.nn.Module, adapter_dir: str | os.PathLike, *, trainable: bool) -> torch.nn.Module:
    """``base`` with the adapter of ``adapter_dir`` (peft ``PeftModel.from_pretrained``), trainable or not. The
    global RNG is left as it was (peft draws initial adapters before it loads the saved ones)."""
    require_peft()
    import torch
    from peft import PeftModel

    with torch.random.fork_rng(devices=[]):
        return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=trainable)


def load_tokenizer(policy_dir: str | os.PathLike):
    """The tokenizer of a policy folder, an adapter's included (it has no model config)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(policy_dir))


def is_lora_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries LoRA adapters (a peft model)."""
    return any("lora_" in name for name, _ in model.named_parameters())


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a full state dict (names with ``lora_``)."""
    return {k: v for k, v in state.items() if "lora_" in k}


def base_ref(store: Store, base_rel: str) -> dict[str, Any]:
    """The :data:`BASE_REF_FILE` content naming the committed policy at store path ``base_rel`` as the base."""
    marker = store.read_json(f"{base_rel}/{COMPLETE_MARKER}")
    return {"policy": base_rel, "files": dict(sorted(marker["files"].items()))}


def save_adapter(
    model: torch.nn.Module, state: dict[str, torch.Tensor], dest: Path, ref: dict[str, Any], tokenizer=None
) -> None:
    """Write the adapter of the peft ``model`` with tensors ``state`` (its ``lora_`` tensors) as a policy folder at
    ``dest``: peft's adapter files, :data:`BASE_REF_FILE` and the tokenizer."""
    model.save_pretrained(dest, state_dict=_peft_names(model, adapter_state(state)))
    (dest / BASE_REF_FILE).write_text(json.dumps(ref, indent=2, sort_keys=True))
    if tokenizer is not None:
        tokenizer.save_pretrained(dest)


def _peft_names(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` keyed as the peft model's own ``state_dict`` (``base_model.model.`` prefix), which its
    ``save_pretrained(state_dict=...)`` expects."""
    own = set(model.state_dict())
    return {k if k in own else f"base_model.model.{k}": v for k, v in state.items()}


def base_dir(store: Store, adapter_dir: Path) -> Path:
    """A local folder of the base policy the adapter at ``adapter_dir`` was trained on, its files checked against
    the sha256 its :data:`BASE_REF_FILE` records.

    Raises:
        FileNotFoundError: no base reference, or the base is not committed.
        mugrpo.storage.store.ChecksumError: the base's files are not the ones the adapter was trained on.
    """
    ref_path = adapter_dir / BASE_REF_FILE
    if not ref_path.is_file():
        raise FileNotFoundError(f"{adapter_dir} is an adapter without {BASE_REF_FILE}: its base policy is unknown")
    ref = json.loads(ref_path.read_text())
    rel = ref["policy"]
    marker = store.read_json(f"{rel}/{COMPLETE_MARKER}") if store.is_complete_dir(rel) else None
    if marker is None:
        raise FileNotFoundError(f"base policy {store.uri(rel)} of adapter {adapter_dir} is not committed")
    if dict(marker["files"]) != ref["files"]:
        raise ChecksumError(f"base policy {store.uri(rel)} differs from the one adapter {adapter_dir} was trained on")
    return local_policy_dir(store, rel)


def load_trainable(store: Store, policy_dir: Path, base_model: torch.nn.Module | None = None) -> torch.nn.Module:
    """The policy of the adapter folder ``policy_dir`` for training: its base (``base_model`` when given, else
    loaded in fp32) with the adapter trainable."""
    from mugrpo.policy.models import load_model

    base = base_model if base_model is not None else load_model(base_dir(store, policy_dir))
    return load_adapter(base, policy_dir, trainable=True)


def merged_policy_dir(store: Store, policy_dir: Path) -> Path:
    """A local plain HF policy folder for ``policy_dir``: the folder itself for a full policy; for an adapter, its
    base with the adapter merged (``W + (alpha / r) B A``, in fp32, then saved), kept in the machine's bounded policy
    cache (:mod:`mugrpo.storage.cache`) under the sha256 of the adapter's files. What the engines load."""
    if not is_adapter_dir(policy_dir):
        return policy_dir
    digest = hashlib.sha256(
        b"".join(sha256_bytes((policy_dir / f).read_bytes()).encode() for f in sorted(os.listdir(policy_dir)))
    ).hexdigest()[:16]

    def merge(folder: Path) -> None:
        from mugrpo.policy.models import load_model

        base = base_dir(store, policy_dir)
        merged = load_adapter(load_model(base), policy_dir, trainable=False).merge_and_unload()
        merged.save_pretrained(folder)
        load_tokenizer(policy_dir).save_pretrained(folder)
        for name in ("generation_config.json",):
            if (base / name).exists() and not (folder / name).exists():
                (folder / name).write_bytes((base / name).read_bytes())

    return cached(f"merged-{digest}", merge)
