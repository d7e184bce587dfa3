"""Build the lab policy: a small Llama with a character-level tokenizer, warm-started by SFT on a reasoning-gym task.

    policy_dir = ensure_lab_policy(LabRecipe())     # built once per recipe, then read from the cache

The SFT teaches the product's answer format on the task's gold answers (a short worked line and a boxed answer,
``7 - 2 = 5, 5 + 9 = \\boxed{14}``; :func:`sft_target`), on prompts rendered exactly as the generation job renders
them with the recipe's prompt config and the tokenizer's chat template. Every ``eval_every`` steps it samples
``eval_size`` held-out problems at T = 1, scores them with the ``reasoning_gym`` component, and stops once their
accuracy reaches ``target_accuracy``: a policy that answers in format and is right sometimes, so that RL has a
signal and room. The final figures (``lab.json``) are greedy and T = 1 accuracy on ``heldout_size`` held-out problems.

Deterministic from the recipe: torch is seeded and pinned to ``num_threads`` threads, the data order comes from the
seed, and every accuracy is sampled with the rollout engine's per-row seeded generators.
"""

from __future__ import annotations

import fcntl
import json
import math
import platform
import shutil
import tempfile
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from mugrpo.lab.recipe import LabRecipe, lab_cache_root
from mugrpo.lab.tokenizer import build_char_tokenizer

__all__ = [
    "build_lab_policy",
    "ensure_lab_policy",
    "heldout_accuracy",
    "lab_policy_dir",
    "sft_target",
]

LAB_INFO = "lab.json"
"""File in a built policy's folder: the recipe, its hash, the SFT steps and the measured accuracies."""


def lab_policy_dir(recipe: LabRecipe, cache_root: Path | None = None) -> Path:
    """Folder of ``recipe``'s policy in the cache (built or not): ``{root}/{task}-{hash}``."""
    return Path(cache_root or lab_cache_root()) / f"{recipe.task}-{recipe.hash()}"


def _steps(expression: str) -> list[str] | None:
    """``"3 + 5 - 2"`` -> ``["3 + 5 = 8", "8 - 2 = 6"]``: a +/- chain folded left to right; None for anything else."""
    tokens = expression.split()
    if len(tokens) < 3 or len(tokens) % 2 == 0 or any(op not in "+-" for op in tokens[1::2]):
        return None
    try:
        value = int(tokens[0])
        steps = []
        for op, operand in zip(tokens[1::2], tokens[2::2], strict=True):
            new = value + int(operand) if op == "+" else value - int(operand)
            steps.append(f"{value} {op} {operand} = {new}")
            value = new
    except ValueError:
        return None
    return steps


def sft_target(problem, answer_format: str) -> str:
    """The SFT response of a problem in the product's answer format (a boxed final answer):

    - ``boxed``: ``\\boxed{GOLD}``;
    - ``expression``: ``EXPRESSION = \\boxed{GOLD}`` with the entry's ``metadata['expression']``;
    - ``steps``: ``a + b = x, x - c = \\boxed{GOLD}``, the +/- chain of ``metadata['expression']`` folded left to
      right (the last step's result is the boxed answer; used only when it equals the gold).

    A task entry without what the format needs gets ``\\boxed{GOLD}``.
    """
    box = f"\\boxed{{{problem.ground_truth}}}"
    expression = json.loads(problem.task_metadata or "{}").get("expression")
    if answer_format == "expression" and expression:
        return f"{expression} = {box}"
    steps = _steps(expression) if answer_format == "steps" and expression else None
    if steps and steps[-1].rsplit(" = ", 1)[1] == problem.ground_truth:
        return ", ".join([*steps[:-1], f"{steps[-1].rsplit(' = ', 1)[0]} = {box}"])
    return box


def _problems(recipe: LabRecipe):
    from mugrpo.data.datasets import DatasetConfig, load_problems

    train, _ = load_problems(DatasetConfig(**recipe.dataset("train")))
    heldout, _ = load_problems(DatasetConfig(**recipe.dataset("heldout")))
    shared = {p.question for p in train} & {p.question for p in heldout}
    if shared:  # by construction (mugrpo.data.gym.split_of) this cannot happen; asserted on the texts all the same
        raise AssertionError(f"lab: {len(shared)} held-out questions are in the training set, e.g. {min(shared)!r}")
    return train, heldout


