"""The rollout phase of Algorithm 1: which prompts a step trains on, and their completions from alpha.

The prompts of step k are drawn from ``(seed, k)`` alone, so a run and its resumed continuation draw
the same ones. alpha is frozen for the v steps of a sync window, so with window generation the
prompts of every step of the window are generated in one sampler call at the window's first step
(docs/theory.md, §7); per-step generation draws the same prompts, one call per step.

Asynchronous generation (``async_generation``): the window starting at step w0 is generated in a background
thread while the trainer trains the previous window, from the weights synced at w0 - v (the initial weights for
the first two windows); ``llm.step.clock`` says which weights produced each step's samples.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from llm.config import GRPOConfig
from llm.sampling import Rollout, Sampler
from llm.step.clock import SyncClock
from llm.tasks import Task


def step_seed(seed: int, step: int) -> int:
    """The sampler's seed for the generation call that starts at ``step``."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


@dataclass
class StepRollout:
    """A step's prompts (indices into the task's training prompts) and their G completions each, prompt-major;
    ``heldout_*``: the held-out prompts and completions (empty unless ``heldout_prompts``)."""

    prompt_idx: list[int]
    rollout: Rollout
    heldout_idx: list[int]
    heldout: Rollout


class RolloutWindow:
    """Completions for each step, generated per window (or per step) and handed out step by step; with
    ``prefetch`` a window is generated in a background thread (asynchronous generation)."""

    def __init__(self, config: GRPOConfig, task: Task, prompt_tokens: list[list[int]], sampler: Sampler,
                 clock: SyncClock):
        self.config, self.task, self.prompt_tokens, self.sampler = config, task, prompt_tokens, sampler
        self.clock = clock  # the run's own (``llm.run.trainer.start_run``), never a second one
        self._ready: dict[int, StepRollout] = {}
        self._pending: dict[int, Future] = {}  # window start -> its completions, being generated
        self._pool: ThreadPoolExecutor | None = None
        self._calls: list[tuple[int, float]] = []  # (tokens generated, seconds) of finished sampler calls

    def call_metrics(self) -> dict[str, float]:
        """``sampling/call_tokens`` and ``time/sampler_tokens_per_s`` of the sampler calls finished since the last
        call of this method (a window's one call at its first step; none at the other steps)."""
        calls, self._calls = self._calls, []
        if not calls:
            return {}
        tokens, seconds = sum(c[0] for c in calls), sum(c[1] for c in calls)
        return {"sampling/call_tokens": float(tokens), "time/sampler_tokens_per_s": tokens / max(seconds, 1e-9)}

    def _rows(self, idx: list[int]) -> dict:
        """An agent's sampler gets each prompt's data row (its environments' ``reset(**row)``)."""
        return {"rows": self.task.rows(idx)} if getattr(self.sampler, "agent", None) is not None else {}

    def prompts_of(self, step: int) -> tuple[list[int], list[int]]:
        """Indices into the task's training prompts of the P training and the held-out prompts of ``step``,
        drawn from independent streams of ``(seed, step)``."""
        cfg = self.config
        train = self.task.sample(np.random.default_rng([cfg.seed, step]), cfg.sampling.prompts_per_step).tolist()
        held = self.task.sample(np.random.default_rng([cfg.seed, step, 1]), cfg.diagnostics.heldout_prompts).tolist()
        return train, held

    def get(self, step: int) -> StepRollout:
        """The prompts of ``step`` and their G completions each: prefetched (waiting for them if need be), or
        generated now."""
        if step not in self._ready:
            w0 = self.clock.window_start(step) if self.config.sync.generates_windows else step
            future = self._pending.pop(w0, None)
            self._ready.update(future.result() if future is not None else self._generate(w0, step))
        return self._ready.pop(step)

    def extra(self, step: int, round_: int) -> StepRollout:
        """Dynamic sampling's generation round ``round_`` (1, 2, ...) of ``step``: P more training prompts, drawn from
        their own stream of ``(seed, step, 2, round_)``, G completions each from the sampler's weights now (alpha: the
        caller refuses asynchronous generation, where the sampler runs ahead), no held-out prompts."""
        cfg = self.config
        rng = np.random.default_rng([cfg.seed, step, 2, round_])
        idx = self.task.sample(rng, cfg.sampling.prompts_per_step).tolist()
        t0 = time.perf_counter()
        roll = self.sampler.generate([self.prompt_tokens[i] for i in idx], cfg.sampling.num_generations,
                                     cfg.completion_budget, cfg.sampling.temperature,
                                     step_seed(cfg.seed, step) + 7919 * round_, token_filter=cfg.sampling.token_filter,
                                     **self._rows(idx))
        self._calls.append((sum(map(len, roll.completion_ids)), time.perf_counter() - t0))
        return StepRollout(idx, roll, [], Rollout([], []))

    def prefetch(self, w0: int) -> None:
        """Start generating the window that starts at ``w0`` in the background, with the sampler's weights now
        (nothing past ``max_steps``). The sampler's weights must not change until ``get`` has its completions."""
        if w0 >= self.config.max_steps or w0 in self._pending:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
        self._pending[w0] = self._pool.submit(self._generate, w0, w0)

    def wait(self) -> None:
        """Wait until no generation is in flight (its completions are kept for ``get``)."""
        for future in self._pending.values():
            future.exception()  # waits; an error surfaces at ``get``

    def close(self) -> None:
        """Wait for a generation in flight (the sampler may not be closed under it) and drop its result."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._pending = None, {}

    def _generate(self, w0: int, first: int) -> dict[int, StepRollout]:
        """One sampler call for the steps of the window starting at ``w0`` (a single step without window
        generation); the completions of steps from ``first`` on. A window always starts at its first step (also
        when resuming inside it), so a resumed run draws exactly the completions the interrupted one did."""
        cfg = self.config
        G = cfg.sampling.num_generations
        steps = list(range(w0, min(w0 + cfg.sync.steps_per_call, cfg.max_steps)))
        prompts = {s: self.prompts_of(s) for s in steps}
        idx = [i for s in steps for part in prompts[s] for i in part]
        t0 = time.perf_counter()
        sampling = cfg.sampling
        roll = self.sampler.generate([self.prompt_tokens[i] for i in idx], G, cfg.completion_budget,
                                     sampling.temperature, step_seed(cfg.seed, w0), token_filter=sampling.token_filter,
                                     **self._rows(idx))
        self._calls.append((sum(map(len, roll.completion_ids)), time.perf_counter() - t0))
        ready, start = {}, 0
        for s in steps:
            train, held = prompts[s]
            n_train, n_held = len(train) * G, len(held) * G
            if s >= first:
                ready[s] = StepRollout(train, roll.slice(start, start + n_train), held,
                                       roll.slice(start + n_train, start + n_train + n_held))
            start += n_train + n_held
        return ready
