"""Log-probabilities of completion tokens without full-vocabulary tensors (README, "Memory").

A forward pass runs the model's decoder (``model.get_decoder()``) over the sequences and keeps its final hidden
states at the completion positions only. The output layer (``llm.tensors.logit_head.LogitHead``) is then applied to the real completion
tokens (padding skipped) in chunks of ``chunk_tokens`` rows, so at most (chunk_tokens x V) float32 logits exist
at a time. With gradients on and more than one chunk, each chunk runs under activation checkpointing: its
logits are recomputed in the backward pass instead of being kept (one more pass of the output layer, the price of
memory that does not grow with the vocabulary). The result is log_softmax(model(...).logits / T) gathered at
the sampled tokens (tested equal for every family in ``llm.models.tiny.FAMILIES``), without the (B x L x V) logits a
plain forward materialises.

Distributions over the whole vocabulary, needed by the token-level TV diagnostics, are kept as hidden states
(``TokenDists``: B x T x H, not B x T x V) and expanded chunk by chunk when they are compared.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from runkit.host_memory import micro_batches

from llm.tensors.batch import Batch
from llm.tensors.logit_head import HEAD_CHECK_TOLERANCE, LogitHead, chunk_rows, head_tolerance, token_logprobs
from llm.tensors.token_filter import NO_FILTER, TokenFilter
from llm.models.distributed import SINGLE, Ranks
from llm.models.model import Precision, architecture

@dataclass
class Forward:
    """One model's pass over a batch's completions: ``logp`` (B, T) float32 (0 off the completion tokens), the
    next-token ``entropy`` (B, T) and the final ``hidden`` states at the completion positions (B, T, H), each
    only when asked for (detached)."""

    logp: torch.Tensor
    entropy: torch.Tensor | None = None
    hidden: torch.Tensor | None = None

    @staticmethod
    def assemble(batch: Batch, rows: list[torch.Tensor], parts: list["Forward"]) -> "Forward":
        """The passes ``parts`` over ``batch.take(r)`` for ``r`` in ``rows`` as one pass over ``batch``: per-token
        values in the batch's rows and columns (B, T, ...), zero at padding and in rows no pass covers."""
        def join(values: list[torch.Tensor | None]) -> torch.Tensor | None:
            if values[0] is None:
                return None
            out = values[0].new_zeros((batch.size, batch.completion_ids.shape[1], *values[0].shape[2:]))
            for r, v in zip(rows, values, strict=True):
                out[r.to(out.device), :v.shape[1]] = v
            return out
        return Forward(join([p.logp for p in parts]), join([p.entropy for p in parts]),
                       join([p.hidden for p in parts]))


#: Prompt sharing pays when it leaves at most this fraction of the positions a plain pass runs (one more decoder
#: call is its fixed cost).
SHARE_MAX_FRACTION = 0.75


