"""Generation rate of the in-process vLLM engine on SmolLM2-135M-Instruct against its engine settings:
``python benchmarks/generation.py``.

Each configuration starts the trainer's own sampler (``llm.sampling.VLLMSampler``: seeded requests, one log-prob
per token) with different engine arguments, generates one batch as a warm-up and times the same call again: the
rate is generated tokens / seconds of that call, and its share of the float32 matmul rate counts 2N FLOPs per token.
Configurations: vLLM's CPU defaults with chunked prefill off (which seeded requests need; docs/samplers.md), then
the trainer's settings (``llm.sampling.vllm_settings``: 32-token blocks with prefix caching, a KV cache sized to
the batch) at several ``max_num_seqs``; or (``--kv-scales``) the trainer's settings with the KV cache scaled, to
see what a cache too small for the running sequences costs (vLLM preempts and recomputes; the samples' digest shows
whether what is drawn changes). The defaults of the command are the window of ``benchmarks/real_model.py``
(16 prompts x 8 completions of up to 96 tokens, the chat template's ~50-token prompts), the job of
docs/samplers.md's measurement. ``--profile``: then one more call with the trainer's settings under torch.profiler
(the engine runs in this process), and the operators that took its time.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import count_parameters, matmul_flops  # noqa: E402


@contextlib.contextmanager
def engine_args(make):
    """The sampler built inside this block gets ``make(model_config, dtype, max_model_len, sequences)`` as its CPU
    engine arguments instead of the trainer's."""
    from llm.sampling import vllm_settings

    saved = vllm_settings.cpu_engine_args
    vllm_settings.cpu_engine_args = make
    try:
        yield
    finally:
        vllm_settings.cpu_engine_args = saved


