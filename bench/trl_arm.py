"""The TRL and bare-transformers arms of bench/vs_trl.py. Runs inside the TRL virtualenv (`make trl-venv`), never
the project's: it imports trl, transformers and torch, and from this repository only `mugrpo.rewards` (the same
reward function and verifier pool as the mugrpo arms; the TRL venv gets pydantic, pebble and math-verify for it).

    .venv-trl/bin/python bench/trl_arm.py SPEC.json OUT.json     # SPEC written by bench/vs_trl.py

Arms (SPEC "arm"):
- ``trl``: `trl.GRPOTrainer` (PyPI trl) with the settings vs_trl.py maps from the mugrpo budget;
- ``bare``: the same work by hand (transformers `generate` of a GRPO generation batch, then one forward/backward +
  AdamW step per update), the floor any GRPO implementation on this stack pays.
OUT gets per-update wall-clock seconds (time.monotonic() from the start of training) and rewards, plus the process's
load seconds.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

T_PROCESS = time.monotonic()
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def scorer_fn(reward_components: dict):
    """A TRL reward function scoring with mugrpo's RewardScorer (same components, weights and verifier)."""
    from mugrpo.rewards import RewardConfig, RewardInput, RewardScorer

    scorer = RewardScorer(RewardConfig(components=reward_components))

    def reward(prompts, completions, ground_truth, **_) -> list[float]:
        results = scorer.score([RewardInput(c, g) for c, g in zip(completions, ground_truth, strict=True)])
        return [r.reward for r in results]

    reward.__name__ = "mugrpo_reward"
    return reward, scorer


def run_trl(spec: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(spec["num_threads"])
    reward, scorer = scorer_fn(spec["reward_components"])
    data = Dataset.from_list([{"prompt": p, "ground_truth": g} for p, g in spec["prompts"]])
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    args = GRPOConfig(
        output_dir=spec["scratch"],
        max_steps=spec["updates"],
        per_device_train_batch_size=spec["rollouts_per_update"],
        gradient_accumulation_steps=1,
        num_generations=spec["group_size"],
        generation_batch_size=spec["rollouts_per_update"] * spec["mu"],
        num_iterations=1,
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=spec["warmup_updates"],
        optim="adamw_torch",
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=spec["max_grad_norm"],
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=False,
        gradient_checkpointing=spec["gradient_checkpointing"],
        bf16=spec["bf16"],
        use_cpu=True,
        shuffle_dataset=False,
        seed=spec["seed"],
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    marks: list[dict] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *_, **__):
            self.t0 = time.monotonic()

        def on_log(self, _args, state, _control, logs=None, **__):
            if logs and "reward" in logs:
                marks.append(
                    {"update": state.global_step, "t": time.monotonic() - self.t0, "reward": float(logs["reward"])}
                )

    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, callbacks=[Clock()]
    )
    t_load = time.monotonic() - T_PROCESS
    t0 = time.monotonic()
    trainer.train()
    t_train = time.monotonic() - t0
    scorer.close()
    return {"marks": marks, "t_load": t_load, "t_train": t_train, "trl": __import__("trl").__version__}


def run_bare(spec: dict) -> dict:
    """generate(mu x rollouts_per_update completions) then mu x (forward/backward + AdamW) per generation batch."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(spec["num_threads"])
    torch.manual_seed(spec["seed"])
    reward, scorer = scorer_fn(spec["reward_components"])
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=0.0)
    g, per_update, mu = spec["group_size"], spec["rollouts_per_update"], spec["mu"]
    prompts = [p for p in spec["prompts"] for _ in range(g)]
    marks, t_load, t0, update = [], time.monotonic() - T_PROCESS, time.monotonic(), 0
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec["bf16"])
    while update < spec["updates"]:
        batch = prompts[update * per_update : (update + mu) * per_update]
        enc = tok([p for p, _ in batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad(), autocast:
            out = model.generate(
                **enc, do_sample=True, temperature=spec["temperature"], top_k=0, top_p=1.0,
                max_new_tokens=spec["max_new_tokens"], pad_token_id=tok.pad_token_id,
            )  # fmt: skip
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        r = torch.tensor(reward(None, texts, [gt for _, gt in batch]))
        adv = (r.view(-1, g) - r.view(-1, g).mean(1, keepdim=True)) / (r.view(-1, g).std(1, keepdim=True) + 1e-4)
        adv = adv.view(-1)
        for i in range(mu):
            rows = slice(i * per_update, (i + 1) * per_update)
            with autocast:
                logits = model(out[rows]).logits[:, enc["input_ids"].shape[1] - 1 : -1].float()
            resp = out[rows, enc["input_ids"].shape[1] :]
            logp = torch.log_softmax(logits, -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
            loss = -(logp * adv[rows, None]).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["max_grad_norm"])
            opt.step()
            opt.zero_grad()
            update += 1
            marks.append({"update": update, "t": time.monotonic() - t0, "reward": float(r[rows].mean())})
    scorer.close()
    return {"marks": marks, "t_load": t_load, "t_train": time.monotonic() - t0}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", type=Path, help="the arm's SPEC JSON, written by bench/vs_trl.py")
    parser.add_argument("out", type=Path, help="where to write the arm's result JSON")
    args = parser.parse_args()
    spec = json.loads(args.spec.read_text())
    result = run_trl(spec) if spec["arm"] == "trl" else run_bare(spec)
    args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
