"""What vLLM's text output costs the in-process sampler: ``python benchmarks/archive/vllm_detokenize.py`` (about a minute on
2 cores). The trainer reads only token ids and log-probs from vLLM, so ``llm.sampling.VLLMSampler`` asks for no
text (``detokenize=False``); this times its ``generate`` with vLLM's default (each request's text and each log-prob's
token decoded as it is generated) against the sampler's setting, alternating, in one engine, and checks that both
draw the same tokens with the same log-probs.

Workload: the built-in model, one torch thread, 128 prompts x G = 8 of at most ``--max-tokens`` tokens (a window of
the built-in task's default run: 32 prompts x 8 x v = 4); ``--reps`` timed calls of each after one of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=40, help="most tokens per completion")
    ap.add_argument("--reps", type=int, default=3, help="timed calls of each setting")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import vllm
    from transformers import AutoTokenizer

    from llm.models.tiny import tiny_model_dir
    from llm.sampling.vllm_engine import VLLMSampler

    path = str(tiny_model_dir())
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok(f"{a}+{b}=").input_ids for a in range(8) for b in range(16)]
    sampler = VLLMSampler(path, dtype="float32", seed=0, max_model_len=64, eos_token_id=tok.eos_token_id,
                          sequences=len(prompts) * 8, group=8, prompt_tokens=max(map(len, prompts)))
    params = vllm.SamplingParams

    def with_text(*a, **k):  # vLLM's default: text decoded
        return params(*a, **{**k, "detokenize": True})

    times, samples = {"text decoded (vLLM's default)": [], "no text (the sampler's)": []}, {}
    try:
        for rep in range(args.reps + 1):
            for name in times:
                vllm.SamplingParams = with_text if name.startswith("text") else params
                t0 = time.perf_counter()
                roll = sampler.generate(prompts, 8, args.max_tokens, 1.0, rep)
                if rep:
                    times[name].append(time.perf_counter() - t0)
                samples.setdefault(rep, []).append((roll.completion_ids, roll.logprobs))
    finally:
        vllm.SamplingParams = params
        sampler.close()
    same = all(a == b for a, b in samples.values())
    tokens = sum(map(len, roll.completion_ids))
    print(f"{len(prompts)} prompts x 8, {tokens} tokens generated in the last call; the same tokens and log-probs "
          f"both ways: {same}")
    print("| setting | median s per call | calls |\n|---|---:|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.2f} | {', '.join(f'{t:.2f}' for t in ts)} |")
    medians = [statistics.median(ts) for ts in times.values()]
    print(f"ratio: {medians[0] / medians[1]:.2f}x")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
