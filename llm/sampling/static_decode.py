"""The static-cache decode loop of ``--cache-implementation static``: one compiled step per token, no host sync in it.

``transformers.generate`` with a static cache compiles the model's forward, but its loop runs around it in Python
and reads the device at every token (its stopping criteria ask whether every row has finished, which waits for the
step). On a GPU that keeps the host and the device in lockstep: each step's Python work (the loop, the logits
processors, the stop checks) is added to the device's instead of overlapping it. This loop does the same work with
nothing read back per token:

- one prefill of the call's left-padded prompts into a ``StaticCache`` sized to prompt width + ``max_tokens`` (kept
  across calls of one shape and reset, so a CUDA graph's addresses stay put); the width is first left-padded up to a
  multiple of ``width_bucket`` (masked columns), so that one compiled step serves every prompt width in a bucket:
  each new shape of the step is a new compilation (seconds on a CPU, a new CUDA graph on a GPU). The transformers
  sampler pads a task's prompts to its longest, but an agent's later turns (the conversation so far) are wider than
  that and differ from call to call;
- every draw of the call taken up front from the call's seeded stream (``torch.rand`` of shape (steps, rows), on the
  device), so the step is a pure function of tensors;
- one step = the model's forward for one token per row, the temperature and the run's kept set
  (``llm.tensors.token_filter``), log-softmax, the draw by the inverse CDF (``inverse_cdf``, the rule the
  transformers sampler's logits processor uses), the drawn token's log alpha, and the rows' finished flags, all on
  the device. The step is compiled with ``fullgraph=True`` (a host read inside it would be a graph break, which
  ``fullgraph`` refuses), under CUDA graphs (``mode="reduce-overhead"``) on a GPU;
- the loop reads the device once every ``check_every`` steps, to stop when every row has finished.

Finished rows keep running (their tokens are replaced by padding and cut at the first EOS afterwards), as in
``generate``. Log alpha is the log-softmax the draw was taken from, the distribution the trainer recomputes
(``tests/llm/test_generation_paths.py`` checks both against the trainer's recomputation, and the draws against the
``generate`` path's). ``host_reads`` counts what a call read back from the device, for the tests and the benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llm.tensors.token_filter import NO_FILTER, TokenFilter, filtered_logits

CHECK_EVERY = 16  # steps between the loop's reads of the finished flags: at most 15 wasted steps per call
WIDTH_BUCKET = 32  # prompt widths are rounded up to a multiple of this: at most 31 masked columns per call


def inverse_cdf(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Each row's token at its uniform draw ``u`` (float64, one per row) under exp(``logp``): the first token whose
    cumulative probability, summed in float64, exceeds u times the row's total; never one of probability 0 (u = 0
    included)."""
    cdf = logp.double().exp().cumsum(dim=-1)
    tokens = torch.searchsorted(cdf, (u.to(cdf.device, torch.float64) * cdf[:, -1])[:, None], right=True)
    return tokens.clamp(max=logp.shape[-1] - 1).squeeze(-1)


@dataclass(frozen=True)
class Draw:
    """What a call fixes for every step: the temperature, the kept set, greedy or sampled, and the stop token."""

    temperature: float
    token_filter: TokenFilter = NO_FILTER
    greedy: bool = False
    eos: int = 0
    pad: int = 0


