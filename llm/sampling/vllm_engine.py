"""The vLLM sampler: an in-process engine holding alpha, with a verified weight sync.

Pinned to vllm-cpu 0.32 on CPU (internal APIs move between releases; everything that touches them
is in this module). On CPU, vLLM repacks every linear layer's weight at load time (oneDNN or
sgl-kernel) and keeps only the packed copy, so neither ``model.load_weights`` nor an in-place copy
reaches the weights the forward pass uses. ``_sync_cpu`` therefore rebuilds each linear layer's
weight the way vLLM stores it (fused q/k/v and gate/up, following the model's
``packed_modules_mapping``), assigns it as a new parameter and asks vLLM to repack it; embeddings and
norms are copied in place (and an embedding used as the output layer is repacked too). On CUDA the
engine's own ``load_weights`` is used. Every sync path must pass ``tests/test_vllm_sampler.py``:
after a sync, the sampler's log-probs of sampled tokens equal the trainer's.
"""

from __future__ import annotations

import importlib.util
import os
import time

import torch

from .base import Rollout

#: CPU KV-cache size in GiB when the user has not set VLLM_CPU_KVCACHE_SPACE (vLLM's default takes
#: most of the machine's memory).
DEFAULT_CPU_KV_GIB = "2"


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _state_for_engine(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items()}


def _sync_cpu(worker, state: dict[str, torch.Tensor]) -> int:
    """Runs inside the vLLM worker: copy ``state`` (transformers names) into the packed CPU model."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    model = worker.model_runner.model
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)

    def source(name: str) -> torch.Tensor:
        if name in state:
            return state[name]
        for fused, parts in packed.items():
            token = f".{fused}."
            if token in f".{name}":
                return torch.cat([state[name.replace(fused, p)] for p in parts], dim=0)
        if tied and name == "lm_head.weight":
            return state["model.embed_tokens.weight"]
        raise KeyError(f"no source for vLLM parameter {name}")

    n = 0
    with torch.no_grad():
        for mod_name, module in model.named_modules():
            params = dict(module.named_parameters(recurse=False))
            if not params:
                continue
            prefix = f"{mod_name}." if mod_name else ""
            is_linear = isinstance(module, LinearBase)
            for pname, param in params.items():
                full = prefix + pname
                if pname == "weight" and is_linear:
                    w = source(full).to(dtype=param.dtype)
                    module.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
                    dispatch_cpu_unquantized_gemm(module, remove_weight=True)
                else:
                    src = source(full).to(dtype=param.dtype)
                    if src.shape == param.shape:
                        param.data.copy_(src)
                    elif src.ndim == param.ndim and src.shape[1:] == param.shape[1:] and src.shape[0] <= param.shape[0]:
                        param.data[: src.shape[0]].copy_(src)  # vocabulary padded by vLLM
                    else:
                        raise ValueError(f"vLLM parameter {full} has shape {tuple(param.shape)}, source {tuple(src.shape)}")
                n += 1
            if not is_linear and hasattr(module, "cpu_linear") and "weight" in params:
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)  # embedding used as lm_head
    return n


def _sync_cuda(worker, state: dict[str, torch.Tensor]) -> int:
    model = worker.model_runner.model
    model.load_weights(weights=list(state.items()))
    return len(state)


class VLLMSampler:
    """alpha held by an in-process vLLM engine (``LLM``), re-synchronised with ``load_weights``."""

    name = "vllm"

    def __init__(self, model_path: str, *, dtype: str, seed: int, max_model_len: int, eos_token_id: int,
                 gpu_memory_utilization: float = 0.3, weight_transfer_config=None):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in process: weights are shared by reference
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KV_GIB)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # set it to INFO to see the engine's own log
        from vllm import LLM

        threads = torch.get_num_threads()
        self.cuda = torch.cuda.is_available()
        # generation_config="vllm": ignore sampling defaults stored with the model (repetition_penalty, top_k...),
        # so alpha is exactly softmax(logits / T); processed log-probs are those of the distribution sampled.
        kwargs = dict(model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
                      enforce_eager=True, logprobs_mode="processed_logprobs", enable_prefix_caching=False,
                      generation_config="vllm")
        if self.cuda:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if weight_transfer_config is not None:  # vLLM's RL weight-sync API (llm.sampling.weight_transfer)
            kwargs["weight_transfer_config"] = weight_transfer_config
        t0 = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.start_seconds = time.perf_counter() - t0
        torch.set_num_threads(threads)  # vLLM drops torch to one thread for serving; the trainer needs them
        self.eos = eos_token_id

    def load_weights(self, model: torch.nn.Module) -> None:
        state = _state_for_engine(model)
        if not self.cuda:
            state = {k: v.cpu() for k, v in state.items()}
        self.llm.collective_rpc(_sync_cuda if self.cuda else _sync_cpu, args=(state,))
        if not self.cuda:
            torch.set_num_threads(max(torch.get_num_threads(), 1))

    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int) -> Rollout:
        from vllm import SamplingParams

        # One seed per prompt (vLLM gives the n samples of a request seeds seed..seed+n-1), so repeated
        # prompts in a batch still get independent samples.
        params = [SamplingParams(n=n, temperature=temperature, top_p=1.0, top_k=-1, max_tokens=max_tokens,
                                 logprobs=0, seed=(seed + j * n) % (2**31), stop_token_ids=[self.eos])
                  for j in range(len(prompt_ids))]
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
        comps, lps = [], []
        for out in outs:
            for o in sorted(out.outputs, key=lambda o: o.index):
                ids = list(o.token_ids)
                comps.append(ids)
                lps.append([float(d[t].logprob) for t, d in zip(ids, o.logprobs)])
        return Rollout(comps, lps)

    def close(self) -> None:
        self.llm = None
