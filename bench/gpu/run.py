"""Ready for an accelerator: training MFU, generation throughput and a short Mu-GRPO vs GRPO-warm comparison.

    python bench/gpu/prepare.py                  # with network, once: wheels + tokenizer into bench/gpu/carry/
    python bench/gpu/run.py                      # on the GPU machine, bench/gpu/carry/ copied along; tables to $OUT
    python bench/gpu/run.py --tiny --out DIR     # CPU, tiny sizes (CI: tests/e2e/test_bench_arms.py)

The GPU machine has torch, transformers, accelerate, pyarrow and fsspec but not pydantic, math-verify, pebble or
rich: run.py installs them from bench/gpu/carry/wheels (no network) when they are missing. No hub: the model is a
random-initialised Qwen2 built from a transformers config with Qwen2.5-0.5B's layer shape (hidden 896, 24 layers,
14 heads, 2 KV heads, MLP 4864, tied embeddings) and the carried SmolLM2 tokenizer's vocabulary (49,152 ids instead
of Qwen's 151,936: 0.36 B parameters instead of 0.49 B). The prompts are synthetic two-number additions written in
GSM8K's format. Jobs run directly, without Prefect (bench/_arms.py, the runners of bench/speedup.py).

It measures (and writes to $OUT/gpu_bench.md and gpu_bench.json):
1. bf16 training tokens/s and MFU (6 N tokens/s / peak) of a bare forward/backward + AdamW on fp32 master weights
   under bf16 autocast, and of the train job (tokens of the rollouts it trained on / its work seconds);
2. generation tokens/s of the transformers engine at the rows per stage of GRPO (mu = 4) and of Mu-GRPO;
3. Mu-GRPO (K cold stages) vs GRPO-warm (mu = 4) at equal updates: T_roll, T_train, T_switch, T_total, ratios.
Sized to finish within ~8 minutes on one H200 (one process start per Mu-GRPO job; U=32, 64 rollouts per update).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CARRY = HERE / "carry"
NEEDED = {"pydantic": "pydantic", "math_verify": "math-verify[antlr4_13_2]", "pebble": "pebble", "rich": "rich",
          "yaml": "pyyaml"}  # fmt: skip
#: bf16 dense peak of one H100/H200 SXM (NVIDIA datasheet, without sparsity), TFLOP/s.
H200_BF16_TFLOPS = 989.0
#: Every generation figure of this script is the transformers engine's: the GPU machine's image has no vLLM and its
#: wheels (several GB) cannot be carried there: a figure here is never a vLLM figure (docs/scaling.md, "Generation
#: with vLLM").
ENGINE_NOTE = (
    "the transformers engine (HF generate); vLLM is "
    + ("installed but not used" if importlib.util.find_spec("vllm") else "not installed")
    + ", so no figure here is a vLLM figure"
)
QWEN25_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
              "intermediate_size": 4864}  # fmt: skip
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "intermediate_size": 128}  # fmt: skip


def ensure_packages() -> None:
    """Install what the jobs need from the carried wheels when the interpreter lacks it (no network)."""
    import importlib.util

    missing = [pip for mod, pip in NEEDED.items() if importlib.util.find_spec(mod) is None]
    if not missing:
        return
    wheels = CARRY / "wheels"
    if not wheels.is_dir():
        raise SystemExit(f"missing {missing} and no {wheels}: run `python bench/gpu/prepare.py` first and carry it")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels), *missing]
    subprocess.run(cmd, check=True)


def tokenizer_source() -> str | None:
    return str(CARRY / "tokenizer") if (CARRY / "tokenizer").is_dir() else None


def build_model(dest: Path, tiny: bool) -> tuple[Path, int]:
    """The random Qwen2 policy as an HF dir; returns (dir, parameter count)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from mugrpo.policy.models import load_tokenizer, save_policy, smollm2_gguf_path

    if tokenizer_source():  # the carried tokenizer files alone (load_tokenizer wants a whole model dir)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_source())
    else:
        tok = load_tokenizer(smollm2_gguf_path())
    cfg = Qwen2Config(vocab_size=len(tok), tie_word_embeddings=True, max_position_embeddings=4096,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                      **(TINY if tiny else QWEN25_05B))  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.float32).eval()
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return save_policy(model, tok, dest), sum(p.numel() for p in model.parameters())


