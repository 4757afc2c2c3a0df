"""Samplers: who holds alpha and generates the completions (docs/theory.md, §1 and §7).

- ``hf_generate.TransformersSampler``: a frozen copy of the policy sampled with ``transformers.generate``;
- ``hf_continuous.ContinuousBatchingSampler``: the same copy sampled through transformers' continuous batching;
- ``vllm_engine.VLLMSampler``: an in-process vLLM engine with a verified weight sync;
- ``server.ServerSampler``: vLLM's own server in another process (``python -m llm serve``), synced through
  vLLM's weight-transfer API.

``make_sampler`` builds the one a ``SamplerSpec`` names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llm.tensors.token_filter import NO_FILTER, TokenFilter
from llm.models.model import architecture
from llm.sampling.base import Rollout, Sampler
from llm.sampling.hf_generate import TransformersSampler
from llm.sampling.vllm_settings import quiet_vllm

quiet_vllm()  # before any import of vllm

__all__ = ["Rollout", "Sampler", "TransformersSampler", "check_vllm_supports", "make_sampler", "max_model_len", "SamplerSpec",
           "kind_class", "probe_sync", "resolve_sampler", "SAMPLERS"]


#: Each kind of sampler a run may use -> (module, class). ``resolve_sampler`` picks the kind; the class's attributes say
#: what it is (``llm.sampling.base.Sampler``); ``make_sampler`` builds it with ``BUILDERS``'s entry of the same kind.
SAMPLERS = {"transformers": ("llm.sampling.hf_generate", "TransformersSampler"),
            "transformers-continuous": ("llm.sampling.hf_continuous", "ContinuousBatchingSampler"),
            "vllm": ("llm.sampling.vllm_engine", "VLLMSampler"),
            "server": ("llm.sampling.server", "ServerSampler")}


def resolve_sampler(sampling) -> tuple[str, str]:
    """The kind of sampler a run uses (a key of ``SAMPLERS``) and why: the sampling group's ``sampler``
    (``SamplingConfig``), a transformers mode (--use-transformers-continuous-batching, --cache-implementation static)
    choosing the transformers sampler where it is 'auto', else vLLM in process when it imports. The one place this is
    decided."""
    kind, why = sampling.sampler, "given"
    if kind == "auto":
        from llm.sampling.vllm_engine import vllm_available

        if sampling.use_transformers_continuous_batching:
            kind, why = "transformers", "auto: --use-transformers-continuous-batching"
        elif sampling.cache_implementation == "static":
            kind, why = "transformers", "auto: --cache-implementation static"
        else:
            kind, why = ("vllm", "auto: vLLM imports") if vllm_available() else ("transformers", "auto: no vLLM")
    if kind == "transformers" and sampling.use_transformers_continuous_batching:
        return "transformers-continuous", why
    return kind, why


def kind_class(kind: str) -> type:
    """The class of a kind of sampler (a key of ``SAMPLERS``), imported on demand: its attributes say what it is."""
    import importlib

    module, name = SAMPLERS[kind]
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class SamplerSpec:
    """What building a sampler reads (``llm.run.specs.sampler`` resolves it from the config): the kind (a key of
    ``SAMPLERS``), the completion budget, and each kind's own options (TRL's names in brackets)."""

    kind: str
    completion_budget: int
    seed: int = 0
    dtype: str = "float32"
    server_url: str = ""  # vllm_server_base_url
    server_timeout: float = 120.0
    sync_host: str = "127.0.0.1"  # server_sync_address
    sequences: int = 1  # completions of one generation call (the in-process engine sizes its cache by them)
    group: int = 1  # num_generations
    trust_remote_code: bool = False
    trim_memory: bool = False  # not keep_freed_memory
    gpu_memory_utilization: float = 0.3  # vllm_gpu_memory_utilization
    tensor_parallel_size: int = 1  # vllm_tensor_parallel_size
    enable_sleep_mode: bool = False  # vllm_enable_sleep_mode
    kv_cache_bytes: int = 0  # vllm_kv_cache_gb
    batch_size: int = 0  # per_device_train_batch_size: the transformers sampler's sequences per generate call
    share_prompts: bool = True
    cache_implementation: str | None = None


def make_sampler(spec: SamplerSpec, policy: torch.nn.Module, tokenizer, model_path: str,
                 max_prompt_tokens: int) -> Sampler:
    """The sampler of ``spec.kind``, holding alpha = the initial policy; a server holds whatever it was last sent
    until ``load_weights`` (``llm.step.weights.Weights.build`` sends the policy)."""
    return BUILDERS[spec.kind](kind_class(spec.kind), spec, policy, tokenizer, model_path, max_prompt_tokens)


def _server(cls, spec: SamplerSpec, policy, tokenizer, model_path: str, max_prompt_tokens: int) -> Sampler:
    check_vllm_supports(policy)
    return cls(spec.server_url, model_path, eos_token_id=tokenizer.eos_token_id,
               max_model_len=max_model_len(policy, spec.completion_budget, max_prompt_tokens),
               timeout=spec.server_timeout, sync_host=spec.sync_host)


def _vllm(cls, spec: SamplerSpec, policy, tokenizer, model_path: str, max_prompt_tokens: int) -> Sampler:
    check_vllm_supports(policy)
    if architecture(policy).startswith("Olmo"):
        raise ValueError("sampler: an in-process vLLM engine breaks transformers' OLMo model in the same process "
                         "(AttributeError 'do_not_compile'); use --sampler transformers or --sampler server")
    return cls(model_path, dtype=spec.dtype, seed=spec.seed,
               max_model_len=max_model_len(policy, spec.completion_budget, max_prompt_tokens),
               eos_token_id=tokenizer.eos_token_id, model_config=policy.config, sequences=spec.sequences,
               group=spec.group, prompt_tokens=max_prompt_tokens, trust_remote_code=spec.trust_remote_code,
               trim_memory=spec.trim_memory, gpu_memory_utilization=spec.gpu_memory_utilization,
               tensor_parallel_size=spec.tensor_parallel_size, enable_sleep_mode=spec.enable_sleep_mode,
               kv_cache_bytes=spec.kv_cache_bytes)


def _continuous(cls, spec: SamplerSpec, policy, tokenizer, model_path: str, max_prompt_tokens: int) -> Sampler:
    return cls(policy, tokenizer.eos_token_id, tokenizer.pad_token_id)


def _transformers(cls, spec: SamplerSpec, policy, tokenizer, model_path: str, max_prompt_tokens: int) -> Sampler:
    return cls(policy, tokenizer.eos_token_id, tokenizer.pad_token_id, batch_size=spec.batch_size,
               share_prompts=spec.share_prompts, cache_implementation=spec.cache_implementation,
               prompt_width=max_prompt_tokens)


#: How each kind of ``SAMPLERS`` is built from its ``SamplerSpec``.
BUILDERS = {"transformers": _transformers, "transformers-continuous": _continuous, "vllm": _vllm, "server": _server}


def max_model_len(model: torch.nn.Module, completion_budget: int, max_prompt_tokens: int) -> int:
    """Longest sequence the engine must hold: the longest prompt plus the run's completion budget."""
    limit = int(getattr(model.config, "max_position_embeddings", 1 << 20))
    need = max_prompt_tokens + completion_budget
    if need > limit:
        raise ValueError(f"max_completion_length: the longest prompt ({max_prompt_tokens} tokens) plus "
                         f"{completion_budget} generated exceed the model's {limit} positions; "
                         "shorten the prompts or lower it")
    return need


