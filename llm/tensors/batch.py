"""A step's sequences as tensors, whole or in micro-batches (log-probabilities: ``llm.tensors.logprobs``).

Prompts are left-padded and completions right-padded, so every completion starts at the same column
``prompt_width`` and positions are counted from each sequence's first real token (as in generation).

A step's forward and backward passes need not run over that rectangle: ``Batch.passes`` groups sequences of
similar length (``group_by_length``) and ``Batch.take`` trims each group's columns to its longest sequence,
so padding positions, which need no gradient and influence nothing, mostly stay out of the matmuls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

#: Fixed cost of one forward/backward pass when ``length_groups`` chooses the passes, in rows of the step's longest
#: sequence: a pass is split off only if it saves more padded positions than this many such rows. Measured on the
#: benchmark model (float32, 2 CPU cores, 64 sequences of up to 69 positions, one fwd+bwd+AdamW step, medians of 3):
#: passes chosen with a cost of about 0.5, 2, 4 or 7 rows took 2.19-2.37 s against 2.83-2.93 s for the whole
#: rectangle; a cost of 0 (17 passes, most of 2 rows) 2.33 s. Scaling with the longest row keeps the choice the
#: same at every sequence length.
PASS_OVERHEAD_ROWS = 2.0


def length_groups(lengths, max_rows: int = 0, overhead_rows: float = PASS_OVERHEAD_ROWS, token_budget: int = 0,
                  packed: bool = False) -> list[np.ndarray]:
    """Rows of each pass when rows of ``lengths`` are run in passes padded to their own longest row: rows sorted by
    length (stably), cut into consecutive runs of at most ``max_rows`` rows (0: no limit) and, with a
    ``token_budget``, of at most that many forwarded tokens (rows x the longest; ``packed``: the rows' own lengths,
    one row of them; a row longer than the budget runs alone), so that the padded positions plus ``overhead_rows`` x
    the longest length per pass are least (dynamic programming over the cut points; no partition of the rows does
    better, contiguous or not). Returns the row indices of each pass, shortest rows first."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    order = np.argsort(lengths, kind="stable")
    srt = lengths[order]
    overhead = overhead_rows * (int(srt[-1]) if n else 0)
    cap = max_rows if 0 < max_rows < n else n
    best = np.zeros(n + 1)
    cut = np.zeros(n + 1, dtype=np.int64)
    prefix = np.concatenate([[0], np.cumsum(srt)])
    for j in range(1, n + 1):  # best[j]: the first j sorted rows; the last pass holds rows i..j-1
        i = np.arange(max(0, j - cap), j)
        cost = best[i] + (j - i) * srt[j - 1] + overhead
        if token_budget:  # over the budget: out, but for a row alone
            tokens = prefix[j] - prefix[i] if packed else (j - i) * srt[j - 1]
            cost = np.where((tokens <= token_budget) | (i == j - 1), cost, np.inf)
        k = int(np.argmin(cost))
        best[j], cut[j] = cost[k], i[k]
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]


@dataclass
class Batch:
    """Prompt (left-padded) + completion (right-padded) sequences of one step, B = P x G rows."""

    input_ids: torch.Tensor       # (B, Lp + T)
    attention_mask: torch.Tensor  # (B, Lp + T)
    position_ids: torch.Tensor    # (B, Lp + T), counted from each sequence's first real token
    completion_ids: torch.Tensor  # (B, T)
    completion_mask: torch.Tensor  # (B, T) float, 1 on the completion's tokens (EOS included), 0 on padding
    prompt_width: int
    tool_mask: torch.Tensor | None = None
    """(B, T) float, TRL's name: 1 on the policy's own tokens, 0 on an agent episode's environment tokens (a tool's
    result and the chat template's glue around it, ``llm.agents``); None: every completion token is the policy's."""

    @property
    def policy_mask(self) -> torch.Tensor:
        """1 on the tokens the policy drew: ``completion_mask`` times ``tool_mask``. The loss, the importance weights,
        the TV distances and every bound term run over these tokens only (docs/theory.md, §8.8)."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def passes(self, size: int, by_length: bool, rows: torch.Tensor | None = None, token_budget: int = 0,
               packed: bool = False) -> list[torch.Tensor]:
        """Row indices of the forward passes over this batch (or over its ``rows`` only: a rank's share), at most
        ``size`` rows each (0: no limit) and at most ``token_budget`` forwarded tokens each (0: no limit; ``packed``:
        counted without padding): consecutive rows, or (``by_length``, and always with a budget) rows of similar
        length grouped by ``length_groups``."""
        rows = torch.arange(self.size) if rows is None else rows.cpu()
        if len(rows) == 0:
            return []
        if not (by_length or token_budget):
            return list(rows.split(size or len(rows)))
        lengths = self.attention_mask[rows.to(self.attention_mask.device)].sum(dim=1).cpu().numpy()
        return [rows[torch.from_numpy(g)] for g in length_groups(lengths, size, token_budget=token_budget,
                                                                  packed=packed)]

    def take(self, rows: torch.Tensor) -> "Batch":
        """Sequences ``rows``, with the columns that are padding in all of them dropped (prompt columns on the left,
        completion columns on the right): the same sequences, positions and log-probs, fewer padded positions.
        Per-token results of the taken batch go back with ``llm.tensors.logprobs.Forward.assemble``."""
        rows = rows.to(self.input_ids.device)
        attn = self.attention_mask[rows]
        lp = self.prompt_width
        left = int(attn[:, :lp].sum(dim=0).gt(0).int().argmax()) if lp else 0  # first prompt column in use
        t = max(1, int(self.completion_mask[rows].sum(dim=1).max()))
        cols = slice(left, lp + t)
        return Batch(self.input_ids[rows, cols], attn[:, cols], self.position_ids[rows, cols],
                     self.completion_ids[rows, :t], self.completion_mask[rows, :t], lp - left,
                     None if self.tool_mask is None else self.tool_mask[rows, :t])


def make_batch(prompt_ids: list[list[int]], completions: list[list[int]], pad: int, device,
               tool_masks: list[list[int]] | None = None) -> Batch:
    """The batch of ``prompt_ids[j] + completions[j]``; ``tool_masks`` (an agent's episodes): 1 on the policy's
    tokens and 0 on the environment's, one per completion token."""
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
    tool = None
    if tool_masks is not None:
        if any(len(m) != len(c) for m, c in zip(tool_masks, completions, strict=True)):
            raise ValueError("tool_masks: one entry per completion token")
        tool = torch.tensor([[float(x) for x in m] + [0.0] * (t - len(m)) for m in tool_masks], device=device)
    return Batch(torch.tensor(rows, device=device), attn, pos, torch.tensor(comp, device=device),
                 torch.tensor(cmask, device=device), lp, tool)


def padded(rows: list[list[float]], t: int, device) -> torch.Tensor:
    """Ragged per-token values (e.g. a sampler's log-probs) as a zero-padded (B, t) float32 tensor."""
    return torch.tensor([r + [0.0] * (t - len(r)) for r in rows], dtype=torch.float32, device=device)
