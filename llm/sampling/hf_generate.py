"""The transformers sampler: alpha as a frozen copy of the policy, sampled with ``generate``.

A model directory may carry a ``generation_config.json`` (instruct models on the hub often set
``repetition_penalty``, ``top_k``, ``top_p``...). ``generate`` would apply those on top of what we ask
for, so alpha would no longer be softmax(logits / T), the distribution the trainer recomputes and the
importance weights assume. The sampler therefore hides the stored config during its calls (``generate``
sees only the settings given here) and reports the log-probs of the scores ``generate`` actually sampled
from: the temperature and the run's top-k, top-p and min-p (``llm.sampling.token_filter``, the same function the
trainer's log-probs use) are applied by the last logits processor (``TemperedLogprobs``), which also records the
sampled tokens' log-probs, so what it reports is what it sampled even if a processor slipped in before it;
the trainer's recomputation would then disagree, and ``sampling/logp_diff_*`` would show it. Only one step's
(B x V) distributions exist at a time (``generate``'s ``output_scores`` would keep B x T x V).
"""

from __future__ import annotations

import contextlib

import torch

from ..model import copy_weights, frozen_copy
from .base import Rollout
from .token_filter import NO_FILTER, TokenFilter, filtered_logits


class TemperedLogprobs:
    """A logits processor for the end of ``generate``'s list: divides the scores by T, drops the tokens
    ``token_filter`` drops (-inf) and records the log-probability of each token sampled from what is left, holding
    one step's distributions at a time."""

    def __init__(self, temperature: float, token_filter: TokenFilter = NO_FILTER):
        self.temperature, self.token_filter, self.prev, self.logp = temperature, token_filter, None, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._collect(input_ids[:, -1])  # the token sampled from the previous step's distributions
        scores = filtered_logits(scores.float() / self.temperature, self.token_filter)
        self.prev = torch.log_softmax(scores, dim=-1)
        return scores

    def _collect(self, tokens: torch.Tensor) -> None:
        if self.prev is not None:
            self.logp.append(self.prev.gather(-1, tokens[:, None]).squeeze(-1))
            self.prev = None

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """log-probs (B, steps) of the generated tokens, once ``generate`` returned ``sequences``."""
        self._collect(sequences[:, -1])
        return torch.stack(self.logp, dim=1)


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
    distribution (``TemperedLogprobs``; generate's own top-k and top-p off)."""

    name = "transformers"

    def __init__(self, model: torch.nn.Module, eos_token_id: int, pad_token_id: int, copy: bool = True):
        self.model = frozen_copy(model) if copy else model
        self.eos, self.pad = eos_token_id, pad_token_id

    def load_weights(self, model: torch.nn.Module) -> None:
        copy_weights(self.model, model)

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 greedy: bool = False, token_filter: TokenFilter = NO_FILTER) -> Rollout:
        """n completions per prompt (prompt-major); ``greedy`` takes the most likely token instead of sampling."""
        from transformers import GenerationConfig, LogitsProcessorList

        device = next(self.model.parameters()).device
        width = max(map(len, prompt_ids))
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompt_ids], device=device)
        mask = (torch.arange(width, device=device)[None, :] >= torch.tensor(
            [width - len(p) for p in prompt_ids], device=device)[:, None]).long()
        config = GenerationConfig(  # temperature 1 here: TemperedLogprobs applies T, last
            do_sample=not greedy, temperature=None if greedy else 1.0, top_k=None if greedy else 0,
            top_p=None if greedy else 1.0, repetition_penalty=1.0, max_new_tokens=max_tokens, num_return_sequences=n,
            pad_token_id=self.pad, eos_token_id=self.eos, return_dict_in_generate=True)
        tempered = TemperedLogprobs(temperature, token_filter)  # greedy: argmax unchanged, log-probs reported at T
        torch.manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        try:
            with plain_generation_config(self.model):
                out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                          logits_processor=LogitsProcessorList([tempered]))
        finally:
            self.model.train(was_training)
        tokens = out.sequences[:, width:]
        logp = tempered.finish(out.sequences)
        comps, lps = [], []
        for row, lp in zip(tokens.tolist(), logp.tolist()):
            length = row.index(self.eos) + 1 if self.eos in row else len(row)
            comps.append(row[:length])
            lps.append(lp[:length])
        return Rollout(comps, lps)

    def close(self) -> None:
        self.model = None
