"""A step's sequences as tensors, whole or in micro-batches (log-probabilities: ``llm.logprobs``).

Prompts are left-padded and completions right-padded, so every completion starts at the same column
``prompt_width`` and positions are counted from each sequence's first real token (as in generation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """Prompt (left-padded) + completion (right-padded) sequences of one step, B = P x G rows."""

    input_ids: torch.Tensor       # (B, Lp + T)
    attention_mask: torch.Tensor  # (B, Lp + T)
    position_ids: torch.Tensor    # (B, Lp + T), counted from each sequence's first real token
    completion_ids: torch.Tensor  # (B, T)
    completion_mask: torch.Tensor  # (B, T) float, 1 on generated tokens (EOS included)
    prompt_width: int

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def rows(self, start: int, stop: int) -> "Batch":
        """Sequences ``start:stop`` (same columns)."""
        s = slice(start, stop)
        return Batch(self.input_ids[s], self.attention_mask[s], self.position_ids[s], self.completion_ids[s],
                     self.completion_mask[s], self.prompt_width)

    def micro_batches(self, size: int) -> list["Batch"]:
        """Consecutive slices of ``size`` sequences (the last may be shorter); ``size`` 0: the whole batch."""
        return [self.rows(s.start, s.stop) for s in self.slices(size)]

    def slices(self, size: int) -> list[slice]:
        """The row ranges of ``micro_batches(size)``, for slicing per-row tensors alongside."""
        size = size if size > 0 else self.size
        return [slice(s, s + size) for s in range(0, self.size, size)]


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
