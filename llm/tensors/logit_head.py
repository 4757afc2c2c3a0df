"""The output layer applied in chunks (``LogitHead``, ``token_logprobs``): log-probabilities and entropies of the
sampled tokens from hidden states, with at most (chunk_tokens x V) float32 logits alive at a time and, under a token
filter, the kept set of vLLM's and transformers' samplers; its backward recomputes each chunk's logits (a custom
autograd function) instead of keeping them. ``llm.tensors.logprobs`` runs the decoder that feeds it."""

from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from llm.tensors.token_filter import NO_FILTER, OFF_SET_LOGP, TokenFilter, apply_swaps, filtered_log_softmax, kept_mask, \
    swap_in_targets
from llm.models.model import architecture


#: Default size of one chunk of float32 logits: chunk_tokens = LOGIT_CHUNK_BYTES / (4 V) rows (441 rows for a
#: 151,936-token vocabulary; the whole completion batch of the built-in 99-token model in one chunk).
LOGIT_CHUNK_BYTES = 256 * 2**20

#: Largest |log-prob| difference between the chunked path and the model's own logits accepted at start-up
#: (float32; ``check_head``), at temperature 1: the logits' rounding is divided by the temperature, so below 1 the
#: tolerance is too (``head_tolerance``).
HEAD_CHECK_TOLERANCE = 1e-4


def head_tolerance(temperature: float, tolerance: float = HEAD_CHECK_TOLERANCE) -> float:
    """The log-prob tolerance of the start-up checks at ``temperature``: ``tolerance`` / min(1, temperature). Two
    float32 paths differ in the logits by rounding; log softmax(logits / T) carries that difference times 1/T (at
    T = 0.01, a hundred times). An output transform the chunked path lacks (a soft cap, a scale) differs by far more
    than rounding at every temperature, so it is still found."""
    return tolerance / min(1.0, temperature)


