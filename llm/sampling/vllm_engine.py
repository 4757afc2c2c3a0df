"""The vLLM sampler: an in-process engine holding alpha, with a verified weight sync.

On CPU, vLLM repacks every linear layer's weight at load time (oneDNN or sgl-kernel) and keeps only the
packed copy, so neither ``model.load_weights`` nor an in-place copy reaches the weights the forward pass
uses. The sync therefore goes through vLLM's weight-transfer API with the project's ``local_cpu``
backend (``llm.sampling.weight_transfer``: the trainer's tensors handed to the engine in this process by
reference), the same four calls as for a separate server: vLLM's layerwise reload rebuilds the fused and
repacked layers the way loading a checkpoint does, for every architecture vLLM loads. On CUDA the engine
shares the process's GPU and its own ``load_weights`` is used. Every sync path must pass
``tests/llm/test_vllm_engine.py``: after a sync, the sampler's log-probs of sampled tokens equal the
trainer's.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import time

import torch

from runkit.cli import first_line
from runkit.host_memory import release_freed_memory
from runkit.quiet import filtered_native_output

from llm.tensors.token_filter import NO_FILTER, TokenFilter
from llm.sampling.base import Rollout


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _sync_cuda(worker, state: dict[str, torch.Tensor]) -> int:
    model = worker.model_runner.model
    model.load_weights(weights=list(state.items()))
    return len(state)


class VLLMSampler:
    """alpha held by an in-process vLLM engine (``LLM``), re-synchronised with ``load_weights``."""

    name = "vllm"
    holds_own_weights, runs_server = True, False  # what it is (``llm.sampling.base.Sampler``)
    returns_logprobs, owns_torch_distributed = True, True

    def __init__(self, model_path: str, *, dtype: str, seed: int, max_model_len: int, eos_token_id: int,
                 model_config=None, sequences: int = 256, group: int = 1, prompt_tokens: int = 0,
                 gpu_memory_utilization: float = 0.3, trust_remote_code: bool = False, trim_memory: bool = True,
                 weight_backend: str = "local_cpu", tensor_parallel_size: int = 1, enable_sleep_mode: bool = False,
                 kv_cache_bytes: int = 0):
        """``model_config``: the model's transformers config (sizes the CPU KV cache; None: read from
        ``model_path``); ``sequences``: completions per generation call (a window's), ``group`` per prompt of at
        most ``prompt_tokens`` tokens (``llm.sampling.vllm_settings.kv_cache_blocks``); ``trim_memory``: hand the
        memory a sync or a generation call freed back to the system after it (``release_freed_memory``), which the
        trainer's next pass then faults in again (off when the run keeps freed memory: ``keep_freed_memory``);
        ``weight_backend``: the CPU sync's transport, ``local_cpu`` (the trainer's tensors by reference) or
        ``gloo_cpu`` (the server's broadcast, here in one process). On CUDA: ``gpu_memory_utilization``,
        ``tensor_parallel_size`` and ``enable_sleep_mode`` (the engine frees its GPU memory between generation calls;
        TRL's vllm_enable_sleep_mode) go to the engine; on a CPU the first two are refused above their neutral values and
        sleep mode is refused, and ``kv_cache_bytes`` > 0 sizes the KV cache instead of the window."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in process: weights are shared by reference
        from llm.sampling.vllm_settings import ENGINE_START_NOISE, quiet_vllm, vllm_log_wanted

        quiet_vllm()  # VLLM_LOGGING_LEVEL=INFO shows the engine's own log
        from vllm import LLM

        threads = torch.get_num_threads()
        self.cuda = torch.cuda.is_available()
        # generation_config="vllm": ignore sampling defaults stored with the model (repetition_penalty, top_k...),
        # so alpha is exactly softmax(logits / T); processed log-probs are those of the distribution sampled.
        kwargs = dict(model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len,
                      enforce_eager=True, logprobs_mode="processed_logprobs", generation_config="vllm",
                      trust_remote_code=trust_remote_code, use_tqdm_on_load=vllm_log_wanted())
        if self.cuda:  # prefix caching off: the CUDA sync path below does not empty the cache
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=False,
                          tensor_parallel_size=tensor_parallel_size, enable_sleep_mode=enable_sleep_mode)
        else:  # weights arrive through vLLM's weight-transfer API (llm.sampling.weight_transfer)
            if tensor_parallel_size != 1:
                raise ValueError("vllm_tensor_parallel_size: the in-process engine on a CPU runs in this one process; "
                                 "tensor parallelism needs GPUs (or vLLM's own server: python -m llm serve)")
            if enable_sleep_mode:
                raise ValueError("vllm_enable_sleep_mode: vLLM's sleep mode frees GPU memory; there is none on a CPU")
            from vllm.config import WeightTransferConfig

            from llm.sampling.vllm_settings import cpu_engine_args

            if model_config is None:
                from transformers import AutoConfig

                model_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
            # no chunked prefill (seeded requests), a KV cache sized to the window (a group shares its prompt)
            kwargs.update(cpu_engine_args(model_config, dtype, max_model_len, sequences, group, prompt_tokens,
                                          kv_cache_bytes))

            from llm.sampling.weight_transfer import register

            register()
            kwargs["weight_transfer_config"] = WeightTransferConfig(backend=weight_backend)
        t0 = time.perf_counter()
        quiet = contextlib.nullcontext() if vllm_log_wanted() else filtered_native_output(ENGINE_START_NOISE)
        # The process's objects so far moved out of the collector's sight before vLLM's start-up collects the heap
        # (loading weights and sizing the cache collect it four times: in a process holding a test suite or a
        # notebook's objects, 2-3 s per engine). vLLM freezes the heap itself once started and unfreezes it at
        # shutdown; a start that fails unfreezes it here. Young garbage is collected first, as vLLM's freeze does.
        gc.collect(0)
        gc.collect(1)
        gc.freeze()
        try:
            with quiet:
                self.llm = LLM(**kwargs)
        except BaseException as exc:
            gc.unfreeze()
            if isinstance(exc, (ValueError, RuntimeError, NotImplementedError, KeyError)):  # vLLM's refusals, one line
                raise ValueError(f"sampler: vLLM cannot run {model_path}: {first_line(exc)} (VLLM_LOGGING_LEVEL=INFO "
                                 "shows its log; --sampler transformers avoids vLLM)") from None
            raise
        self.start_seconds = time.perf_counter() - t0
        self.trim_memory = trim_memory
        release_freed_memory()  # once: the engine's start-up buffers
        torch.set_num_threads(threads)  # vLLM drops torch to one thread for serving; the trainer needs them
        self.eos = eos_token_id
        self.transfer = None  # the trainer side of the weight transfer, opened at the first CPU sync
        self.last_sync_bytes = 0
        self.sleep_mode, self.asleep = enable_sleep_mode and self.cuda, False

    def _wake(self) -> None:
        """Sleep mode: the engine's weights and cache back on the GPU before it is used."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def _sleep(self) -> None:
        """Sleep mode: the engine's GPU memory freed (weights offloaded, cache dropped) while the trainer trains."""
        if self.sleep_mode:
            self.llm.sleep(level=1)
            self.asleep = True

    def load_weights(self, model: torch.nn.Module) -> None:
        from llm.sampling.weight_transfer import TRAINER_INIT_INFO, CheckpointSource, OfflineClient

        self._wake()
        threads = torch.get_num_threads()
        source = CheckpointSource(model)
        if self.cuda:
            self.llm.collective_rpc(_sync_cuda, args=(dict(source),))
        else:
            if self.transfer is None:
                from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

                backend = self.llm.llm_engine.vllm_config.weight_transfer_config.backend
                self.transfer = WeightTransferTrainerFactory.trainer_init(
                    TRAINER_INIT_INFO[backend](rank=0), client=OfflineClient(self.llm), source=source)
            self.transfer.source = source
            self.transfer.send_weights()
            if not self.llm.reset_prefix_cache():  # cached keys and values are the old weights'
                raise RuntimeError("sampler: vLLM refused to empty its prefix cache after a weight sync")
            if self.trim_memory:
                release_freed_memory()
        self.last_sync_bytes = source.nbytes()
        torch.set_num_threads(threads)

    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 greedy: bool = False, token_filter: TokenFilter = NO_FILTER) -> Rollout:
        """n completions per prompt (prompt-major) at ``temperature`` from the distribution ``token_filter`` leaves
        (vLLM's processed log-probs are those of that filtered distribution), or (``greedy``) the most likely token
        at every position (its log-probs then are those of greedy decoding, not of softmax(logits / T))."""
        from vllm import SamplingParams

        # One seed per prompt (vLLM gives the n samples of a request seeds seed..seed+n-1), so repeated
        # prompts in a batch still get independent samples. No text: only token ids and log-probs are read, and
        # decoding each token as it is generated made the tiny model's calls 1.31x slower
        # (benchmarks/archive/vllm_detokenize.py).
        params = [SamplingParams(n=n, temperature=0.0 if greedy else temperature, top_p=token_filter.top_p,
                                 top_k=token_filter.top_k or -1, min_p=token_filter.min_p, max_tokens=max_tokens,
                                 logprobs=0, seed=(seed + j * n) % (2**31), stop_token_ids=[self.eos],
                                 detokenize=False)
                  for j in range(len(prompt_ids))]
        self._wake()
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False)
        self._sleep()
        comps, lps = [], []
        for out in outs:
            for o in sorted(out.outputs, key=lambda o: o.index):
                ids = list(o.token_ids)
                comps.append(ids)
                lps.append([float(d[t].logprob) for t, d in zip(ids, o.logprobs)])
        del outs
        if self.trim_memory:
            release_freed_memory()
        return Rollout(comps, lps)

    def close(self) -> None:
        if self.transfer is not None:
            self.transfer.shutdown()
            self.transfer = None
        self.llm = None

