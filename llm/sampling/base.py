"""Samplers hold the behaviour policy alpha and generate groups of completions (docs/theory.md, §1 and §7).

The interface is small: ``generate`` returns completion token ids and the behaviour log-probs of
the sampled tokens: log of the distribution sampled, softmax(logits / temperature) restricted by the
``token_filter`` (top-k, top-p, min-p; none by default) and renormalised, the same distribution the trainer
recomputes, so the importance weights are exact; ``load_weights`` copies the trainer's current weights in
(alpha <- pi_theta).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from llm.core.token_filter import NO_FILTER, TokenFilter


@dataclass
class Rollout:
    """Completions for a list of prompts, ``n`` per prompt, prompt-major (prompt 0's n first)."""

    completion_ids: list[list[int]]
    """Token ids of each completion, ending with EOS when one was generated."""
    logprobs: list[list[float]] | None
    """Sampler's log alpha of each completion token (None if the sampler does not report them)."""

    def slice(self, start: int, stop: int) -> "Rollout":
        return Rollout(self.completion_ids[start:stop], None if self.logprobs is None else self.logprobs[start:stop])


class Sampler(Protocol):
    name: str

    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 greedy: bool = False, token_filter: TokenFilter = NO_FILTER) -> Rollout:
        ...

    def load_weights(self, model: torch.nn.Module) -> None:
        ...

    def close(self) -> None:
        ...
