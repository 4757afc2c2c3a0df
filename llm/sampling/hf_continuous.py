"""The transformers sampler with continuous batching (``--use-transformers-continuous-batching``, TRL 1.16's name).

alpha is the same frozen copy of the policy as ``TransformersSampler``'s, but a generation call goes to transformers'
own continuous-batching manager (``model.generate_batch``: a paged KV cache, requests scheduled as they finish, a
group's shared prompt cached once) instead of ``generate`` on a padded rectangle. The distribution sampled is the one
the trainer recomputes: the only logits processor is ``FilteredScores`` (logits / T, then the run's top-k, top-p and
min-p by ``llm.tensors.token_filter``, the trainer's own function), the manager draws from the softmax of what it
returns and reports log of that probability at the drawn token (``return_logprobs``). The model directory's stored
generation config is hidden as for ``generate``.

Randomness: the manager draws with torch's global generator on the model's device, seeded with the call's seed for
the call (the trainer's own generator state is restored afterwards). Which row gets which draw depends on the
manager's schedule, so unlike the plain sampler's per-row streams the samples are not independent of the batch:
the same distribution, not the same sample.

The manager is kept between calls of the same shape and settings (rows, prompt width, max_tokens, temperature,
filter, greedy), as transformers' ``persistent_manager``: its cache and, on a GPU, its captured CUDA graphs are built
once, and a sync, which copies the weights into the copy's own tensors, reaches it unchanged (tested). A call of
another shape builds a new one.

The KV cache is sized to the call (every row's prompt plus ``max_tokens``, in pages of ``PAGE_TOKENS``) rather than
to a share of the device's memory (transformers' default), so the sampler never takes memory the trainer needs; on
a CPU the default sizing made a call of the built-in model 20-50x slower (measured: 27 s against 0.5 s for 16
requests).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math

import torch

from llm.tensors.token_filter import NO_FILTER, TokenFilter, filtered_logits
from llm.sampling.base import Rollout
from llm.sampling.hf_generate import TransformersSampler, plain_generation_config

#: Tokens per page of the paged KV cache.
PAGE_TOKENS = 32
#: Most tokens one forward pass of the manager may hold (prefill chunks and decode steps together) on a CPU.
#: The manager's attention mask (sdpa and eager attention) is this many rows by the cache's tokens plus this many
#: columns, allocated and filled whenever a manager is built, and each pass attends over every row's cache. On a CPU
#: 512 (``python benchmarks/archive/cb_sizing.py --smollm2``, kept manager, seconds per call): the built-in model, 1,024 rows
#: x 16 tokens 1.54 at 8192, 1.11 at 1024, 0.93 at 512 (1.66x); 3,000 one-token rows 3.16, 1.54, 1.25 (2.54x); a new
#: manager's first call 5.41 s at 8192, 1.57 at 512; SmolLM2-135M, 64 rows x 48 tokens, 40.4, 41.0 and 40.6 s at 1024,
#: 512 and 256 (no change).
CPU_MAX_BATCH_TOKENS = 512
#: The same on an accelerator (not re-measured there).
MAX_BATCH_TOKENS = 8192


@contextlib.contextmanager
def quiet_manager():
    """transformers' continuous-batching logger at ERROR for the duration (it warns at every call that keeps its
    manager, which this sampler does on purpose)."""
    cb_logger = logging.getLogger("ContinuousBatchingLogger")
    level = cb_logger.level
    cb_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        cb_logger.setLevel(level)


class FilteredScores:
    """The manager's one logits processor: log-probabilities of softmax(logits / T) filtered by ``token_filter``
    (-inf off the kept set), whose softmax the manager samples from."""

    supports_continuous_batching = True

    def __init__(self, temperature: float, token_filter: TokenFilter = NO_FILTER):
        self.temperature, self.token_filter = temperature, token_filter

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(filtered_logits(scores.float() / self.temperature, self.token_filter), dim=-1)


def cache_config(rows: int, prompt_tokens: int, max_tokens: int, seed: int, device_type: str = "cpu"):
    """transformers' ``ContinuousBatchingConfig`` for a call of ``rows`` sequences of at most ``prompt_tokens`` +
    ``max_tokens`` tokens on a device of ``device_type``: a cache holding all of them at once, forward passes of at
    most CPU_MAX_BATCH_TOKENS (a CPU) or MAX_BATCH_TOKENS tokens, log-probs reported, ``seed`` where the installed
    transformers takes one, and CUDA graphs off: transformers turns them on by itself where the attention needs no
    mask (flash attention), and under them its sampling hit a device-side assert with this sampler's logits processor
    (a NaN or negative probability in ``torch.multinomial``, an H200, 2026-11-27), where the draw would no longer be
    what log alpha reports. The CUDA-graph path of the transformers sampler is ``--cache-implementation static``."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    pages = rows * math.ceil((prompt_tokens + max_tokens) / PAGE_TOKENS)
    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    kw = dict(return_logprobs=True, page_size=PAGE_TOKENS, num_blocks=pages, use_cuda_graph=False,
              max_batch_tokens=max(min(CPU_MAX_BATCH_TOKENS if device_type == "cpu" else MAX_BATCH_TOKENS,
                                       rows * (prompt_tokens + max_tokens)), prompt_tokens + 1))
    if "seed" in fields:
        kw["seed"] = seed
    return ContinuousBatchingConfig(**{k: v for k, v in kw.items() if k in fields})