def configurations(seqs: list[int], kv_scales: list[float]) -> list[tuple[str, object]]:
    from llm.sampling import vllm_settings as s

    trainers = s.cpu_engine_args  # the trainer's own, before ``engine_args`` replaces it

    def defaults(model_config, dtype, max_model_len, sequences, group=1, prompt_tokens=0):
        return dict(enable_chunked_prefill=False, max_num_batched_tokens=s.batched_tokens(max_model_len))

    def ours(max_seqs):
        def make(model_config, dtype, max_model_len, sequences, group=1, prompt_tokens=0):
            return dict(trainers(model_config, dtype, max_model_len, sequences, group, prompt_tokens),
                        max_num_seqs=max_seqs,
                        kv_cache_memory_bytes=s.kv_cache_bytes(model_config, dtype, max_model_len, sequences, max_seqs))
        return make

    def scaled(scale):
        def make(model_config, dtype, max_model_len, sequences, group=1, prompt_tokens=0):
            args = trainers(model_config, dtype, max_model_len, sequences, group, prompt_tokens)
            return dict(args, kv_cache_memory_bytes=int(scale * args["kv_cache_memory_bytes"]))
        return make

    if kv_scales:
        return [(f"the trainer's settings, KV cache x {f:g}", scaled(f)) for f in kv_scales]
    return [("vLLM CPU defaults, chunked prefill off", defaults)] + [
        (f"blocks of {s.CPU_BLOCK_SIZE}, prefix caching, max_num_seqs {n}" + (" (the trainer's)" if n == s.CPU_MAX_SEQS
                                                                               else ""), ours(n)) for n in seqs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8, help="completions per prompt")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--seqs", type=int, nargs="+", default=[64, 128, 256], help="max_num_seqs values to try")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--kv-scales", type=float, nargs="*", default=[],
                    help="instead: the trainer's settings with the KV cache scaled by each of these (below 1: vLLM "
                         "preempts and recomputes; the table's last column shows whether the samples stay the same)")
    ap.add_argument("--profile", action="store_true",
                    help="also profile one call with the trainer's settings: the operators' own CPU time")
    args = ap.parse_args()
    from transformers import AutoConfig, AutoTokenizer

    from llm.models.pretrained import smollm2_dir
    from llm.sampling.vllm_engine import VLLMSampler

    from real_model import real_workload

    model_dir = smollm2_dir(log=lambda *a: None)
    tok = AutoTokenizer.from_pretrained(model_dir)
    work = real_workload(model_dir)
    prompts = [list(p) for p in work.prompt_ids[: args.prompts]]
    config = AutoConfig.from_pretrained(model_dir)
    n_params = count_parameters(model_dir)
    total = args.prompts * args.n
    print(f"SmolLM2-135M-Instruct ({n_params / 1e6:.1f}M), {args.dtype}: {args.prompts} prompts "
          f"({sum(map(len, prompts)) / len(prompts):.1f} tokens on average) x {args.n} completions of up to "
          f"{args.max_tokens} tokens = {total} sequences per call, temperature 1; torch threads "
          f"{torch.get_num_threads()}", flush=True)
    rate = matmul_flops(getattr(torch, args.dtype), reps=3)
    rows = []
    for name, make in configurations(args.seqs, args.kv_scales):
        with engine_args(make):
            t0 = time.perf_counter()
            sampler = VLLMSampler(str(model_dir), dtype=args.dtype, seed=0,
                                  max_model_len=max(map(len, prompts)) + args.max_tokens,
                                  eos_token_id=tok.eos_token_id, model_config=config, sequences=total, group=args.n,
                                  prompt_tokens=max(map(len, prompts)))
            start = time.perf_counter() - t0
        sampler.generate(prompts, args.n, args.max_tokens, 1.0, seed=0)  # warm-up
        t0 = time.perf_counter()
        out = sampler.generate(prompts, args.n, args.max_tokens, 1.0, seed=1)
        sec = time.perf_counter() - t0
        if args.profile and "the trainer's" in name:
            profiled = profile_call(sampler, prompts, args.n, args.max_tokens)
        tokens = sum(map(len, out.completion_ids))
        digest = hashlib.sha256(repr(out.completion_ids).encode()).hexdigest()[:10]
        rows.append((name, tokens / sec, tokens / total, digest))
        print(f"  {name}: {tokens} tokens in {sec:.1f} s = {tokens / sec:.0f} tokens/s; engine start {start:.0f} s; "
              f"samples {digest}", flush=True)
        sampler.close()
        del sampler
        gc.collect()
    rate = max(rate, matmul_flops(getattr(torch, args.dtype), reps=3))
    print(f"\n{args.dtype} matmul rate (2048^3, median, the larger of before/after): {rate / 1e9:.0f} GFLOP/s\n")
    print("| engine settings | tokens/s | tokens per completion | share of the matmul rate (2N per token) | samples |")
    print("|---|---|---|---|---|")
    for name, tps, length, digest in rows:
        print(f"| {name} | {tps:.0f} | {length:.1f} | {2 * n_params * tps / rate:.0%} | {digest} |")
    if args.profile:
        tokens, seconds, ops = profiled
        print(f"\none call with the trainer's settings under the profiler: {tokens} tokens in {seconds:.1f} s "
              f"({tokens / seconds:.0f} tokens/s); operators' own CPU time:")
        total = sum(t for _, t in ops)
        for op, t in ops[:12]:
            print(f"  {op:<60} {t:7.2f} s {t / total:6.1%}")
        print(f"  {'the rest':<60} {sum(t for _, t in ops[12:]):7.2f} s {sum(t for _, t in ops[12:]) / total:6.1%}")
    return 0


def profile_call(sampler, prompts, n: int, max_tokens: int) -> tuple[int, float, list[tuple[str, float]]]:
    """One generation call under torch.profiler: its tokens, seconds and (operator, own CPU seconds), largest
    first (the profiler's overhead makes the call slower than the timed one)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        out = sampler.generate(prompts, n, max_tokens, 1.0, seed=2)
        seconds = time.perf_counter() - t0
    ops = sorted(((e.key, e.self_cpu_time_total / 1e6) for e in prof.key_averages()), key=lambda x: -x[1])
    return sum(map(len, out.completion_ids)), seconds, ops


if __name__ == "__main__":
    raise SystemExit(main())
