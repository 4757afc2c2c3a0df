"""The machinery: the sampler that holds alpha, and the trainer's device, passes and memory."""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from grpo_theory.truncation import TokenFilter

from pydantic import model_validator

from llm.config.fields import ConfigGroup, none_reads, MAX_TEMPERATURE, MIN_TEMPERATURE, require, resumable


class SamplingConfig(ConfigGroup):
    """The completions: how many per step, how they are drawn from alpha, and by which sampler."""

    prompts_per_step: int = 32
    """Prompts per step; each gets num_generations completions (TRL counts completions instead)."""
    num_generations: int = 8
    """G: completions sampled per prompt (a group)."""
    max_completion_length: int | None = None
    """Largest number of tokens per completion (an agent's episode: the policy's and the environment's together).
    None: the task's own, 40 for the built-in agent task arithmetic_tools, else 6 (the built-in task's)."""
    temperature: float = 1.0
    """Sampling temperature; log-probabilities on both sides are of softmax(logits / temperature)."""
    top_k: int = 0
    """Sample from the top_k most likely tokens only (TRL's name; 0: off). The policies are then the filtered,
    renormalised distributions on both sides, sampler and trainer, so pi_k/alpha stays exact (docs/theory.md,
    §1.1)."""
    top_p: float = 1.0
    """Nucleus sampling (TRL's name): the smallest set of most likely tokens with probability >= top_p, renormalised
    (1: off). The trainer's pi_theta is that filtered distribution of its own logits (docs/theory.md, §1.1)."""
    min_p: Annotated[float, none_reads(0.0)] = 0.0
    """Drop tokens whose probability is below min_p times the most likely one's (TRL's name; 0: off). Applied
    before top_k and top_p, in vLLM's order."""
    filter_groups: bool = False
    """Dynamic sampling (DAPO; verl's algorithm.filter_groups): keep only groups whose rewards vary and generate more
    rounds of prompts_per_step prompts from alpha until prompts_per_step such groups are gathered (or
    max_num_gen_batches rounds ran). The update then sees prompts chosen by their rewards (docs/theory.md, §6.2);
    ``sampling/gen_rounds`` and ``sampling/kept_group_share`` log what it took. Not with --async-generation."""
    max_num_gen_batches: int = 10
    """Dynamic sampling's bound on generation rounds per step, the first included (verl's name; 0: no bound). A step
    that ends short trains on the groups it has."""
    sampler: Literal["auto", "vllm", "server", "transformers"] = "auto"
    """'vllm' (in-process engine), 'server' (vLLM's own server in another process, at server_url; start it with
    ``python -m llm serve --model MODEL``), 'transformers' (generate on a copy of the weights), 'auto': vllm if importable."""
    use_transformers_continuous_batching: bool = False
    """The transformers sampler generates through transformers' continuous batching (``generate_batch``: a paged KV
    cache sized to the call, requests scheduled as they finish, a group's prompt cached once) instead of
    ``generate`` over a padded batch (TRL 1.16's name; its older alias ``use_transformers_paged`` is accepted). The
    same distribution and log alpha (tested against the trainer's recomputation under temperature, top-k and top-p);
    the draws come from one seeded stream per call, not one per sequence, so a sample depends on the schedule.
    Without CUDA graphs, which transformers would turn on for a mask-free attention: under them its sampling hit a
    device-side assert with this sampler's processor (an H200); --cache-implementation static is the graph path.
    Implies --sampler transformers where the sampler is 'auto'."""
    cache_implementation: Literal["dynamic", "static"] | None = None
    """The transformers sampler's KV cache (TRL's name): None or 'dynamic' (grown as tokens come; each run of equal
    prompts, a group's G completions, prefilled once), 'static' (preallocated for the call, prompts padded to the
    task's longest (and wider ones, an agent's later turns, to a multiple of 32), and the project's own decode loop, ``llm.sampling.static_decode``: one step per token compiled
    whole, under CUDA graphs on a GPU, by inductor on a CPU, reading the device back once every 16 steps instead of
    every token as generate does; minutes of compiling at the first call of each shape). log alpha is what was sampled either way (tested
    against the trainer's recomputation). With 'static' a call's draws come from one seeded stream, not one per
    sequence, so a sample depends on the batch it ran in. Implies --sampler transformers where the sampler is 'auto'."""
    vllm_gpu_memory_utilization: float = 0.3
    """Share of the GPU's memory the in-process engine may take (TRL's name and default; CUDA only: on a CPU the KV
    cache is sized from the window, or by vllm_kv_cache_gb)."""
    vllm_tensor_parallel_size: int = 1
    """GPUs the in-process engine shards the model over (TRL's name; CUDA only: a CPU engine refuses > 1)."""
    vllm_enable_sleep_mode: bool = False
    """The in-process engine frees its GPU memory (weights offloaded, cache dropped) after each generation call and
    takes it back before the next call or sync (TRL's name; CUDA only, refused on a CPU; untested: no GPU here)."""
    vllm_kv_cache_gb: float = 0.0
    """On a CPU, the in-process engine's KV cache in GiB (0: sized to a window's completions, llm.sampling.
    vllm_settings)."""
    server_url: Annotated[str, none_reads("")] = resumable("")
    """URL of the inference server for sampler 'server' (e.g. http://127.0.0.1:8000)."""
    server_timeout: float = resumable(120.0)
    """Seconds any request to the server may take (a generation call, one step of a weight sync)."""
    server_sync_address: str = resumable("127.0.0.1")
    """Address of this trainer as the server reaches it, for the weight-transfer rendezvous (the trainer listens
    on a free port there)."""

    @model_validator(mode="after")
    def _rules(self):
        require(self, self.prompts_per_step >= 1, "prompts_per_step", "must be >= 1")
        require(self, self.num_generations >= 2, "num_generations", "a group needs G >= 2 completions")
        require(self, self.max_num_gen_batches >= 0, "max_num_gen_batches", "must be >= 0 (0: no bound)")
        require(self, self.max_completion_length is None or self.max_completion_length >= 1, "max_completion_length",
                "must be >= 1 (or None: the task's own)")
        require(self, self.top_k >= 0, "top_k", "must be >= 0 (0: off)")
        require(self, 0 < self.top_p <= 1, "top_p", "must lie in (0, 1] (1: off)")
        require(self, 0 <= self.min_p < 1, "min_p", "must lie in [0, 1) (0: off)")
        require(self, MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE, "temperature",
                f"must lie in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}] (logits / temperature must stay finite in "
                "float32)")
        require(self, self.sampler != "server" or self.server_url.startswith(("http://", "https://")), "server_url",
                "sampler 'server' needs the server's URL, e.g. --server-url http://127.0.0.1:8000 "
                "(start one with python -m llm serve)")
        require(self, not self.server_url or self.sampler == "server", "server_url",
                f"given, but the sampler is {self.sampler!r}; add --sampler server")
        require(self, self.cache_implementation in (None, "dynamic") or self.sampler in ("auto", "transformers"),
                "cache_implementation", f"'static' is a mode of the transformers sampler's generate, but the sampler "
                f"is {self.sampler!r}; drop one of them")
        require(self, self.cache_implementation in (None, "dynamic") or not self.use_transformers_continuous_batching,
                "cache_implementation", "'static' is a mode of the transformers sampler's generate; continuous "
                "batching has its own paged cache: drop one of them")
        require(self, not self.use_transformers_continuous_batching or self.sampler in ("auto", "transformers"),
                "use_transformers_continuous_batching", f"is a mode of the transformers sampler, but the sampler is "
                f"{self.sampler!r}; drop one of them")
        require(self, self.server_timeout > 0, "server_timeout", "must be > 0")
        require(self, 0 < self.vllm_gpu_memory_utilization <= 1, "vllm_gpu_memory_utilization", "must lie in (0, 1]")
        require(self, self.vllm_tensor_parallel_size >= 1, "vllm_tensor_parallel_size", "must be >= 1")
        require(self, self.vllm_kv_cache_gb >= 0, "vllm_kv_cache_gb", "must be >= 0 (0: sized to the window)")
        return self

    @property
    def token_filter(self) -> TokenFilter:
        """top_k, top_p and min_p as one filter (``grpo_theory.truncation``)."""
        return TokenFilter(self.top_k, self.top_p, self.min_p)

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations


class MachineConfig(ConfigGroup):
    """The trainer's machine: device, precision, passes, kernels and memory (the same numbers up to float rounding,
    except dtype)."""

    per_device_train_batch_size: int = resumable(0)
    """Completions per forward and backward pass (a micro-batch; TRL's name). The P x G completions of a step
    run in ceil(P x G / this) micro-batches whose gradients add up to one optimiser step (TRL's
    gradient_accumulation_steps is that count: ``gradient_accumulation_steps`` below); the loss's normalisers,
    the zero-variance mask and the logged statistics are the whole step's, so the gradient does not depend on
    the split. Every other pass of the step (alpha, pi_ref, diagnostics) runs in micro-batches of the same size, and the
    transformers sampler generates that many sequences at a time (each from its own random stream: the samples do
    not depend on the split).
    0: the whole step in one pass (fastest on the built-in model; use 4-16 on real models)."""
    token_budget: int = resumable(0)
    """Tokens one forward (and backward) pass of the update may hold (TRL AsyncGRPO's name): the passes are cut by
    length so that each holds at most this many forwarded tokens (its rows x its longest row; with --padding-free,
    their own lengths), so a step of long completions runs in more, smaller passes and one of short ones in fewer;
    a sequence longer than the budget runs alone (none is dropped, unlike TRL's). Also under
    per_device_train_batch_size's row limit. The gradient is the same up to float rounding. 0: no budget."""
    group_by_length: bool = resumable(True)
    """Run the passes of a step (each at most ``per_device_train_batch_size`` completions) over sequences of similar
    length, each pass padded only to its own longest sequence, so padding positions stay out of the matmuls
    (transformers' name; the passes are chosen to minimise padded positions plus a fixed cost per pass). The
    gradient and every logged number are the same as without it, up to float rounding. Off: consecutive
    completions per pass, padded to the step's longest."""
    padding_free: bool = resumable(False)
    """Run each forward and backward pass of the trainer over its sequences packed into one row, without padding
    (TRL's SFT name): position ids restart at every sequence and attention stays within it (flash attention's
    variable-length kernel with --attn-implementation flash_attention_2, flex attention's block mask with
    flex_attention, and with sdpa or eager a block-diagonal causal mask: the fallback, whose size grows with the
    square of the row's length). The same log-probs, loss and gradient as the padded passes up to float rounding
    (tested for every model family of the suite; a model whose attention ignores the packing is refused at
    start-up). Prompts are then not shared (--share-prompts needs the padded layout)."""
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2", "flex_attention"] = resumable("auto")
    """The trainer's attention kernel (transformers' name; the sampler's is the engine's own). auto: transformers'
    choice (sdpa where the family has it), but with --padding-free on a GPU flex_attention. eager keeps a (length x
    length) score matrix per head, so prefer sdpa for long sequences; on a CPU eager can be the faster in bfloat16
    (docs/benchmarks.md). flash_attention_2 needs a CUDA device and the flash-attn package; flex_attention (torch's,
    compiled at its first calls) skips the blocks a --padding-free row's mask leaves empty; the transformers
    sampler's copy then decodes with sdpa (continuous batching has no paged flex attention)."""
    gradient_checkpointing: bool = resumable(False)
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (transformers'
    gradient checkpointing): activation memory of a micro-batch drops from about one layer's worth per layer
    to one hidden state per layer, for about one more forward pass of compute."""
    compile: bool = False
    """Compile each decoder block with torch.compile (inductor, dynamic shapes), fusing its norms, rotary
    embeddings, activations and autocast's casts around the matmuls: the same log-probs and gradients up to float
    rounding. The first passes compile (each block once per kind of pass), which takes minutes, so it pays in long
    runs (docs/benchmarks.md has the measured speed-ups); the output layer, outside the blocks, is not compiled.
    Untested on a GPU; not with --fsdp."""
    share_prompts: bool = resumable(True)
    """Run each distinct prompt of a pass through the decoder once and its G completions on its cached keys and values
    (gradients flow back into the prompt's pass), instead of every completion with its own copy of the prompt: the
    same log-probs and gradients up to float rounding for about P x prompt + P x G x completion positions instead of
    P x G x (prompt + completion). Used where it spares a quarter of the positions or more; not with --fsdp or
    --gradient-checkpointing (which drop the cache)."""
    logit_chunk_tokens: int = resumable(0)
    """Completion tokens whose full-vocabulary logits exist at once (the output layer runs chunk by chunk; in
    the backward pass a chunk's logits are recomputed). 0: 256 MB of float32 logits per chunk (441 tokens for
    a 151,936-token vocabulary)."""
    fsdp: bool = resumable(False)
    """Under torchrun: shard the transformer blocks of the policy, alpha, alpha's successor and pi_ref over the
    ranks (PyTorch's FSDP2), with their gradients and Adam moments, instead of every rank holding every weight
    (data parallel, the default). For a policy that does not fit one device. The embeddings, the final norm and the
    output layer stay whole on every rank (the chunked log-probs apply the output layer outside the model's
    forward); rank 0 keeps one unsharded copy in CPU memory for the sampler's syncs, evaluation and the saved model.
    Not with --use-peft."""
    device: str = resumable("auto")
    """'auto' (cuda if available), 'cpu' or 'cuda[:n]' for the trainer."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """bfloat16: the vLLM sampler runs in bf16 and the trainer's forward passes under bf16 autocast
    (weights and optimiser stay float32); log-probabilities and losses are always float32."""
    num_threads: int = resumable(0)
    """torch CPU threads (0: torch's default)."""
    keep_freed_memory: bool = resumable(True)
    """Keep freed host memory in the process for the next pass (glibc's malloc with no ``mmap`` per large block and
    no trim at ``free``; ``runkit.host_memory``) instead of handing every large block back to the system when it is
    freed, which makes each step fault its large tensors in anew (its speed-up: docs/models.md). Off: the resident
    set follows the live tensors more closely, at that cost. It applies to the whole process from the run's start; the
    run's freed memory goes back to the system when it ends."""
    freed_memory_ceiling: float = resumable(1.0)
    """With ``keep_freed_memory`` and micro-batches (``per_device_train_batch_size`` > 0: memory is what they are
    for): hand the freed memory back to the system after every pass of more than one micro-batch, and within a pass
    once the resident set has grown since its start by more than this many times the largest growth of one
    micro-batch, so that the heap's fragmentation does not grow with the batch (``runkit.host_memory.
    FreedMemoryCeiling``). Without micro-batches freed memory is kept until the run ends: a release there costs
    the next pass its page faults (docs/memory.md). 0: no ceiling."""

    @model_validator(mode="after")
    def _rules(self):
        require(self, self.freed_memory_ceiling >= 0, "freed_memory_ceiling", "must be >= 0 (0: no ceiling)")
        require(self, not (self.fsdp and self.compile), "compile",
                "is not tested with --fsdp's sharded blocks: drop one of --fsdp and --compile")
        require(self, self.token_budget >= 0, "token_budget", "must be >= 0 (0: no budget)")
        require(self, self.per_device_train_batch_size >= 0, "per_device_train_batch_size",
                "must be >= 0 (0: the whole step in one pass)")
        require(self, self.logit_chunk_tokens >= 0, "logit_chunk_tokens", "must be >= 0 (0: automatic)")
        require(self, 0 <= self.num_threads <= (os.cpu_count() or 1), "num_threads",
                f"must lie in [0, {os.cpu_count()}] (this machine's cores; 0: torch's default)")
        require(self, re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None, "device",
                "expected auto, cpu or cuda[:n]")
        return self

    @property
    def prompts_shared(self) -> bool:
        """Whether passes share prompts (``share_prompts``, unless FSDP or gradient checkpointing rules it out)."""
        return self.share_prompts and not self.fsdp and not self.gradient_checkpointing and not self.padding_free