class ContinuousBatchingSampler(TransformersSampler):
    """``TransformersSampler`` whose calls run through transformers' continuous batching (module docstring)."""

    name = "transformers (continuous batching)"
    _manager_key: tuple | None = None

    def _drop_manager(self) -> None:
        """Destroy the manager kept from an earlier call (transformers' persistent manager), if any."""
        if self._manager_key is not None and self.model is not None:
            self.model.destroy_cached_continuous_batching_manager()
        self._manager_key = None

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 greedy: bool = False, token_filter: TokenFilter = NO_FILTER) -> Rollout:
        """n completions per prompt (prompt-major) in one call of the manager; ``greedy``: the most likely token."""
        from transformers import GenerationConfig, LogitsProcessorList

        rows = [p for p in prompt_ids for _ in range(n)]
        if not rows:
            return Rollout([], [])
        model = self.model
        device = next(model.parameters()).device
        config = GenerationConfig(do_sample=not greedy, temperature=None, top_k=None, top_p=None,
                                  repetition_penalty=1.0, max_new_tokens=max_tokens, pad_token_id=self.pad,
                                  eos_token_id=self.eos)
        processors = LogitsProcessorList([FilteredScores(temperature, token_filter)])
        width = max(map(len, rows))
        cb = cache_config(len(rows), width, max_tokens, seed, device.type)
        key = (len(rows), width, max_tokens, temperature, token_filter, greedy)
        if key != self._manager_key:
            self._drop_manager()
        model.eval()
        # the manager asks the model for its processors: ours only, whatever the generation config would add
        model._get_logits_processor = lambda *a, **k: processors
        try:
            with plain_generation_config(model), quiet_manager(), torch.random.fork_rng(
                    devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(seed)
                out = model.generate_batch(rows, generation_config=config, continuous_batching_config=cb,
                                           progress_bar=False, persistent_manager=True)
            self._manager_key = key
        finally:
            del model._get_logits_processor
        results = list(out.values())
        failed = [r.error for r in results if r.error is not None]
        if len(results) != len(rows) or failed:
            raise RuntimeError(f"transformers' continuous batching returned {len(results) - len(failed)} of "
                               f"{len(rows)} completions{': ' + str(failed[0]) if failed else ''}")
        comps, lps = [], []
        for r in results:
            tokens = list(r.generated_tokens)[:max_tokens]
            length = tokens.index(self.eos) + 1 if self.eos in tokens else len(tokens)
            comps.append(tokens[:length])
            lps.append([float(x) for x in r.logprobs[:length]])
        return Rollout(comps, lps)

    def close(self) -> None:
        self._drop_manager()
        super().close()
