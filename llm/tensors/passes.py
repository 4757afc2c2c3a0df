"""How the trainer runs a model over a step's batch: ``Passes``, the settings every pass shares (temperature,
precision, micro-batch, logit chunk, grouping by length, shared prompts) and the ranks that split the rows.

Under torchrun each rank runs its share of the rows (a group never spans two ranks) and the per-token results are
summed into the whole batch's, so every caller sees whole-batch tensors; hidden states stay with their rank."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from llm.tensors import diagnostics as dg
from llm.tensors.batch import Batch
from llm.tensors.logit_head import LogitHead
from llm.tensors.logprobs import Forward, TokenDists, completion_logprobs, forward_completions
from llm.tensors.token_filter import NO_FILTER, TokenFilter
from llm.models.distributed import SINGLE, Ranks
from llm.models.model import Precision


@dataclass(frozen=True)
class Passes:
    """The settings of the trainer's forward passes (``GRPOConfig`` names in brackets)."""

    temperature: float
    precision: Precision = Precision()
    micro_batch: int = 0  # per_device_train_batch_size
    chunk_tokens: int = 0  # logit_chunk_tokens
    by_length: bool = False  # group_by_length
    share_prompts: bool = True  # share_prompts, where FSDP and gradient checkpointing allow it
    group_size: int = 1  # num_generations: a rank's share is whole groups
    ranks: Ranks = SINGLE
    token_filter: TokenFilter = NO_FILTER  # top_k, top_p, min_p: every policy is the filtered distribution
    padding_free: bool = False  # padding_free: each pass's sequences packed into one row
    token_budget: int = 0  # token_budget: the forwarded tokens a pass may hold (0: none)

    def split(self, batch: Batch) -> list[torch.Tensor]:
        """This rank's passes over ``batch``: micro-batches of at most ``micro_batch`` rows and ``token_budget``
        tokens (``Batch.passes``)."""
        return batch.passes(self.micro_batch, self.by_length, self.rows(batch), self.token_budget, self.padding_free)

    def rows(self, batch: Batch) -> torch.Tensor | None:
        """This rank's rows of ``batch`` (None: every row, one process)."""
        return self.ranks.rows(batch.size, self.group_size)

    def logprobs(self, model: torch.nn.Module, batch: Batch, **kw) -> Forward:
        """A pass of ``model`` without gradients over ``batch`` (``keep_hidden``, ``entropy`` as in
        ``llm.tensors.logprobs.completion_logprobs``): per-token results of the whole batch."""
        out = completion_logprobs(model, batch, self.temperature, self.precision, micro_batch=self.micro_batch,
                                  chunk_tokens=self.chunk_tokens, by_length=self.by_length, rows=self.rows(batch),
                                  ranks=self.ranks, share_prompts=self.share_prompts, token_filter=self.token_filter,
                                  packed=self.padding_free, token_budget=self.token_budget, **kw)
        return self.whole_batch(out)

    def forward(self, model: torch.nn.Module, batch: Batch, **kw) -> Forward:
        """One pass of ``model`` over ``batch`` with gradients (a micro-batch of the optimiser)."""
        return forward_completions(model, batch, self.temperature, self.precision, self.chunk_tokens,
                                   share_prompts=self.share_prompts, token_filter=self.token_filter,
                                   packed=self.padding_free, **kw)

    def whole_batch(self, fwd: Forward) -> Forward:
        """The ranks' per-token log-probs and entropies (each zero outside its rows) summed into the whole batch's."""
        if self.ranks.active:
            self.ranks.sum(fwd.logp)
            if fwd.entropy is not None:
                self.ranks.sum(fwd.entropy)
        return fwd

    def dists(self, model: torch.nn.Module, hidden: torch.Tensor | None) -> TokenDists | None:
        """``model``'s next-token distributions at the completion positions whose final hidden states are
        ``hidden``."""
        return None if hidden is None else TokenDists(LogitHead(model, self.temperature, self.token_filter), hidden,
                                                      self.precision)

    def frozen_dists(self, model: torch.nn.Module, hidden: torch.Tensor | None) -> TokenDists | None:
        """``dists`` with a copy of the output layer as it is now, readable after an update changes the model's."""
        dists = self.dists(model, hidden)
        if dists is not None:
            dists.head.layer = copy.deepcopy(dists.head.layer).requires_grad_(False)
        return dists

    def own_rows(self, mask: torch.Tensor) -> torch.Tensor:
        """``mask`` (B, T) zeroed off this rank's rows (``mask`` itself in one process): the rows whose hidden states
        this rank holds."""
        rows = self.ranks.rows(mask.shape[0], self.group_size)
        if rows is None:
            return mask
        mine = torch.zeros_like(mask)
        mine[rows.to(mask.device)] = mask[rows.to(mask.device)]
        return mine

    def token_divergences(self, a: TokenDists, b: TokenDists, mask: torch.Tensor):
        """``llm.tensors.diagnostics.token_divergences`` over the whole batch at this pass's chunk size: each rank
        expands its own rows (where its hidden states are) and the ranks' arrays, zero off their rows, are summed."""
        tv, kl = dg.token_divergences(a, b, self.own_rows(mask), self.chunk_tokens)
        if self.ranks.active:
            both = self.ranks.sum(torch.from_numpy(np.stack([tv, kl])).to(mask.device))
            tv, kl = both.cpu().double().numpy()
        return tv, kl

    def chain_tv(self, a: TokenDists, b: TokenDists, mask: torch.Tensor) -> float:
        """``llm.tensors.diagnostics.chain_tv_estimate`` over the whole batch: each rank sums over its own rows (where its
        hidden states are) and the sums are added up."""
        total = dg.chain_tv_sum(a, b, self.own_rows(mask), self.chunk_tokens)
        return dg.chain_tv_estimate(self.ranks.sum_float(total), mask.shape[0])