def pick(logits: torch.Tensor, u: torch.Tensor, draw: Draw) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from the last position's ``logits`` and its log-probability at the draw's temperature and
    kept set: the most likely (greedy) or the inverse CDF at ``u``."""
    logp = torch.log_softmax(filtered_logits(logits.float() / draw.temperature, draw.token_filter), dim=-1)
    token = logp.argmax(dim=-1) if draw.greedy else inverse_cdf(logp, u)
    return token, logp.gather(-1, token[:, None]).squeeze(-1)


def _step(model, draw: Draw, cache, token, position, mask, u, done):
    """The compiled unit: the forward of one token per row, its pick, and the finished flags (pure tensors)."""
    logits = model(input_ids=token[:, None], attention_mask=mask, position_ids=position[:, None],
                   past_key_values=cache, use_cache=True).logits[:, -1]
    nxt, logp = pick(logits, u, draw)
    nxt = torch.where(done, torch.full_like(nxt, draw.pad), nxt)
    logp = torch.where(done, torch.zeros_like(logp), logp)
    return nxt, logp, done | (nxt == draw.eos)


class StaticDecoder:
    """The loop above for one model. ``compile=False`` runs the same step eagerly (the tests count its host reads
    op by op); ``check_every``: steps between reads of the finished flags; ``width_bucket``: prompt widths are
    left-padded up to a multiple of it (1: as given). ``shapes`` holds the (rows, cache length) of every call: each is
    one compilation of the step."""

    def __init__(self, model: torch.nn.Module, compile: bool = True, check_every: int = CHECK_EVERY,
                 width_bucket: int = WIDTH_BUCKET):
        if check_every < 1:
            raise ValueError(f"check_every must be at least 1, not {check_every}")
        if width_bucket < 1:
            raise ValueError(f"width_bucket must be at least 1, not {width_bucket}")
        self.model, self.compile, self.check_every, self.width_bucket = model, compile, check_every, width_bucket
        self.cache, self.cache_key, self.steps, self.host_reads, self.shapes = None, None, {}, 0, set()

    def _cache(self, rows: int, length: int, device: torch.device):
        from transformers import StaticCache

        key = (rows, length, str(device))
        if self.cache_key != key:
            self.cache, self.cache_key = StaticCache(config=self.model.config, max_cache_len=length), key
        else:
            self.cache.reset()
        return self.cache

    def _compiled(self, draw: Draw, device: torch.device):
        if draw not in self.steps:
            def step(cache, token, position, mask, u, done):
                return _step(self.model, draw, cache, token, position, mask, u, done)

            if self.compile:
                mode = "reduce-overhead" if device.type == "cuda" else None
                step = torch.compile(step, fullgraph=True, dynamic=False, mode=mode)
            self.steps[draw] = step
        return self.steps[draw]

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, max_tokens: int, draw: Draw,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and their log alpha, both (rows, steps), for left-padded ``ids`` and their ``mask``; rows padded
        after their EOS; ``steps`` is ``max_tokens`` or fewer when every row finished early."""
        rows, width = ids.shape
        extra = -width % self.width_bucket
        if extra:  # masked columns on the left, as for a shorter prompt: the same positions, the same draws
            ids = torch.cat([ids.new_full((rows, extra), draw.pad), ids], dim=1)
            mask = torch.cat([mask.new_zeros(rows, extra), mask], dim=1)
            width += extra
        device = ids.device
        self.shapes.add((rows, width + max_tokens))
        cache = self._cache(rows, width + max_tokens, device)
        full = torch.cat([mask, mask.new_ones(rows, max_tokens)], dim=1)
        u = (torch.zeros(max_tokens, rows, dtype=torch.float64, device=device) if draw.greedy else
             torch.rand(max_tokens, rows, generator=generator, dtype=torch.float64, device=device))
        logits = self.model(input_ids=ids, attention_mask=full, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                            past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        token, logp = pick(logits, u[0], draw)
        done = token == draw.eos
        tokens = torch.full((rows, max_tokens), draw.pad, dtype=token.dtype, device=device)
        logps = torch.zeros(rows, max_tokens, dtype=logp.dtype, device=device)
        tokens[:, 0], logps[:, 0] = token, logp
        position = mask.sum(-1)  # the first completion token's position, per row
        step, cuda = self._compiled(draw, device), device.type == "cuda" and self.compile
        taken = max_tokens
        for t in range(1, max_tokens):
            if t % self.check_every == 0:
                self.host_reads += 1
                if bool(done.all()):
                    taken = t
                    break
            if cuda:  # a new replay of the CUDA graph; what the last one returned is copied out below
                torch.compiler.cudagraph_mark_step_begin()
            token, logp, done = step(cache, token, position + (t - 1), full, u[t], done)
            tokens[:, t], logps[:, t] = token, logp
            if cuda:
                token, done = token.clone(), done.clone()
        return tokens[:, :taken], logps[:, :taken]

    def close(self) -> None:
        self.cache, self.steps = None, {}
