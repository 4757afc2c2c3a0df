"""A step's sequences as tensors, and the log-probabilities of their completion tokens.

Prompts are left-padded and completions right-padded, so every completion starts at the same column
``prompt_width`` and positions are counted from each sequence's first real token (as in generation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .model import Precision


@dataclass
class Batch:
    """Prompt (left-padded) + completion (right-padded) sequences of one step, B = P x G rows."""

    input_ids: torch.Tensor       # (B, Lp + T)
    attention_mask: torch.Tensor  # (B, Lp + T)
    position_ids: torch.Tensor    # (B, Lp + T), counted from each sequence's first real token
    completion_ids: torch.Tensor  # (B, T)
    completion_mask: torch.Tensor  # (B, T) float, 1 on generated tokens (EOS included)
    prompt_width: int


def make_batch(prompt_ids: list[list[int]], completions: list[list[int]], pad: int, device) -> Batch:
    lp = max(map(len, prompt_ids))
    t = max(1, max(map(len, completions)))
    rows, masks, comp, cmask = [], [], [], []
    for p, c in zip(prompt_ids, completions):
        rows.append([pad] * (lp - len(p)) + p + c + [pad] * (t - len(c)))
        masks.append([0] * (lp - len(p)) + [1] * (len(p) + len(c)) + [0] * (t - len(c)))
        comp.append(c + [pad] * (t - len(c)))
        cmask.append([1.0] * len(c) + [0.0] * (t - len(c)))
    attn = torch.tensor(masks, device=device)
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
    return Batch(torch.tensor(rows, device=device), attn, pos, torch.tensor(comp, device=device),
                 torch.tensor(cmask, device=device), lp)


def padded(rows: list[list[float]], t: int, device) -> torch.Tensor:
    """Ragged per-token values (e.g. a sampler's log-probs) as a zero-padded (B, t) float32 tensor."""
    return torch.tensor([r + [0.0] * (t - len(r)) for r in rows], dtype=torch.float32, device=device)


def completion_logprobs(model, batch: Batch, temperature: float, precision: Precision = Precision(),
                        full: bool = False):
    """log softmax(logits / T) of the completion tokens, float32, (B, T); with ``full`` also the
    whole next-token distributions (B, T, V). Returns ``(logp, logp_full or None)``."""
    with precision.autocast(batch.input_ids.device):
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids, use_cache=False).logits
    t = batch.completion_ids.shape[1]
    logits = logits[:, batch.prompt_width - 1: batch.prompt_width - 1 + t].float() / temperature
    logp_full = torch.log_softmax(logits, dim=-1)
    logp = logp_full.gather(-1, batch.completion_ids[..., None]).squeeze(-1)
    return (logp, logp_full) if full else (logp, None)
