"""The two speed paths of docs/benchmarks.md on this CPU: ``python benchmarks/speed_paths.py`` (about 6 minutes on
2 cores).

1. ``--padding-free`` against the padded passes, on the real model (SmolLM2-135M-Instruct, float32): one update's
   forward and backward (the sum of the completions' log-probs) over 4 prompts of 50 tokens x G = 8 completions of
   8-96 tokens (uniform, random tokens, seeded), the whole step in one pass and in micro-batches of 8. Rows: the
   trainer's default padded passes (grouped by length, shared prompts), the plain padded rectangle (neither), and
   the packed passes. Each configuration runs once to warm up, then 3 times in rounds that alternate the
   configurations; the median is reported, with trained tokens/s (real prompt + completion tokens), and, from one
   pass in a fresh process per configuration, the rise of its peak resident memory (VmHWM) above the resident
   memory before the pass.
2. ``--use-transformers-continuous-batching`` against plain ``generate``: a model of Qwen2.5-0.5B's shape (random
   weights, the 151,936-token vocabulary, float32), 8 prompts x G = 8 completions of 32 tokens (a random model writes
   them all), one warm-up call, then 3 calls each in alternating rounds; generated tokens/s of the median call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from memory import QWEN05, build_model, peak_mb, reset_peak, rss_mb  # noqa: E402

#: Part 1's rows: name -> (group_by_length, share_prompts, padding_free).
PACKING_ROWS = {"padded (defaults: grouped by length, shared prompts)": (True, True, False),
                "padded rectangle (neither)": (False, False, False),
                "padding-free (packed)": (True, False, True)}


def _packing_setup():
    """SmolLM2 in training mode and part 1's batch (seeded)."""
    from llm.tensors.batch import make_batch
    from llm.models.model import load_policy
    from llm.models.pretrained import smollm2_dir

    model, tok = load_policy(str(smollm2_dir(log=lambda *a: None)), torch.device("cpu"))
    model.train()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 40000, size=50).tolist() for _ in range(4)]
    comps = [rng.integers(10, 40000, size=int(rng.integers(8, 97))).tolist() for _ in range(32)]
    return model, make_batch([p for p in prompts for _ in range(8)], comps, tok.pad_token_id, "cpu"), comps


def _passes(name: str, micro: int):
    from llm import GRPOConfig
    from llm.run.specs import passes

    g, s, pf = PACKING_ROWS[name]
    return passes(GRPOConfig(per_device_train_batch_size=micro, group_by_length=g, share_prompts=s,
                                         padding_free=pf, num_generations=8))


def _one_pass(model, batch, passes) -> float:
    t0 = time.perf_counter()
    for rows in batch.passes(passes.micro_batch, passes.by_length):
        passes.forward(model, batch.take(rows)).logp.sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def memory_row(name: str, micro: int) -> None:
    """One pass of row ``name`` in this fresh process: the rise of the peak resident memory above the resident memory
    after the model and batch are loaded (printed as ``RESULT <MB>``)."""
    model, batch, _ = _packing_setup()
    passes = _passes(name, micro)
    before = rss_mb()
    reset_peak()
    _one_pass(model, batch, passes)
    print(f"RESULT {peak_mb() - before:.0f}")


def packing(reps: int = 3) -> None:
    import subprocess

    model, batch, comps = _packing_setup()
    tokens = int(batch.attention_mask.sum())
    lengths = [len(c) for c in comps]
    print(f"1. padding-free: SmolLM2-135M-Instruct float32, 32 sequences of 50 prompt + {min(lengths)}-{max(lengths)} "
          f"completion tokens (mean {np.mean(lengths):.1f}); {tokens} real tokens, padded rectangle "
          f"{batch.input_ids.numel()} positions; torch threads {torch.get_num_threads()}", flush=True)
    for micro in (0, 8):
        configs = {name: _passes(name, micro) for name in PACKING_ROWS}
        times = {n: [] for n in configs}
        for name, passes in configs.items():
            _one_pass(model, batch, passes)  # warm-up
        for _ in range(reps):
            for name, passes in configs.items():
                times[name].append(_one_pass(model, batch, passes))
        rises = {}
        for name in configs:  # peak memory: one pass in a fresh process each
            out = subprocess.run([sys.executable, __file__, "--memory-row", name, "--micro", str(micro)],
                                 capture_output=True, text=True).stdout
            rises[name] = float(next(ln.split()[1] for ln in out.splitlines() if ln.startswith("RESULT ")))
        base = statistics.median(times[next(iter(configs))])
        print(f"\n   micro-batch {micro or 'whole step'}:\n   | passes | s (median of {reps}) | trained tokens/s | "
              "x default | peak rise MB (own process) |\n   |---|---:|---:|---:|---:|")
        for name in configs:
            t = statistics.median(times[name])
            print(f"   | {name} | {t:.3f} | {tokens / t:,.0f} | {base / t:.2f} | {rises[name]:,.0f} |", flush=True)


def continuous_batching(work: Path, reps: int = 3) -> None:
    from llm.models.model import load_policy
    from llm.sampling.hf_continuous import ContinuousBatchingSampler
    from llm.sampling.hf_generate import TransformersSampler
    from llm.tasks import arithmetic_task

    model, tok = load_policy(str(build_model(work / "qwen_0.5b", shape=QWEN05, max_positions=256)),
                             torch.device("cpu"))
    prompts = [tok(p).input_ids for p in arithmetic_task().prompts[:8]]
    samplers = {"generate": TransformersSampler(model, tok.eos_token_id, tok.pad_token_id, copy=False),
                "continuous batching": ContinuousBatchingSampler(model, tok.eos_token_id, tok.pad_token_id, copy=False)}
    print(f"\n2. continuous batching: Qwen2.5-0.5B shape ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M "
          "parameters, random weights, float32), 8 prompts x G = 8 x 32 tokens", flush=True)
    times, generated = {n: [] for n in samplers}, {}
    for name, s in samplers.items():
        s.generate(prompts, 8, 32, 1.0, 0)  # warm-up
    for i in range(reps):
        for name, s in samplers.items():
            t0 = time.perf_counter()
            roll = s.generate(prompts, 8, 32, 1.0, i + 1)
            times[name].append(time.perf_counter() - t0)
            generated[name] = sum(map(len, roll.completion_ids))
    print(f"   | sampler | s per call (median of {reps}) | generated tokens/s | x generate |\n   |---|---:|---:|---:|")
    base = statistics.median(times["generate"])
    for name in samplers:
        t = statistics.median(times[name])
        print(f"   | {name} | {t:.2f} | {generated[name] / t:,.0f} | {base / t:.2f} |", flush=True)
    samplers["continuous batching"].close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/tmp/offpolicy_grpo_speed_paths", help="the 0.5B-shape model's files")
    ap.add_argument("--part", choices=["all", "packing", "continuous"], default="all")
    ap.add_argument("--memory-row", default="", help=argparse.SUPPRESS)
    ap.add_argument("--micro", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_row:
        memory_row(args.memory_row, args.micro)
        return 0
    if args.part in ("all", "packing"):
        packing()
    if args.part in ("all", "continuous"):
        continuous_batching(Path(args.work))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
