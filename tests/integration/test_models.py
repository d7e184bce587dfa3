"""Policy loading, GGUF -> HF conversion, the tiny random policy and the teacher-forced log-prob reference."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import import_or_fail, skip_or_fail
from safetensors import safe_open

import mugrpo.policy.models as models
from mugrpo.policy.models import (
    convert_to_hf_dir,
    gguf_cache_name,
    load_policy,
    make_tiny_random_model,
    response_logprobs,
    smollm2_gguf_path,
)


def safetensors_of(model_dir):
    (path,) = model_dir.glob("*.safetensors")
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_smollm2_gguf_path_points_at_the_shipped_file():
    try:
        path = smollm2_gguf_path()
    except FileNotFoundError as err:  # the package's own __init__ imports llm + llama_cpp: find it, don't import it
        skip_or_fail(str(err))
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000


def test_gguf_conversion_keeps_dequantized_weights_tokenizer_and_chat_template(smollm2_dir):
    gguf = import_or_fail("gguf")
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config  # saved as a plain float model
    assert (config["model_type"], config["num_hidden_layers"], config["vocab_size"]) == ("llama", 30, 49152)
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2

    # a Q4_1 tensor, dequantized independently with the gguf package, equals the saved float32 weight
    reader = gguf.GGUFReader(str(smollm2_gguf_path()))
    (tensor,) = [t for t in reader.tensors if t.name == "blk.0.ffn_down.weight"]
    expected = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).copy())
    (path,) = smollm2_dir.glob("*.safetensors")
    with safe_open(str(path), "pt") as f:
        saved = f.get_tensor("model.layers.0.mlp.down_proj.weight")
    assert saved.dtype == torch.float32 and torch.equal(saved, expected)

    model, tokenizer = load_policy(smollm2_dir)
    assert model.dtype == torch.float32 and not model.training
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 2
    chat = [{"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_a_gguf_is_converted_once_per_machine_and_copied_after(tmp_path, monkeypatch):
    """The first conversion fills the machine's policy cache; the next one copies it, byte for byte, without loading
    the GGUF (load_policy would raise), and leaves the cache's marker and lock files behind."""
    import_or_fail("gguf")
    try:
        gguf = smollm2_gguf_path()
    except FileNotFoundError as err:
        skip_or_fail(str(err))
    monkeypatch.setenv("MUGRPO_CACHE", str(tmp_path / "cache"))
    first = convert_to_hf_dir(gguf, tmp_path / "first")
    (entry,) = (tmp_path / "cache" / "policies").iterdir()
    assert entry.name == gguf_cache_name(gguf, torch.float32)

    def no_second_conversion(*args, **kwargs):
        raise AssertionError("the GGUF was converted again")

    monkeypatch.setattr(models, "load_policy", no_second_conversion)
    second = convert_to_hf_dir(gguf, tmp_path / "second")
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir()) and ".complete" not in names
    assert any(n.endswith(".safetensors") for n in names)
    for path in first.iterdir():
        assert (second / path.name).read_bytes() == path.read_bytes(), path.name


def test_the_gguf_cache_name_follows_content_dtype_and_versions(tmp_path):
    a, b, c = tmp_path / "a.gguf", tmp_path / "elsewhere.gguf", tmp_path / "c.gguf"
    a.write_bytes(b"GGUF" + bytes(range(256)) * 100)
    b.write_bytes(a.read_bytes())
    c.write_bytes(a.read_bytes() + b"x")
    name = gguf_cache_name(a, torch.float32)
    assert gguf_cache_name(b, torch.float32) == name  # the content, not the path
    assert gguf_cache_name(c, torch.float32) != name
    assert gguf_cache_name(a, torch.bfloat16) != name and "bfloat16" in gguf_cache_name(a, torch.bfloat16)
    import transformers

    assert f"transformers{transformers.__version__}" in name


def test_load_policy_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_policy(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_policy(tmp_path)


def test_convert_copies_an_hf_dir_and_replaces_an_old_one(tiny_model_dir, tmp_path):
    dest = tmp_path / "policy"
    dest.mkdir()
    (dest / "stale.txt").write_text("old")
    assert convert_to_hf_dir(tiny_model_dir, dest) == dest
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in tiny_model_dir.iterdir())
    for src in tiny_model_dir.iterdir():
        assert (dest / src.name).read_bytes() == src.read_bytes()
    assert not list(tmp_path.glob(".policy.tmp-*"))  # the temp dir was renamed, not left behind


def test_tiny_model_has_the_smollm2_tokenizer_and_vllm_cpu_head_dim(tiny_model_dir):
    model, tokenizer = load_policy(tiny_model_dir)
    config = model.config
    assert config.vocab_size == len(tokenizer) == 49152
    assert config.hidden_size // config.num_attention_heads == config.head_dim == 32
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == model.generation_config.eos_token_id == 2
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    # large init: next-token distributions are far from uniform, so padding / position bugs show in log-probs
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits[0, -1], -1)
    assert logprobs.max() > torch.log(torch.tensor(1 / 49152)) + 3


def test_tiny_model_is_deterministic_per_seed(tiny_model_dir, tmp_path):
    a = make_tiny_random_model(tmp_path / "a", seed=0, tokenizer_source=tiny_model_dir)
    b = make_tiny_random_model(tmp_path / "b", seed=1, tokenizer_source=tiny_model_dir)
    state_rng = torch.get_rng_state()
    same = safetensors_of(a)
    assert torch.equal(torch.get_rng_state(), state_rng)  # the global RNG is untouched
    reference = safetensors_of(tiny_model_dir)  # built with seed 0 from the GGUF tokenizer
    assert same.keys() == reference.keys()
    assert all(torch.equal(same[k], reference[k]) for k in same)
    other = safetensors_of(b)
    assert not torch.equal(other["model.embed_tokens.weight"], same["model.embed_tokens.weight"])


@pytest.mark.parametrize("kwargs", [{"hidden_size": 48, "num_heads": 2}, {"num_heads": 2, "num_kv_heads": 3}])
def test_tiny_model_rejects_shapes_vllm_cpu_cannot_run(tmp_path, kwargs):
    with pytest.raises(ValueError, match="head|multiple"):
        make_tiny_random_model(tmp_path / "m", **kwargs)


def test_response_logprobs_equal_unbatched_forwards(tiny_model_dir):
    model, _ = load_policy(tiny_model_dir)
    prompts = [[1, 50, 60, 70], [1, 9]]
    responses = [[5, 6, 2], [7, 8, 9, 10, 2]]
    batched = response_logprobs(model, prompts, responses, [1.0, 0.5])
    for prompt, response, temperature, got in zip(prompts, responses, [1.0, 0.5], batched, strict=True):
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
        lp = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, -1)[range(len(response)), response]
        assert len(got) == len(response)
        assert torch.allclose(torch.tensor(got), lp, atol=1e-5)
    with pytest.raises(ValueError, match="temperature"):
        response_logprobs(model, prompts, responses, 0.0)
