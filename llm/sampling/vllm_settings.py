"""Settings of a vLLM engine on a CPU, shared by the in-process sampler and ``python -m llm serve``.

- **No chunked prefill.** vLLM splits a prompt's prefill over engine steps once a step's prompt tokens exceed
  ``max_num_batched_tokens`` (4,096 by default), and then rewinds the random generator of every seeded request it
  split, which a CPU generator cannot do (``RuntimeError: CPU Generator does not use offset`` in
  ``gpu_model_runner._bookkeeping_sync``). The trainer seeds every request (one seed per prompt: reproducible
  samples, a resumed run draws what the interrupted one drew), so on a CPU chunked prefill is off: each prompt is
  prefilled whole in one engine step, requests that do not fit wait for the next step, and nothing is ever rewound.
  vLLM's own CPU platform makes the same choice for the models it cannot chunk. ``max_num_batched_tokens`` must
  then hold the longest sequence: ``batched_tokens``.
- **Prefix caching in blocks of 32 tokens.** The G completions of a prompt share it, and a task's prompts share
  the chat template's opening: with prefix caching only the tail of a prompt past its last whole cache block is
  computed again for each completion. vLLM's CPU default block of 128 tokens is longer than most prompts, so
  nothing would be cached; 32 is the smallest block its CPU attention takes. The cache holds keys and values of
  the weights that computed them, so every weight sync empties it (``VLLMSampler.load_weights``, and
  ``/reset_prefix_cache`` on a server); the sync check of the first step after it would show a stale one.
- **128 sequences at once** (``max_num_seqs``): generation on a CPU is bound by arithmetic, so tokens per second
  hardly change between 96 and 256 sequences at once, while the KV cache grows with them.
- **A KV cache sized to the job** (``kv_cache_blocks``): the blocks of the sequences that can run at once (a
  window's completions, at most ``max_num_seqs``), a group's shared prompt blocks counted once, instead of a fixed
  2 GiB or vLLM's default (most of the machine). ``VLLM_CPU_KVCACHE_SPACE`` (GiB), when set, still wins.

Measured on SmolLM2-135M-Instruct (float32, 2 cores; ``benchmarks/generation.py``): 16 prompts of ~50 tokens x 8
completions of up to 96 tokens in one call took 31.6 s with vLLM's CPU defaults and chunked prefill off (325
tokens/s), 26.9 s with 32-token blocks and prefix caching at 128 sequences (381 tokens/s; 375 at 64, 386 at 256).

On CUDA neither applies: CUDA generators rewind, and vLLM sizes its cache from ``gpu_memory_utilization``.
"""

from __future__ import annotations

import logging
import math
import os
import warnings

#: Lines of vLLM's start-up that are not the project's business (``runkit.quiet.filtered_native_output`` drops them
#: while the engine starts, unless ``VLLM_LOGGING_LEVEL`` asks for vLLM's log): a C++ warning that the CPU worker binds
#: memory to its NUMA node, the weight loader's progress bar, and Triton's CPU notice.
ENGINE_START_NOISE = (r"NUMA binding: ", r"Loading safetensors checkpoint shards", r"Triton is installed, but")


def quiet_vllm() -> None:
    """Before vLLM is first imported: its own log at ERROR (``VLLM_LOGGING_LEVEL``, unless the user set it; INFO shows
    it), and the deprecation warnings its import raises about torch's API (``torch.distributed.reduce_op``) silenced.
    What a run prints first is then the project's own lines."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if not vllm_log_wanted():  # logged at import, before vLLM configures its loggers (Python's last-resort handler)
        logging.getLogger("vllm.triton_utils.importing").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.reduce_op.* is deprecated", category=FutureWarning)


def vllm_log_wanted() -> bool:
    """Whether the user asked for vLLM's own log (``VLLM_LOGGING_LEVEL`` INFO or DEBUG)."""
    return os.environ.get("VLLM_LOGGING_LEVEL", "ERROR").upper() in ("INFO", "DEBUG")

#: Prompt tokens per engine step (vLLM's CPU default), sequences at once and the KV cache block (module docstring).
CPU_BATCHED_TOKENS = 4096
CPU_MAX_SEQS = 128
CPU_BLOCK_SIZE = 32
#: Smallest KV cache handed to vLLM (a few blocks of any small model; vLLM refuses a cache below one sequence).
MIN_KV_CACHE_BYTES = 64 * 2**20


