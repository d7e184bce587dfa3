"""One bare rollout engine, timed: start, generate calls of given sizes, and an in-place weight load (bench/engines.py).

    PYTHON bench/support/engine_probe.py ARGS.json OUT.json

Run by the interpreter the engine lives in (the main one for ``transformers``, the vLLM virtualenv's for ``vllm``),
with this checkout first on PYTHONPATH. ARGS.json holds ``engine``, ``model_dir``, ``dtype``, ``threads``,
``sizes`` (rollouts per generate call, each a multiple of ``group_size``), ``group_size``, ``max_new_tokens``,
``calls`` (timed calls per size, sizes alternated), ``syncs`` and ``prompts`` (question texts) or
``prompt_token_ids`` (prompts already rendered and encoded: bench/engine_throughput.py's main-job prompts); optional
``temperature`` (default 1.0) and ``seed``. OUT.json gets:

- ``import_s``: seconds to import the engine's module (vLLM itself for ``vllm``);
- ``start_s``: seconds of the engine's construction, the product's defaults (:func:`mugrpo.engines.make_engine`;
  on a CPU vLLM gets ``enforce_eager`` and a 2 GiB KV cache from ``cpu_defaults``; the args' ``engine_kwargs``
  over them);
- ``calls``: per timed call, ``rollouts``, response ``tokens`` and ``seconds`` (after one untimed warm-up call);
- ``sync_s``: seconds of each in-place weight load of the policy's fp32 state dict into the running engine, the
  warm segment's sync (:class:`mugrpo.execution.warm.WarmEngine.sync`): ``VLLMEngine.update_weights`` for vLLM,
  ``load_state_dict`` into the engine's module for transformers (what the warm segment does when the engine's dtype
  differs from the trainer's; in fp32 it shares the trainer's module and the sync is free).

Nothing is asserted; the parent (bench/engines.py) alternates engines and reduces the figures.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    args_path, out_path = sys.argv[1:]
    a = json.loads(open(args_path).read())
    rec: dict = {"engine": a["engine"], "dtype": a["dtype"], "calls": [], "sync_s": []}
    t0 = time.monotonic()
    import torch
    from transformers import AutoModelForCausalLM

    from mugrpo.engines import make_engine
    from mugrpo.engines.base import SamplingParams
    from mugrpo.policy.models import load_tokenizer

    if a["engine"] == "vllm":
        import vllm  # noqa: F401  (its import is part of what a vLLM job pays)
    rec["import_s"] = time.monotonic() - t0

    kwargs = {"num_threads": a["threads"]} if a["engine"] == "transformers" else dict(a.get("engine_kwargs", {}))
    t0 = time.monotonic()
    engine = make_engine(a["engine"], a["model_dir"], dtype=a["dtype"], seed=0, **kwargs)
    rec["start_s"] = time.monotonic() - t0

    if "prompt_token_ids" in a:
        prompts = a["prompt_token_ids"]
    else:
        tokenizer = load_tokenizer(a["model_dir"])
        prompts = [tokenizer(q)["input_ids"] for q in a["prompts"]]
    g = a["group_size"]
    params = SamplingParams(
        temperature=a.get("temperature", 1.0), max_new_tokens=a["max_new_tokens"], n=g, seed=a.get("seed")
    )
    engine.generate(prompts[:1], SamplingParams(temperature=1.0, max_new_tokens=4, n=g))  # warm-up, untimed
    for c in range(a["calls"]):
        sizes = a["sizes"] if c % 2 == 0 else list(reversed(a["sizes"]))
        for rollouts in sizes:
            batch = [prompts[i % len(prompts)] for i in range(rollouts // g)]
            t0 = time.monotonic()
            groups = engine.generate(batch, params)
            seconds = time.monotonic() - t0
            tokens = sum(s.num_tokens for group in groups for s in group)
            rec["calls"].append({"rollouts": rollouts, "tokens": tokens, "seconds": seconds})

    state = AutoModelForCausalLM.from_pretrained(a["model_dir"], dtype=torch.float32).state_dict()
    for _ in range(a["syncs"]):
        t0 = time.monotonic()
        if a["engine"] == "vllm":
            engine.update_weights(state.items())
        else:
            with torch.no_grad():
                engine.model.load_state_dict(state)
        rec["sync_s"].append(time.monotonic() - t0)
    engine.close()
    with open(out_path, "w") as out:
        json.dump(rec, out)


if __name__ == "__main__":
    main()
