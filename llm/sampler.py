"""Samplers hold the behaviour policy alpha and generate groups of completions (docs/theory.md, §1 and §7).

The interface is small: ``generate`` returns completion token ids and the behaviour log-probs of
the sampled tokens (log softmax(logits / temperature), no top-k / top-p, so the importance
weights are exact); ``load_weights`` copies the trainer's current weights in (alpha <- pi_theta).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .model import copy_weights, frozen_copy


@dataclass
class Rollout:
    """Completions for a list of prompts, ``n`` per prompt, prompt-major (prompt 0's n first)."""

    completion_ids: list[list[int]]
    """Token ids of each completion, ending with EOS when one was generated."""
    logprobs: list[list[float]] | None
    """Sampler's log alpha of each completion token (None if the sampler does not report them)."""

    def slice(self, start: int, stop: int) -> "Rollout":
        return Rollout(self.completion_ids[start:stop], None if self.logprobs is None else self.logprobs[start:stop])


class Sampler(Protocol):
    name: str

    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int) -> Rollout:
        ...

    def load_weights(self, model: torch.nn.Module) -> None:
        ...

    def close(self) -> None:
        ...


class TransformersSampler:
    """alpha as its own copy of the trainer's model, sampled with ``transformers.generate``."""

    name = "transformers"

    def __init__(self, model: torch.nn.Module, eos_token_id: int, pad_token_id: int):
        self.model = frozen_copy(model)
        self.eos, self.pad = eos_token_id, pad_token_id

    def load_weights(self, model: torch.nn.Module) -> None:
        copy_weights(self.model, model)

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int) -> Rollout:
        device = next(self.model.parameters()).device
        width = max(map(len, prompt_ids))
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompt_ids], device=device)
        mask = (torch.arange(width, device=device)[None, :] >= torch.tensor(
            [width - len(p) for p in prompt_ids], device=device)[:, None]).long()
        torch.manual_seed(seed)
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
            max_new_tokens=max_tokens, num_return_sequences=n, pad_token_id=self.pad, eos_token_id=self.eos,
            output_logits=True, return_dict_in_generate=True)
        tokens = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float() / temperature  # (B*n, T, V), raw logits
        logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, : logits.shape[1], None]).squeeze(-1)
        comps, lps = [], []
        for row, lp in zip(tokens.tolist(), logp.tolist()):
            length = row.index(self.eos) + 1 if self.eos in row else len(row)
            comps.append(row[:length])
            lps.append(lp[:length])
        return Rollout(comps, lps)

    def close(self) -> None:
        self.model = None


def make_sampler(config, policy: torch.nn.Module, tokenizer, model_path: str, max_prompt_tokens: int) -> Sampler:
    """The sampler ``config.sampler`` names ('auto': vLLM when it imports), holding alpha = the initial policy."""
    kind = config.sampler
    if kind == "auto":
        from .vllm_sampler import vllm_available

        kind = "vllm" if vllm_available() else "transformers"
    if kind == "vllm":
        from .vllm_sampler import VLLMSampler

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