def shared_prompts(batch: Batch) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The batch's distinct prompts (each a left-padded row) and each sequence's prompt among them, when running each
    distinct prompt once would spare enough positions (``SHARE_MAX_FRACTION``); None otherwise."""
    lp, T, B = batch.prompt_width, batch.completion_ids.shape[1], batch.size
    if lp < 2 or B < 2:
        return None
    _, inverse = torch.unique(batch.input_ids[:, :lp], dim=0, return_inverse=True)
    n = int(inverse.max()) + 1
    if n * lp + B * (T - 1) > SHARE_MAX_FRACTION * B * (lp + T - 1):
        return None
    first = torch.empty(n, dtype=torch.long, device=inverse.device)
    first[inverse] = torch.arange(B, device=inverse.device)  # one row of each distinct prompt
    return first, inverse


def completion_hidden(model, batch: Batch, share: bool = True) -> torch.Tensor:
    """The decoder's final hidden states at the positions that predict the completion tokens, (B, T, H): a
    sequence's positions lp - 1 .. lp + T - 2.

    ``share``: where sequences share prompts (a group's G completions), each distinct prompt runs through the
    decoder once and its completions run on its cached keys and values (``DynamicCache``, indexed per sequence,
    gradients flowing back into the prompt's pass): the same hidden states up to float rounding, for about
    P x lp + B x T positions instead of B x (lp + T)."""
    lp, T = batch.prompt_width, batch.completion_ids.shape[1]
    decoder = model.get_decoder()
    groups = shared_prompts(batch) if share else None
    if groups is None:
        out = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      position_ids=batch.position_ids, use_cache=False)
        return out.last_hidden_state[:, lp - 1: lp - 1 + T]
    from transformers import DynamicCache

    first, inverse = groups
    cache = DynamicCache(config=model.config)
    prompt = decoder(input_ids=batch.input_ids[first, :lp], attention_mask=batch.attention_mask[first, :lp],
                     position_ids=batch.position_ids[first, :lp], past_key_values=cache, use_cache=True)
    last = prompt.last_hidden_state[inverse, lp - 1:]  # predicts each sequence's first completion token
    if T == 1:
        return last
    cache.batch_select_indices(inverse)  # each sequence's own copy of its prompt's keys and values
    for layer in cache.layers:  # one memory layout whatever the prompt pass left: --compile's graphs guard on it
        layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()
    rest = decoder(input_ids=batch.input_ids[:, lp: lp + T - 1], attention_mask=batch.attention_mask[:, : lp + T - 1],
                   position_ids=batch.position_ids[:, lp: lp + T - 1], past_key_values=cache, use_cache=True)
    return torch.cat([last, rest.last_hidden_state], dim=1)


#: With a dense attention mask (sdpa, eager), the packed sequences go into rows of about this many tokens (the longest
#: sequence's length if that is more), so the block-diagonal masks cost rows x width^2 rather than (all tokens)^2.
PACK_ROW_TOKENS = 1024
#: Attention kernels that run a packed row without a dense mask (variable-length or block-sparse): one row for all.
PACKING_KERNELS = ("flash_attention_2", "flash_attention_3", "flex_attention")


def pack_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """Sequences of ``lengths`` dealt into ceil(total / capacity) rows (at least the longest length each), longest
    first, each to the row with the fewest tokens so far (balanced rows, so little filler pads them to the widest).
    Returns each row's sequence indices in batch order."""
    rows = max(1, -(-sum(lengths) // max(capacity, max(lengths, default=1))))
    load, members = [0] * rows, [[] for _ in range(rows)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = min(range(rows), key=load.__getitem__)
        load[r] += lengths[i]
        members[r].append(i)
    return [sorted(m) for m in members if m]


def packed_completion_hidden(model, batch: Batch) -> torch.Tensor:
    """The decoder's final hidden states that predict the real completion tokens, (n, H) in the row-major order of
    ``batch.completion_mask``, from one pass over the batch's sequences packed without padding (``padding_free``):
    each sequence's real tokens one after another, its position ids restarting at 0, and no attention mask, from
    which transformers' attention keeps each token within its own sequence. With flash attention's variable-length
    kernel or flex attention's block mask (``PACKING_KERNELS``) every sequence goes into one row; with sdpa or eager
    (a dense block-diagonal causal mask: the fallback) into balanced rows of about ``PACK_ROW_TOKENS`` tokens
    (``pack_rows``), each filled up to the widest with a filler sequence of pad tokens whose outputs are dropped.
    ``check_packing`` refuses, at start-up, a model whose attention ignores the packing."""
    real_tokens = batch.attention_mask > 0
    lengths = real_tokens.sum(dim=1).tolist()
    attn = getattr(model.config, "_attn_implementation", "")
    one_row = attn in PACKING_KERNELS
    rows = [list(range(batch.size))] if one_row else pack_rows(lengths, PACK_ROW_TOKENS)
    width = max(sum(lengths[i] for i in r) for r in rows)
    row_start = torch.empty(batch.size, 2, dtype=torch.long)  # each sequence's row and first column
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    for r, members in enumerate(rows):
        col = 0
        for i in members:
            row_start[i, 0], row_start[i, 1] = r, col
            col += lengths[i]
        pos[r, col:] = torch.arange(width - col)  # the filler: a sequence of its own, its outputs never read
    device = batch.input_ids.device
    pos = pos.to(device)
    ids = torch.zeros_like(pos)  # the filler's tokens: any id (nothing attends to them)
    where = row_start.to(device)[torch.arange(batch.size, device=device)[:, None].expand_as(real_tokens)[real_tokens]]
    row_of, col_of = where[:, 0], where[:, 1] + batch.position_ids[real_tokens]  # positions count 0.. per sequence
    ids[row_of, col_of] = batch.input_ids[real_tokens]
    pos[row_of, col_of] = batch.position_ids[real_tokens]
    # a completion token is predicted from the real position before it
    lp, T = batch.prompt_width, batch.completion_ids.shape[1]
    index = torch.zeros(real_tokens.shape, dtype=torch.long, device=device)
    index[real_tokens] = row_of * width + col_of
    at = index[:, lp - 1: lp - 1 + T][batch.completion_mask > 0]
    # flex attention: the main kernel always; inductor would pick its decoding kernel for a row under 128 tokens,
    # which has no valid choice at small head sizes (an H200, 2026-11-27: the tiny model's packed row failed)
    extra = {"kernel_options": {"FORCE_USE_FLEX_ATTENTION": True}} if attn == "flex_attention" else {}
    out = model.get_decoder()(input_ids=ids, position_ids=pos, use_cache=False, **extra)
    return out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])[at]


def forward_completions(model, batch: Batch, temperature: float, precision: Precision = Precision(),
                        chunk_tokens: int = 0, entropy: bool = False, keep_hidden: bool = False,
                        share_prompts: bool = True, token_filter: TokenFilter = NO_FILTER,
                        entropy_grad: bool = False, packed: bool = False) -> Forward:
    """log softmax(logits / T) of the completion tokens of ``batch`` in one pass of ``model`` (gradients follow
    torch's grad mode), of the distribution ``token_filter`` leaves (top-k, top-p, min-p); the output layer runs on
    the real completion tokens only, in chunks. ``share_prompts``: run each distinct prompt once
    (``completion_hidden``); ``packed``: run the sequences packed into one row without padding
    (``packed_completion_hidden``; prompts are then not shared); ``entropy_grad``: the entropy carries a gradient (an
    entropy bonus)."""
    device = batch.input_ids.device
    real = batch.completion_mask > 0
    with precision.autocast(device):
        if packed:
            hidden_real = packed_completion_hidden(model, batch)
        else:
            hidden = completion_hidden(model, batch, share_prompts)
            hidden_real = hidden[real]
        logp_real, ent_real = token_logprobs(LogitHead(model, temperature, token_filter), hidden_real,
                                             batch.completion_ids[real], chunk_tokens, entropy, entropy_grad)
    zeros = torch.zeros(real.shape, dtype=logp_real.dtype, device=device)
    if keep_hidden and packed:
        hidden = hidden_real.new_zeros((*real.shape, hidden_real.shape[-1])).masked_scatter(real[..., None],
                                                                                            hidden_real)
    return Forward(zeros.masked_scatter(real, logp_real),
                   zeros.masked_scatter(real, ent_real) if entropy else None,
                   hidden.detach() if keep_hidden else None)


@torch.no_grad()
def completion_logprobs(model, batch: Batch, temperature: float, precision: Precision = Precision(), *,
                        micro_batch: int = 0, chunk_tokens: int = 0, entropy: bool = False,
                        keep_hidden: bool = False, by_length: bool = False, rows: torch.Tensor | None = None,
                        ranks: Ranks = SINGLE, share_prompts: bool = True,
                        token_filter: TokenFilter = NO_FILTER, packed: bool = False,
                        token_budget: int = 0) -> Forward:
    """``forward_completions`` without gradients, ``micro_batch`` sequences per pass (0: no limit); ``by_length``:
    sequences of similar length share a pass, padded only to the longest of them (``Batch.passes``); ``rows``: only
    these sequences (a rank's share; the others' values are zero); ``packed``: each pass's sequences in one row
    without padding; ``token_budget``: at most that many forwarded tokens a pass. Under FSDP (``ranks``) this rank
    also runs the idle passes that give every rank as many passes (``Ranks.idle_passes``)."""
    rows = batch.passes(micro_batch, by_length, rows, token_budget, packed)
    idle_passes(ranks.idle_passes(len(rows)), model, batch, temperature, precision, chunk_tokens,
                token_filter=token_filter)
    if not rows:  # a rank whose share is empty (fewer prompts than ranks): zeros, which the sum over ranks ignores
        zeros = torch.zeros(batch.completion_ids.shape, dtype=torch.float32, device=batch.completion_ids.device)
        return Forward(zeros, zeros.clone() if entropy else None, None)
    return Forward.assemble(batch, rows, [forward_completions(model, batch.take(r), temperature, precision,
                                                              chunk_tokens, entropy, keep_hidden, share_prompts,
                                                              token_filter, packed=packed)
                                          for r in micro_batches(rows)])


def idle_passes(count: int, model, batch: Batch, temperature: float, precision: Precision = Precision(),
                chunk_tokens: int = 0, backward: bool = False, token_filter: TokenFilter = NO_FILTER) -> None:
    """Under FSDP, ``count`` passes over the batch's first sequence: what this rank lacks to match the rank with the
    most passes (``Ranks.idle_passes``, asked before any pass: it is a collective), since each pass gathers the sharded
    blocks from every rank. Results dropped; with ``backward`` a backward through 0 x their log-probs' sum, which adds
    zero gradients."""
    for _ in range(count):
        zero = forward_completions(model, batch.take(torch.arange(1)), temperature, precision, chunk_tokens,
                                   token_filter=token_filter).logp
        if backward:
            (zero.sum() * 0).backward()


@dataclass
class TokenDists:
    """Next-token distributions of a model at a batch's completion positions, stored as the final hidden states
    (B, T, H) and the output layer that expands them (the layer must still hold the same weights when the
    distributions are read)."""

    head: LogitHead
    hidden: torch.Tensor
    precision: Precision = Precision()

    def chunks(self, mask: torch.Tensor, chunk_tokens: int = 0) -> Iterator[torch.Tensor]:
        """log-probabilities (n, V) of the positions where ``mask`` (B, T) is 1, chunk by chunk, in row order."""
        h = self.hidden[mask > 0]
        rows = chunk_rows(self.head.vocab_size, chunk_tokens)
        for s in range(0, h.shape[0], rows):
            yield self._logprobs(h[s:s + rows])  # no context manager is held open across a yield

    @torch.no_grad()
    def _logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        with self.precision.autocast(hidden.device):
            return self.head.logprobs(hidden)


@torch.no_grad()
def check_head(model, batch: Batch, temperature: float = 1.0, tolerance: float = HEAD_CHECK_TOLERANCE) -> float:
    """Compare the chunked log-probs with the model's own logits on ``batch``; returns the worst gap and raises
    ``ValueError`` naming the architecture if it exceeds ``tolerance`` (at temperature 1; ``head_tolerance``): an
    output transform LogitHead lacks."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                   use_cache=False).logits
    T, lp = batch.completion_ids.shape[1], batch.prompt_width
    plain = torch.log_softmax(logits[:, lp - 1: lp - 1 + T].float() / temperature, dim=-1)
    plain = plain.gather(-1, batch.completion_ids[..., None]).squeeze(-1) * batch.completion_mask
    arch = architecture(model)
    try:
        chunked = forward_completions(model, batch, temperature, chunk_tokens=1).logp
    except (AttributeError, TypeError, NotImplementedError) as exc:  # no get_decoder / get_output_embeddings
        raise ValueError(f"model_name_or_path: {arch} does not expose its decoder and output layer the way the "
                         f"trainer's chunked log-probabilities need ({type(exc).__name__}: {exc})") from None
    gap = float((chunked - plain).abs().max())
    if not gap <= head_tolerance(temperature, tolerance):
        raise ValueError(f"model_name_or_path: {arch}'s output layer applies a transform the trainer's chunked "
                         f"log-probabilities do not know (gap {gap:.2e} to the model's own logits); "
                         "it is not supported")
    return gap


@torch.no_grad()
def check_packing(model, batch: Batch, temperature: float = 1.0, tolerance: float = HEAD_CHECK_TOLERANCE) -> float:
    """``padding_free``: the packed pass against the padded one on ``batch`` (two sequences or more); returns the
    worst log-prob gap and raises ``ValueError`` naming the architecture if it exceeds ``tolerance``: an attention
    that lets the packed sequences see each other (its kernel ignores the position ids' restarts)."""
    padded = forward_completions(model, batch, temperature, share_prompts=False).logp
    packed = forward_completions(model, batch, temperature, packed=True).logp
    gap = float((packed - padded).abs().max())
    if not gap <= head_tolerance(temperature, tolerance):
        raise ValueError(f"padding_free: {architecture(model)} with attention "
                         f"{getattr(model.config, '_attn_implementation', '?')} does not keep sequences packed into "
                         f"one row apart (log-prob gap {gap:.2e} to the padded pass); run without --padding-free or "
                         "choose another --attn-implementation")
    return gap