#: The start-up probe's perturbation: weights move by this times their own scale (enough that an engine which
#: missed them is off by far more than the float32 tolerance).
PROBE_NOISE = 0.05


def probe_sync(sampler: Sampler, policy: torch.nn.Module, prompts: list[list[int]], pad_token_id: int,
               temperature: float, precision, check, token_filter: TokenFilter = NO_FILTER) -> float:
    """Prove at start-up that weights reach the sampler for this model's architecture: sync a perturbed copy
    of the policy, sample, compare the sampler's log-probs with the copy's, then sync the policy back.
    Returns the gap that ``check`` (``llm.tensors.sync_probe.SyncCheck``) reads; raises ``ValueError`` (one line, naming
    the architecture) above its tolerance, or, for a check calibrated on the rounding floor (bfloat16), unless the
    sampler is ``PROBE_SEPARATION`` times closer to the perturbed weights than to the unperturbed ones."""
    from llm.tensors.batch import make_batch, padded
    from llm.tensors.sync_probe import PROBE_SEPARATION
    from llm.tensors.logprobs import completion_logprobs
    from llm.models.model import frozen_copy

    device = next(policy.parameters()).device
    probe = frozen_copy(policy)
    g = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for p in probe.parameters():
            if p.numel() > 1:
                noise = torch.randn(p.shape, generator=g).to(device=device, dtype=p.dtype)
                p.add_(PROBE_NOISE * p.float().std().clamp_min(1e-3).to(p.dtype) * noise)
    try:
        sampler.load_weights(probe)
        roll = sampler.generate(prompts, 2, 4, temperature, 0, token_filter=token_filter)
        batch = make_batch([p for p in prompts for _ in range(2)], roll.completion_ids, pad_token_id, device)
        with torch.no_grad():
            logp = completion_logprobs(probe, batch, temperature, precision, token_filter=token_filter).logp
            unsynced = (completion_logprobs(policy, batch, temperature, precision, token_filter=token_filter).logp
                        if check.floor_factor else None)
        reported = padded(roll.logprobs, logp.shape[1], device)
        gap = check.gap(reported, logp, batch.policy_mask)
    finally:
        sampler.load_weights(policy)
    apart = check.gap(reported, unsynced, batch.policy_mask) if unsynced is not None else None
    if not (gap <= check.tolerance or (apart is not None and PROBE_SEPARATION * gap <= apart)):
        arch = architecture(policy)
        raise ValueError(f"sampler: weights synced into the {sampler.name} sampler do not reach its forward pass for "
                         f"{arch} (log-prob gap {gap:.2e} > {check.tolerance:g} after a sync, {check.metric}"
                         f"{'' if apart is None else f'; {apart:.2e} to the weights before it'}); this architecture "
                         "cannot be trained with it: use --sampler transformers")
    return gap


def check_vllm_supports(policy: torch.nn.Module) -> None:
    """Refuse at start-up what vLLM's CPU attention cannot run (it fails deep inside the engine otherwise)."""
    if torch.cuda.is_available():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    cfg = policy.config
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        arch = architecture(policy)
        raise ValueError(f"sampler: vLLM's CPU attention does not support this model's head size {head} ({arch}; "
                         f"supported: {', '.join(map(str, sizes))}); use --sampler transformers")
