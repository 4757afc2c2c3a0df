"""Samplers: who holds alpha and generates the completions (docs/theory.md, §1 and §7).

- ``hf_generate.TransformersSampler``: a frozen copy of the policy sampled with ``transformers.generate``;
- ``vllm_engine.VLLMSampler``: an in-process vLLM engine with a verified weight sync;
- ``server.ServerSampler``: vLLM's own server in another process (``python -m llm.serve``), synced through
  vLLM's weight-transfer API.

``make_sampler`` picks one from the config.
"""

from __future__ import annotations

import torch

from .base import Rollout, Sampler
from .hf_generate import TransformersSampler

__all__ = ["Rollout", "Sampler", "TransformersSampler", "make_sampler", "max_model_len"]


def make_sampler(config, policy: torch.nn.Module, tokenizer, model_path: str, max_prompt_tokens: int) -> Sampler:
    """The sampler ``config.sampler`` names ('auto': vLLM when it imports), holding alpha = the initial policy
    (a server, whose weights may be anyone's, is sent the policy's weights first)."""
    kind = config.sampler
    if kind == "auto":
        from .vllm_engine import vllm_available

        kind = "vllm" if vllm_available() else "transformers"
    if kind == "server":
        from .server import ServerSampler

        sampler = ServerSampler(config.server_url, model_path, eos_token_id=tokenizer.eos_token_id,
                                max_model_len=max_model_len(policy, config, max_prompt_tokens),
                                timeout=config.server_timeout, sync_host=config.server_sync_address)
        sampler.load_weights(policy)
        return sampler
    if kind == "vllm":
        from .vllm_engine import VLLMSampler

        return VLLMSampler(model_path, dtype=config.dtype, seed=config.seed,
                           max_model_len=max_model_len(policy, config, max_prompt_tokens),
                           eos_token_id=tokenizer.eos_token_id)
    return TransformersSampler(policy, tokenizer.eos_token_id, tokenizer.pad_token_id)


def max_model_len(model: torch.nn.Module, config, max_prompt_tokens: int) -> int:
    """Longest sequence the engine must hold: the longest prompt plus the completion budget."""
    limit = int(getattr(model.config, "max_position_embeddings", 1 << 20))
    need = max_prompt_tokens + config.max_completion_length
    if need > limit:
        raise ValueError(f"max_completion_length: prompts of {max_prompt_tokens} tokens plus "
                         f"{config.max_completion_length} generated exceed the model's {limit} positions")
    return need