def batched_tokens(max_model_len: int) -> int:
    """``max_num_batched_tokens`` without chunked prefill: vLLM's default, or the longest sequence if longer."""
    return max(CPU_BATCHED_TOKENS, max_model_len)


def kv_bytes_per_token(model_config, dtype: str) -> int:
    """Bytes of K and V per token for a transformers config: 2 x layers x KV heads x head size x the dtype's bytes."""
    heads = getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    return 2 * model_config.num_hidden_layers * heads * head_dim * (4 if dtype == "float32" else 2)


def kv_cache_blocks(max_model_len: int, sequences: int, max_seqs: int = CPU_MAX_SEQS, group: int = 1,
                    prompt_tokens: int = 0) -> int:
    """Cache blocks for ``min(sequences, max_seqs)`` sequences of up to ``max_model_len`` tokens running at once.

    Without sharing (``group`` 1 or ``prompt_tokens`` unknown) each sequence gets whole blocks for its longest
    length. With prefix caching the ``group`` completions of a prompt share its whole blocks: a prompt of p tokens
    shares floor((p - 1) / B) of them (vLLM recomputes at least a prompt's last token) and each sequence then holds at
    most ceil(T / B) + 1 blocks of its own for the rest of its prompt and its T = max_model_len - ``prompt_tokens``
    completion tokens. The running sequences are sized as whole groups plus one partial group at each end (vLLM
    admits a request's n completions together); more distinct prompts at once than that, or a cache still too small,
    make vLLM preempt a sequence and recompute it later, which costs time and never changes what is sampled."""
    running = max(1, min(sequences, max_seqs))
    whole = math.ceil(max_model_len / CPU_BLOCK_SIZE)
    if group <= 1 or prompt_tokens <= 0:
        return running * whole
    shared = (prompt_tokens - 1) // CPU_BLOCK_SIZE
    own = min(whole, math.ceil((max_model_len - prompt_tokens) / CPU_BLOCK_SIZE) + 1)
    prompts = min(running, math.ceil(running / group) + 1)
    return min(running * whole, running * own + prompts * shared)


def kv_cache_bytes(model_config, dtype: str, max_model_len: int, sequences: int,
                   max_seqs: int = CPU_MAX_SEQS, group: int = 1, prompt_tokens: int = 0) -> int:
    """A KV cache of ``kv_cache_blocks`` blocks, and never below ``MIN_KV_CACHE_BYTES``."""
    blocks = kv_cache_blocks(max_model_len, sequences, max_seqs, group, prompt_tokens)
    return max(MIN_KV_CACHE_BYTES, blocks * CPU_BLOCK_SIZE * kv_bytes_per_token(model_config, dtype))


def cpu_engine_args(model_config, dtype: str, max_model_len: int, sequences: int, group: int = 1,
                    prompt_tokens: int = 0, kv_bytes: int = 0) -> dict:
    """Keyword arguments of a CPU engine (``vllm.LLM``) for sequences of up to ``max_model_len`` tokens,
    ``sequences`` of them per generation call (a window's completions), ``group`` per prompt of up to
    ``prompt_tokens`` tokens (``kv_cache_blocks``); ``kv_bytes`` > 0: that KV cache instead
    (``--vllm-kv-cache-gb``)."""
    return dict(enable_chunked_prefill=False, max_num_batched_tokens=batched_tokens(max_model_len),
                enable_prefix_caching=True, block_size=CPU_BLOCK_SIZE, max_num_seqs=CPU_MAX_SEQS,
                kv_cache_memory_bytes=kv_bytes or kv_cache_bytes(model_config, dtype, max_model_len, sequences,
                                                                 CPU_MAX_SEQS, group, prompt_tokens))


def cpu_server_args(model_config, dtype: str, max_model_len: int, kv_bytes: int | None = None) -> list[str]:
    """The same settings as command-line options of vLLM's OpenAI server (``python -m llm serve``), with the KV cache sized
    for ``CPU_MAX_SEQS`` sequences of ``max_model_len`` tokens unless ``kv_bytes`` is given."""
    kv = kv_bytes or kv_cache_bytes(model_config, dtype, max_model_len, CPU_MAX_SEQS)
    return ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(batched_tokens(max_model_len)),
            "--enable-prefix-caching", "--block-size", str(CPU_BLOCK_SIZE), "--max-num-seqs", str(CPU_MAX_SEQS),
            "--kv-cache-memory-bytes", str(kv)]