def write_problems(path: Path, n: int) -> Path:
    """n two-number additions in GSM8K's JSONL format (question, answer ending in '#### value')."""
    rows = [{"question": f"What is {17 * i % 89 + 3} plus {31 * i % 97 + 5}?",
             "answer": f"#### {(17 * i % 89 + 3) + (31 * i % 97 + 5)}"} for i in range(n)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def bare_train(model_dir: Path, batch: int, seq: int, steps: int, device: str) -> dict:
    """Tokens/s of forward/backward + AdamW at [batch, seq], bf16 autocast over fp32 weights (as the trainer)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device=device)
    times = []
    for step in range(steps + 1):  # step 0 warms up (kernels, allocator) and is not timed
        sync(device)
        t0 = time.perf_counter()
        with torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16):
            logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        if step:
            times.append(time.perf_counter() - t0)
    del model, opt
    return {"batch": batch, "seq": seq, "tokens_per_s": batch * seq * len(times) / sum(times)}


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def rollout_tokens(cfg) -> dict[int, dict]:
    """Per stage: rows, prompt + response tokens, response tokens (from the committed rollouts)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    t = ds.dataset(Path(cfg.run.root) / cfg.run.id / "rollouts", format="parquet", partitioning="hive").to_table(
        columns=["stage", "prompt_token_ids", "num_tokens"]
    )
    out = {}
    for k in sorted(set(t.column("stage").to_pylist())):
        s = t.filter(pc.equal(t.column("stage"), k))
        prompt = sum(pc.list_value_length(s.column("prompt_token_ids")).to_pylist())
        resp = sum(s.column("num_tokens").to_pylist())
        out[int(k)] = {"rows": s.num_rows, "tokens": prompt + resp, "response_tokens": resp}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="CPU, tiny model and sizes (CI)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-bench-out")))
    parser.add_argument("--peak-tflops", type=float, default=None, help=f"default {H200_BF16_TFLOPS} on CUDA")
    args = parser.parse_args()
    ensure_packages()
    sys.path.insert(0, str(REPO))
    import torch

    from bench._arms import Budget, arm_config, run_arm

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    peak = args.peak_tflops or (H200_BF16_TFLOPS if device == "cuda" else None)
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="mugrpo-gpu-bench-"))
    t_start = time.monotonic()
    model_dir, n_params = build_model(tmp / "model", args.tiny)
    data = write_problems(tmp / "problems.jsonl", 4096)
    result: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "params": n_params,
                    "torch": torch.__version__, "peak_tflops": peak, "generation_engine": ENGINE_NOTE}  # fmt: skip

    def mfu(tokens_per_s: float) -> float | None:
        return 6 * n_params * tokens_per_s / (peak * 1e12) if peak else None

    bare = bare_train(model_dir, *((2, 64, 2) if args.tiny else (16, 1024, 5)), device)
    bare["mfu"] = mfu(bare["tokens_per_s"])
    result["bare_train"] = bare
    print("bare train:", bare, flush=True)
    b = (
        Budget(
            updates=8,
            rollouts_per_update=4,
            group_size=2,
            max_new_tokens=8,
            model=str(model_dir),
            eval_prompts=0,
            mu_stages=2,
        )
        if args.tiny
        else Budget(
            updates=32,
            rollouts_per_update=64,
            group_size=8,
            max_new_tokens=512,
            model=str(model_dir),
            eval_prompts=0,
            num_threads=4,
        )  # fmt: skip
    )
    extra = (f"data.train.path={data}", "model.max_context=2048", "reward.components={math_correctness: 1.0}")
    if device == "cuda":  # the transformers engine on the GPU too (engine_kwargs.device; the trainer uses accelerate)
        extra += ("generation.engine_kwargs={num_threads: 4, device: cuda}",)
    b = Budget(**{**b.__dict__, "extra": extra})
    arms = {}
    for arm in ("mu", "grpo-warm"):
        cfg = arm_config(arm, tmp / arm, arm, b)
        rep = run_arm(arm, cfg, tmp / f"{arm}.log", tmp)
        toks = rollout_tokens(cfg)
        trained = sum(s["tokens"] for s in toks.values())
        rep["train_tokens_per_s"] = trained / rep["t_train"]
        rep["train_mfu"] = mfu(rep["train_tokens_per_s"])
        rep["gen_rows_per_stage"] = toks[0]["rows"]
        rep["gen_tokens_per_s"] = sum(s["response_tokens"] for s in toks.values()) / rep["t_roll"]
        arms[arm] = {k: v for k, v in rep.items() if k not in ("reward_per_update",)}
        print(arm, json.dumps(arms[arm]), flush=True)
    mu, warm = arms["mu"], arms["grpo-warm"]
    result.update(
        budget=str(b),
        arms=arms,
        ratios={"rollout": warm["t_roll"] / mu["t_roll"], "end_to_end": warm["t_total"] / mu["t_total"]},
        wall_s=time.monotonic() - t_start,
    )
    (args.out / "gpu_bench.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# bench/gpu/run.py on {result['device']} (torch {result['torch']}, {n_params / 1e6:.0f} M params)",
        "",
        f"Generation engine: {ENGINE_NOTE}.",
        "",
        f"- bare fwd/bwd [{bare['batch']}x{bare['seq']}]: {bare['tokens_per_s']:.0f} tok/s, MFU {bare['mfu']}",
        "",
        "| arm | rows/stage | gen tok/s | train tok/s | train MFU | T_roll | T_train | T_switch | T_total |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {a} | {r['gen_rows_per_stage']} | {r['gen_tokens_per_s']:.0f} | {r['train_tokens_per_s']:.0f} | "
            f"{r['train_mfu']} | {r['t_roll']:.1f} | {r['t_train']:.1f} | {r['t_switch']:.1f} | {r['t_total']:.1f} |"
            for a, r in arms.items()
        ),
        "",
        f"GRPO-warm / Mu-GRPO: rollout {result['ratios']['rollout']:.2f}x, end to end "
        f"{result['ratios']['end_to_end']:.2f}x; whole script {result['wall_s']:.0f} s.",
    ]
    (args.out / "gpu_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