def _model(recipe: LabRecipe, tokenizer):
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    if recipe.hidden_size % recipe.num_heads:
        raise ValueError(f"hidden_size {recipe.hidden_size} is not a multiple of num_heads {recipe.num_heads}")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads,
        head_dim=recipe.hidden_size // recipe.num_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(recipe.seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None
    )
    return model


def _encode(recipe: LabRecipe, tokenizer, problems) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids + EOS) of each problem, the prompt rendered as the generation job renders it."""
    from mugrpo.data.prompts import encode_prompt, render_prompt

    prompt_cfg = recipe.prompt()
    out = []
    for p in problems:
        prompt = encode_prompt(tokenizer, render_prompt(tokenizer, p.question, prompt_cfg))
        response = tokenizer(sft_target(p, recipe.answer_format), add_special_tokens=False)["input_ids"]
        out.append((prompt, [*response, tokenizer.eos_token_id]))
    if max(len(a) + len(b) for a, b in out) > recipe.max_position_embeddings:
        raise ValueError(
            f"lab: a prompt + answer is longer than max_position_embeddings {recipe.max_position_embeddings}"
        )
    return out


def _batch(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids [B, L], attention mask [B, L] and labels [B, L] (-100 on prompt and padding)."""
    width = max(len(a) + len(b) for a, b in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (prompt, response) in enumerate(pairs):
        n = len(prompt) + len(response)
        ids[i, :n] = torch.tensor(prompt + response)
        labels[i, len(prompt) : n] = torch.tensor(response)
        mask[i, :n] = 1
    return ids, mask, labels


def heldout_accuracy(model, tokenizer, problems, *, prompt, temperature: float, max_new_tokens: int, seed: int) -> dict:
    """Accuracy of ``model`` on ``problems``, one sample each, scored by the ``reasoning_gym`` reward component.

    Samples with the product's rollout engine on the live model (T = 0 is greedy).

    Returns:
        ``{"accuracy": correct share, "boxed": share with a complete box, "n": problems}``.
    """
    from mugrpo.data.answers import extract_boxed
    from mugrpo.data.prompts import encode_prompt, render_prompt
    from mugrpo.engines.base import SamplingParams
    from mugrpo.engines.transformers_engine import TransformersEngine
    from mugrpo.rewards import RewardInput
    from mugrpo.rewards.reasoning_gym import reasoning_gym_score

    engine = TransformersEngine(model, tokenizer, batch_size=256)
    prompts = [encode_prompt(tokenizer, render_prompt(tokenizer, p.question, prompt)) for p in problems]
    params = SamplingParams(temperature=temperature, n=1, max_new_tokens=max_new_tokens, seed=seed)
    samples = [group[0] for group in engine.generate(prompts, params)]
    scores = [
        reasoning_gym_score(RewardInput.for_problem(p, s.text), None) for p, s in zip(problems, samples, strict=True)
    ]
    boxed = [extract_boxed(s.text) is not None for s in samples]
    return {"accuracy": float(np.mean([s >= 1.0 for s in scores])), "boxed": float(np.mean(boxed)), "n": len(problems)}


def build_lab_policy(recipe: LabRecipe, dest: Path, console: Console | None = None) -> dict:
    """Build ``recipe``'s policy into the HF dir ``dest`` (written atomically) and return its ``lab.json`` record.

    Raises:
        mugrpo.data.gym.GymNotInstalled: reasoning-gym is missing (the message holds the pip command).
        ValueError: a model shape the recipe cannot build, or problems longer than the context.
    """
    from mugrpo.common.progress import job_progress

    console = console or Console(stderr=True)
    t0 = time.monotonic()
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.num_threads)
    try:
        tokenizer = build_char_tokenizer()
        train, heldout = _problems(recipe)
        pairs = _encode(recipe, tokenizer, train)
        model = _model(recipe, tokenizer)
        n_params = sum(p.numel() for p in model.parameters())
        console.print(
            f"lab: {recipe.task} {recipe.params}: {len(train)} training / {len(heldout)} held-out problems "
            f"(disjoint on question text); Llama {n_params / 1e6:.2f} M parameters, vocab {len(tokenizer)}"
        )
        optim = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / max(recipe.warmup_steps, 1)))
        rng = np.random.default_rng(recipe.seed)
        order: list[int] = []
        checks: list[dict] = []
        stop_set = heldout[: recipe.eval_size]
        prompt = recipe.prompt()
        step, loss_value, reached = 0, math.nan, False
        fields = "loss {task.fields[loss]:.3f}  acc@T=1 {task.fields[acc]:.3f}"
        with job_progress("lab SFT", "steps", fields, console) as bar:
            task = bar.add_task("sft", total=recipe.max_steps, loss=math.nan, acc=0.0)
            while step < recipe.max_steps and not reached:
                model.train()
                if len(order) < recipe.batch_size:
                    order += rng.permutation(len(pairs)).tolist()
                batch, order = order[: recipe.batch_size], order[recipe.batch_size :]
                ids, mask, labels = _batch([pairs[i] for i in batch], tokenizer.pad_token_id)
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
                optim.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optim.step()
                sched.step()
                step += 1
                loss_value = float(loss.detach())
                if step % recipe.eval_every == 0 or step == recipe.max_steps:
                    acc = heldout_accuracy(
                        model,
                        tokenizer,
                        stop_set,
                        prompt=prompt,
                        temperature=1.0,
                        max_new_tokens=recipe.max_new_tokens,
                        seed=step,
                    )["accuracy"]
                    checks.append({"step": step, "loss": loss_value, "accuracy_t1": acc})
                    reached = acc >= recipe.target_accuracy
                    bar.update(task, acc=acc)
                bar.update(task, advance=1, loss=loss_value)
        sft_seconds = time.monotonic() - t0
        model.eval()
        greedy = heldout_accuracy(
            model,
            tokenizer,
            heldout,
            prompt=recipe.prompt(),
            temperature=0.0,
            max_new_tokens=recipe.max_new_tokens,
            seed=0,
        )
        sampled = heldout_accuracy(
            model,
            tokenizer,
            heldout,
            prompt=recipe.prompt(),
            temperature=1.0,
            max_new_tokens=recipe.max_new_tokens,
            seed=1,
        )
        info = {
            "recipe": recipe.model_dump(mode="json"),
            "hash": recipe.hash(),
            "parameters": n_params,
            "vocab_size": len(tokenizer),
            "steps": step,
            "reached_target": reached,
            "final_loss": loss_value,
            "checks": checks,
            "heldout": {"greedy": greedy, "t1": sampled},
            "seconds": {"sft": sft_seconds, "total": time.monotonic() - t0},
            "created_at": datetime.now(UTC).isoformat(),
            "versions": {"torch": torch.__version__, "python": platform.python_version()},
        }
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            model.generation_config.save_pretrained(tmp)
            (tmp / LAB_INFO).write_text(json.dumps(info, indent=2) + "\n")
            if dest.exists():
                shutil.rmtree(dest)
            tmp.rename(dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        torch.set_num_threads(threads)
    status = "reached" if reached else "did NOT reach"
    console.print(
        f"lab: {step} SFT steps in {sft_seconds:.0f} s ({status} sampled T=1 accuracy {recipe.target_accuracy} on "
        f"{len(stop_set)} held-out problems); held-out ({len(heldout)}): greedy {greedy['accuracy']:.3f}, T=1 "
        f"{sampled['accuracy']:.3f}, boxed {greedy['boxed']:.2f}; saved to {dest}"
    )
    return info


@contextmanager
def _build_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # a second builder of the same recipe waits, then finds it built
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_lab_policy(
    recipe: LabRecipe | None = None, *, cache_root: Path | None = None, force: bool = False, console=None
) -> Path:
    """The folder of ``recipe``'s policy (default :class:`LabRecipe`), built first if the cache lacks it.

    Args:
        cache_root: cache folder; default :func:`mugrpo.lab.recipe.lab_cache_root`.
        force: rebuild even if cached.

    Returns:
        An HF model dir (safetensors, tokenizer with chat template, generation config, ``lab.json``).
    """
    recipe = recipe or LabRecipe()
    dest = lab_policy_dir(recipe, cache_root)
    with _build_lock(dest.parent / f".{dest.name}.lock"):
        if force or not (dest / LAB_INFO).is_file():
            build_lab_policy(recipe, dest, console)
    return dest