def chunk_rows(vocab_size: int, chunk_tokens: int = 0) -> int:
    """Rows of logits per chunk: ``chunk_tokens`` if set, else LOGIT_CHUNK_BYTES worth of float32 rows."""
    return chunk_tokens if chunk_tokens > 0 else max(1, LOGIT_CHUNK_BYTES // (4 * vocab_size))


class LogitHead:
    """The model's output layer and the architecture's final transform: hidden states (n, H) -> logits / T in
    float32 (n, V; float64 for a float64 model, which the tests use to tell rounding from error). Transforms
    known here: Granite's ``logits_scaling`` (logits divided by it) and Gemma's ``final_logit_softcapping``
    (cap * tanh(logits / cap)). ``check_head`` refuses a model whose own logits differ (an output transform
    this class does not know), so a wrong head never goes unnoticed. ``token_filter``: the distribution is the
    filtered one (top-k, top-p, min-p of the logits / T; ``llm.tensors.token_filter``)."""

    def __init__(self, model: torch.nn.Module, temperature: float, token_filter: TokenFilter = NO_FILTER):
        self.layer = model.get_output_embeddings()
        cfg = model.config
        self.divisor = float(getattr(cfg, "logits_scaling", None) or 1.0)
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self.temperature = temperature
        self.token_filter = token_filter
        self.vocab_size = self.layer.weight.shape[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        z = self.layer(hidden)
        z = z.to(torch.promote_types(z.dtype, torch.float32))  # float32 at least (float64 models stay float64)
        if self.divisor != 1.0:
            z = z / self.divisor
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        # x / 1.0 is x exactly: at T = 1 the division would only cost a pass over (n, V) logits, forward and backward
        return z if self.temperature == 1.0 else z / self.temperature

    def logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        """log softmax of the logits, filtered (``OFF_SET_LOGP`` off the kept set): (n, V) float32."""
        return filtered_log_softmax(self.logits(hidden), self.token_filter)

    @property
    def scale(self) -> float | None:
        """The factor the output layer's logits are multiplied by (1 / (divisor x T)), or None when the head
        applies a transform that is not a scale (a softcap)."""
        return None if self.softcap else 1.0 / (self.divisor * self.temperature)


class _ScaledHeadLogprobs(torch.autograd.Function):
    """log softmax(s x hidden W^T) at the target tokens, chunk by chunk, with the softmax's gradient written out.

    Forward, per chunk of ``rows`` rows: the logits z (the matmul in the compute dtype: autocast's, else the
    weight's), widened to float32 at least, filtered (``token_filter``: -inf off the sampler's kept set, a target tied
    at its boundary swapped in, the swapped columns kept), their log-softmax, the targets' log-probs (``OFF_SET_LOGP``
    for a target off the kept set), the log-normaliser lse and, if asked, the entropy -sum p log p of the (filtered)
    distribution; lse (n,) is kept. Backward: the chunk's logits again (filtered by the same sort and swaps), the
    gradient g (onehot - p) s of the logits in one buffer (no
    gradient through a target off the kept set: its log-probability is a constant), plus, when the entropy is
    differentiated (an entropy bonus), g_H (-p (log p + H)) s, and the two matmuls in the compute dtype. With one
    chunk the probabilities p are kept instead of recomputed (at most ``LOGIT_CHUNK_BYTES``). The same casts and
    matmuls as autograd through the plain head, with fewer passes over the (n, V) logits: no recomputed log-softmax
    or entropy, no zero-filled gradient of the gather, no log-softmax backward; and the chunks' weight gradients
    summed in float32 (autograd sums autocast's bf16 ones in bf16)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, scale: float, rows: int, entropy: bool,
                token_filter: TokenFilter = NO_FILTER):
        device = hidden.device.type
        compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        wide = torch.promote_types(compute, torch.float32)
        single = hidden.shape[0] <= rows and any(ctx.needs_input_grad[:2])  # one chunk, a backward to come
        filtered = token_filter.active
        with torch.autocast(device, enabled=False):
            w = weight.to(compute)
            logp, lse, ent, swaps, on, kept = [], [], [], [], [], None
            for s in range(0, hidden.shape[0], rows):
                z = _wide_logits(hidden[s:s + rows], w, compute, wide, scale)
                t = targets[s:s + rows, None]
                if filtered:  # the sampler's kept set; a target tied at its boundary is swapped in (token_filter)
                    keep = kept_mask(z, token_filter)
                    target_on, swapped = swap_in_targets(z, keep, t[:, 0])
                    on.append(target_on)
                    swaps.append(swapped)
                    z_t = z.gather(-1, t).squeeze(-1)
                    z.masked_fill_(~keep, -math.inf)
                logq = torch.log_softmax(z, dim=-1)  # one kernel: 50 ms a SmolLM2 chunk against logsumexp's 65
                if filtered:  # the row's largest logit is always kept: the log-normaliser from it
                    top = z.amax(dim=-1, keepdim=True)
                    lse.append((top - logq.gather(-1, z.argmax(dim=-1, keepdim=True))).squeeze(-1))
                    logp.append(z_t - lse[-1])  # off the kept set replaced below; a NaN stays NaN
                    logq.clamp_(min=OFF_SET_LOGP)  # exp of it is 0; finite for the entropy's products
                else:
                    logp.append(logq.gather(-1, t).squeeze(-1))
                    lse.append(z.gather(-1, t).squeeze(-1) - logp[-1])  # the row's log-normaliser, for the backward
                if entropy or single:
                    p = logq.exp() if entropy else logq.exp_()
                    if entropy:  # -sum p log p: non-negative terms (lse - sum p z cancels when it is small)
                        ent.append(-torch.linalg.vecdot(p, logq))
                    kept = p if single else None
        lse = torch.cat(lse)
        out = torch.cat(logp)
        target_kept = torch.cat(on) if filtered else ~torch.isneginf(out)
        if filtered:  # a NaN (a broken pass) stays NaN: the trainer skips such an update
            out = torch.where(target_kept | torch.isnan(out), out, torch.full_like(out, OFF_SET_LOGP))
        ent = torch.cat(ent) if entropy else out.new_zeros(0)
        swapped = torch.cat(swaps) if filtered else torch.empty(0, dtype=torch.long)
        ctx.save_for_backward(hidden, weight, targets, lse, kept if kept is not None else torch.empty(0), swapped,
                              target_kept, ent)
        ctx.meta = (compute, wide, scale, rows, kept is not None, filtered)
        ctx.token_filter = token_filter
        if not entropy:
            ctx.mark_non_differentiable(ent)
        return out, ent

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets, lse, kept, swapped, target_kept, ent = ctx.saved_tensors
        compute, wide, scale, rows, have_p, filtered = ctx.meta
        need_h, need_w = ctx.needs_input_grad[:2]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=wide, device=weight.device) if need_w else None
        w = weight.to(compute)
        if filtered:  # a target off the kept set: a constant log-probability
            grad_logp = grad_logp * target_kept
        with_entropy = grad_entropy is not None and ent.numel() > 0 and bool(grad_entropy.ne(0).any())
        for s in range(0, hidden.shape[0], rows):
            h, t, g = hidden[s:s + rows], targets[s:s + rows], grad_logp[s:s + rows].to(wide)
            if have_p and not with_entropy:
                gz = kept * (-g[:, None])
            else:
                z = _wide_logits(h, w, compute, wide, scale)
                if filtered:  # the forward's kept set again: the same sort of the same logits, the same swaps
                    keep = apply_swaps(kept_mask(z, ctx.token_filter), t, swapped[s:s + rows])
                    z.masked_fill_(~keep, -math.inf)
                logq = z.sub_(lse[s:s + rows, None])
                if with_entropy:  # dH/dz = -p (log p + H), with p = 0 (and so no term) off the kept set
                    g_h = grad_entropy[s:s + rows].to(wide)[:, None]
                    gz = logq.exp() * (-g[:, None] - g_h * (logq.clamp_(min=OFF_SET_LOGP) + ent[s:s + rows, None]))
                else:
                    gz = logq.exp_().mul_(-g[:, None])
            gz.scatter_add_(-1, t[:, None], g[:, None])  # d(z_t - lse)/dz = onehot - p
            if scale != 1.0:
                gz.mul_(scale)
            gz = gz.to(compute)
            if need_h:
                grad_h[s:s + rows] = (gz @ w).to(hidden.dtype)
            if need_w:
                grad_w += (gz.T @ h.to(compute)).to(wide)
        return grad_h, (grad_w.to(weight.dtype) if need_w else None), None, None, None, None, None


def _wide_logits(hidden: torch.Tensor, weight: torch.Tensor, compute: torch.dtype, wide: torch.dtype,
                 scale: float) -> torch.Tensor:
    """s x hidden W^T: the matmul in ``compute``, the result widened to ``wide`` (a buffer of its own)."""
    z = hidden.to(compute) @ weight.T
    z = z.to(wide) if z.dtype != wide else z
    return z.mul_(scale) if scale != 1.0 else z


def _token_stats(head: LogitHead, hidden: torch.Tensor, targets: torch.Tensor, entropy: bool,
                 entropy_grad: bool = False):
    logp_full = head.logprobs(hidden)
    logp = logp_full.gather(-1, targets[:, None]).squeeze(-1)
    if not entropy:
        return logp, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        return logp, -(logp_full.exp() * logp_full).sum(-1)


def token_logprobs(head: LogitHead, hidden: torch.Tensor, targets: torch.Tensor, chunk_tokens: int = 0,
                   entropy: bool = False, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(target | hidden) for n rows (``hidden`` (n, H), ``targets`` (n,)) chunk by chunk, float32 (n,),
    of the head's (filtered) distribution; with ``entropy`` also each row's next-token entropy, differentiable with
    ``entropy_grad`` (an entropy bonus in the loss). Under gradients and more than one chunk each chunk is
    checkpointed, so no chunk's logits outlive it."""
    rows = chunk_rows(head.vocab_size, chunk_tokens)
    n = hidden.shape[0]
    weight = head.layer.weight
    if head.scale is not None and getattr(head.layer, "bias", None) is None:
        logp, ent = _ScaledHeadLogprobs.apply(hidden, weight, targets, head.scale, rows, entropy or entropy_grad,
                                              head.token_filter)
        if entropy and not entropy_grad:
            ent = ent.detach()
        return logp, (ent if entropy else None)
    if n <= rows:
        return _token_stats(head, hidden, targets, entropy, entropy_grad)
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    logp, ent = [], []
    for s in range(0, n, rows):
        h, t = hidden[s:s + rows], targets[s:s + rows]
        if recompute:
            lp, e = checkpoint(_token_stats, head, h, t, entropy, entropy_grad, use_reentrant=False)
        else:
            lp, e = _token_stats(head, h, t, entropy, entropy_grad)
        logp.append(lp)
        ent.append(e)
    return torch.cat(logp), (torch.cat(ent) if entropy else None)
