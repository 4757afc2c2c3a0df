"""A step's behaviour stage: log alpha of the completion tokens, the sampler's report or the trainer's recomputation
with alpha's weights (``alpha_logprobs``), and which the loss uses (``Behaviour.log_alpha``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llm.tensors.batch import Batch, padded
from llm.tensors.logprobs import TokenDists
from llm.tensors.passes import Passes
from llm.sampling import Rollout


@dataclass
class Behaviour:
    """log alpha of the completion tokens, (B, T) float32: the sampler's report (``from_sampler``), the trainer's
    recomputation with alpha's weights (``recomputed``; over the first ``checked_rows`` rows only when the sync check
    alone needs it, 0: every row) and alpha's next-token distributions (``dists``, the chain-rule TV only). Each is
    None when not computed."""

    from_sampler: torch.Tensor | None
    recomputed: torch.Tensor | None = None
    dists: TokenDists | None = None
    checked_rows: int = 0

    def log_alpha(self, prefer_sampler: bool) -> torch.Tensor | None:
        """The log alpha the loss uses: the sampler's (``prefer_sampler``, when reported) or the recomputation;
        None when neither exists, which at lag 0 means pi_k's own (alpha's weights are pi_k's)."""
        if prefer_sampler and self.from_sampler is not None:
            return self.from_sampler
        return self.recomputed if self.recomputed is not None else None


def sampler_logprobs(roll: Rollout, batch: Batch) -> torch.Tensor | None:
    """The sampler's log alpha of the completion tokens as a (B, T) tensor (None if it reports none)."""
    if roll.logprobs is None:
        return None
    return padded(roll.logprobs, batch.completion_ids.shape[1], batch.input_ids.device)


def alpha_logprobs(passes: Passes, alpha: torch.nn.Module, batch: Batch, from_sampler: torch.Tensor | None, *,
                   recompute: bool, check: bool, keep_hidden: bool) -> Behaviour:
    """log alpha at lag > 0: the sampler's, and a forward of alpha's weights when the loss needs it (``recompute``,
    or a sampler that reports none), when the token-level TV needs alpha's distributions (``keep_hidden``), or for
    the sync check alone (``check``: one group's forward suffices). (At lag 0 alpha's weights are pi_k's, whose
    forward the optimiser runs anyway: no pass here.)"""
    need = recompute or from_sampler is None
    if not (need or check or keep_hidden):
        return Behaviour(from_sampler)
    if not (need or keep_hidden):  # the sync check alone: one group's forward of alpha suffices
        G = passes.group_size
        part = passes.logprobs(alpha, batch.take(torch.arange(G))).logp
        recomputed = torch.zeros_like(from_sampler)
        recomputed[:G, :part.shape[1]] = part
        return Behaviour(from_sampler, recomputed, checked_rows=G)
    fwd = passes.logprobs(alpha, batch, keep_hidden=keep_hidden)
    return Behaviour(from_sampler, fwd.logp, passes.dists(alpha, fwd.hidden))
