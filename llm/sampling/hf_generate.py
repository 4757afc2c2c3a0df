"""The transformers sampler: alpha as a frozen copy of the policy, sampled with ``generate``.

A model directory may carry a ``generation_config.json`` (instruct models on the hub often set
``repetition_penalty``, ``top_k``, ``top_p``...). ``generate`` would apply those on top of what we ask
for, so alpha would no longer be softmax(logits / T), the distribution the trainer recomputes and the
importance weights assume. The sampler therefore hides the stored config during its calls (``generate``
sees only the settings given here) and reports the log-probs of the scores ``generate`` actually sampled
from: the temperature and the run's top-k, top-p and min-p (``llm.tensors.token_filter``, the same function the
trainer's log-probs use) are applied by the last logits processor (``TemperedLogprobs``), which also records the
sampled tokens' log-probs, so what it reports is what it sampled even if a processor slipped in before it;
the trainer's recomputation would then disagree, and ``sampling/logp_diff_*`` would show it. Only one step's
(B x V) distributions exist at a time (``generate``'s ``output_scores`` would keep B x T x V). With
``--cache-implementation static`` the sampler runs its own compiled loop instead of ``generate``
(``llm.sampling.static_decode``), with the same kept set, draw rule and log alpha.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

from runkit.host_memory import micro_batches

from llm.tensors.token_filter import NO_FILTER, TokenFilter, filtered_logits
from llm.models.model import copy_weights, frozen_copy
from llm.sampling.base import Rollout
from llm.sampling.static_decode import Draw, StaticDecoder, inverse_cdf


class TemperedLogprobs:
    """A logits processor for the end of ``generate``'s list: divides the scores by T, drops the tokens
    ``token_filter`` drops (-inf) and records the log-probability of each token sampled from what is left, holding
    one step's distributions at a time. With ``generators`` (one per row) it also samples: row i's token by the
    inverse of the distribution's CDF at a uniform draw of its own generator, returned as the only finite score so
    that greedy ``generate`` takes it. Each sequence's draws then come from its own stream, whatever else shares the
    batch."""

    def __init__(self, temperature: float, token_filter: TokenFilter = NO_FILTER,
                 generators: list[torch.Generator] | torch.Generator | None = None):
        self.temperature, self.token_filter, self.prev, self.logp = temperature, token_filter, None, []
        self.generators = generators  # one per row, or one stream for the call (drawn on the scores' device)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._collect(input_ids[:, -1])  # the token sampled from the previous step's distributions
        scores = filtered_logits(scores.float() / self.temperature, self.token_filter)
        self.prev = torch.log_softmax(scores, dim=-1)
        if self.generators is None:
            return scores
        return self._draw(self.prev)

    def _draw(self, logp: torch.Tensor) -> torch.Tensor:
        """Scores that leave one token per row: the inverse CDF of exp(logp) at each row's own uniform draw."""
        if isinstance(self.generators, torch.Generator):  # one stream: every row's draw on the device at once
            u = torch.rand(logp.shape[0], generator=self.generators, dtype=torch.float64, device=logp.device)
        else:
            u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in self.generators])
        out = torch.full_like(logp, -math.inf)
        return out.scatter_(-1, inverse_cdf(logp, u)[:, None], 0.0)

    def _collect(self, tokens: torch.Tensor) -> None:
        if self.prev is not None:
            self.logp.append(self.prev.gather(-1, tokens[:, None]).squeeze(-1))
            self.prev = None

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """log-probs (B, steps) of the generated tokens, once ``generate`` returned ``sequences``."""
        self._collect(sequences[:, -1])
        return torch.stack(self.logp, dim=1)


