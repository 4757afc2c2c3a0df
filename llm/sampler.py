"""Samplers hold the behaviour policy alpha and generate groups of completions.

The interface is small: ``generate`` returns completion token ids and the behaviour log-probs of
the sampled tokens (log softmax(logits / temperature), no top-k / top-p, so the importance
weights are exact); ``load_weights`` copies the trainer's current weights in (alpha <- pi_theta).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Protocol

import torch


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


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` in eval mode with gradients off (alpha's or pi_ref's weights)."""
    m = copy.deepcopy(model).eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


@torch.no_grad()
def copy_weights(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """dst <- src, parameter by parameter (same architecture)."""
    source = dict(src.named_parameters())
    for name, p in dst.named_parameters():
        p.copy_(source[name].detach())


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
