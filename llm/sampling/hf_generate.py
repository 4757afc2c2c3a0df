"""The transformers sampler: alpha as a frozen copy of the policy, sampled with ``generate``."""

from __future__ import annotations

import torch

from ..model import copy_weights, frozen_copy
from .base import Rollout


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