def shared_prefill(model, prompts: list[list[int]], ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """One prefill per distinct prompt of a ``generate`` call: the keys and values of every prompt token but its last,
    computed once for each run of equal prompts (a group's G completions) and repeated across the run's rows as
    ``past_key_values``; ``generate`` then computes only each row's last prompt token and what follows (as
    ``--share-prompts`` does for the update). ``ids`` and ``mask``: the call's left-padded rows. {} when no prompt
    repeats or the prompts are single tokens."""
    from transformers import DynamicCache

    starts = [r for r in range(len(prompts)) if r == 0 or prompts[r] != prompts[r - 1]]
    if len(starts) == len(prompts) or ids.shape[1] < 2:
        return {}
    owner = torch.tensor([len([s for s in starts if s <= r]) - 1 for r in range(len(prompts))], device=ids.device)
    first = torch.tensor(starts, device=ids.device)
    cache = DynamicCache(config=model.config)
    head, head_mask = ids[first, :-1], mask[first, :-1]
    model(input_ids=head, attention_mask=head_mask, position_ids=(head_mask.cumsum(-1) - 1).clamp(min=0),
          past_key_values=cache, use_cache=True, logits_to_keep=1)
    cache.batch_select_indices(owner)  # each row the keys and values of its run's prompt
    return {"past_key_values": cache}


def row_generator(seed: int, row: int) -> torch.Generator:
    """The random stream of row ``row`` of a generation call seeded with ``seed``."""
    state = int(np.random.SeedSequence([seed % 2**63, row]).generate_state(1, np.uint64)[0]) % 2**63
    return torch.Generator().manual_seed(state)


@contextlib.contextmanager
def plain_generation_config(model):
    """Hide ``model.generation_config`` (whatever the model directory stored) for the duration."""
    from transformers import GenerationConfig

    stored = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = stored


class TransformersSampler:
    """alpha as its own copy of the trainer's model (``copy=False``: the given model itself, e.g. to
    evaluate the current policy), sampled with ``transformers.generate`` at temperature T from the filtered
    distribution (``TemperedLogprobs``; generate's own sampling, top-k and top-p off). Sequences run ``batch_size`` at
    a time (0: a call's all at once; the trainer passes ``per_device_train_batch_size``), so its KV cache and
    logits follow the micro-batch; each sequence draws from its own random stream (``row_generator``), so what is
    sampled does not depend on the split, up to float rounding of the logits in another batch. ``share_prompts``: each
    run of equal prompts (a group's G completions) is prefilled once (``shared_prefill``)."""

    name = "transformers"
    holds_own_weights, runs_server = False, False  # what it is (``llm.sampling.base.Sampler``)
    returns_logprobs, owns_torch_distributed = True, False

    def __init__(self, model: torch.nn.Module, eos_token_id: int, pad_token_id: int, copy: bool = True,
                 batch_size: int = 0, share_prompts: bool = True, cache_implementation: str | None = None,
                 prompt_width: int = 0):
        self.model = frozen_copy(model) if copy else model
        if copy and getattr(self.model.config, "_attn_implementation", "") == "flex_attention":
            # flex attention is the trainer's packing kernel (``--padding-free`` on a GPU); decoding, one query per
            # row, gains nothing from it, and transformers' continuous batching has no paged flex: the copy decodes
            # with sdpa (an H200, 2026-11-27: the paged flex failed; generate with flex ran 1.46 s against 1.26 s)
            self.model.set_attn_implementation("sdpa")
        self.eos, self.pad, self.batch_size, self.share_prompts = eos_token_id, pad_token_id, batch_size, share_prompts
        self.static = cache_implementation == "static"
        self.prompt_width = prompt_width  # static: every call's prompts padded to it, so its shapes repeat
        if self.static:
            self.decoder = StaticDecoder(self.model)

    def load_weights(self, model: torch.nn.Module) -> None:
        copy_weights(self.model, model)

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 greedy: bool = False, token_filter: TokenFilter = NO_FILTER) -> Rollout:
        """n completions per prompt (prompt-major); ``greedy`` takes the most likely token instead of sampling."""
        rows = [p for p in prompt_ids for _ in range(n)]
        size = self.batch_size or len(rows)
        comps, lps = [], []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in micro_batches(range(0, len(rows), size)):
                c, lp = self._generate(rows[start:start + size], start, max_tokens, temperature, seed, greedy,
                                       token_filter)
                comps += c
                lps += lp
        finally:
            self.model.train(was_training)
        return Rollout(comps, lps)

    def _generate(self, prompts: list[list[int]], first_row: int, max_tokens: int, temperature: float, seed: int,
                  greedy: bool, token_filter: TokenFilter) -> tuple[list, list]:
        """One call over ``prompts`` (one sequence each), rows ``first_row``.. of the whole call: the static loop
        (``llm.sampling.static_decode``) or ``generate``."""
        device = next(self.model.parameters()).device
        width = max(max(map(len, prompts)), self.prompt_width if self.static else 0)
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts], device=device)
        mask = (torch.arange(width, device=device)[None, :] >= torch.tensor(
            [width - len(p) for p in prompts], device=device)[:, None]).long()
        if self.static:
            draw = Draw(temperature, token_filter, greedy, self.eos, self.pad)
            stream = None if greedy else torch.Generator(device=device).manual_seed(
                row_generator(seed, first_row).initial_seed())  # one stream for the call, drawn on the device
            tokens, logp = self.decoder(ids, mask, max_tokens, draw, stream)
        else:
            tokens, logp = self._call_generate(prompts, ids, mask, first_row, max_tokens, temperature, seed, greedy,
                                               token_filter)
        comps, lps = [], []
        for row, lp in zip(tokens.tolist(), logp.tolist()):
            length = row.index(self.eos) + 1 if self.eos in row else len(row)
            comps.append(row[:length])
            lps.append(lp[:length])
        return comps, lps

    def _call_generate(self, prompts, ids, mask, first_row, max_tokens, temperature, seed, greedy, token_filter):
        """``generate`` with the dynamic cache: each row's own random stream, one prefill per prompt."""
        from transformers import GenerationConfig, LogitsProcessorList

        config = GenerationConfig(do_sample=False, temperature=None, top_k=None, top_p=None, repetition_penalty=1.0,
                                  max_new_tokens=max_tokens, pad_token_id=self.pad, eos_token_id=self.eos,
                                  return_dict_in_generate=True)
        generators = None if greedy else [row_generator(seed, first_row + r) for r in range(len(prompts))]
        tempered = TemperedLogprobs(temperature, token_filter, generators)  # greedy: log-probs reported at T
        shared = shared_prefill(self.model, prompts, ids, mask) if self.share_prompts else {}
        with plain_generation_config(self.model):
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                      logits_processor=LogitsProcessorList([tempered]), **shared)
        return out.sequences[:, ids.shape[1]:], tempered.finish(out.sequences)

    def close(self) -> None:
        self.model = None
        if self.static:
            self.decoder.close()
