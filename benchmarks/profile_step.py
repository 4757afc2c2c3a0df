"""Where the seconds of the trainer's optimise phase go: ``python benchmarks/profile_step.py [--model benchmark]``.

The optimise phase is the forward and backward of the policy over a step's batch (``llm.tensors.logprobs.forward_completions``,
the trainer's own function: shared prompts, chunked output layer) and the optimiser step. This script builds a batch
of ``benchmarks/real_model.py``'s shape (4 prompts x G = 8 of SmolLM2-135M-Instruct's real prompts, completions of
the given length), times the phase in float32 and under bfloat16 autocast (eager attention, as the benchmark), with
the trainer's process settings (``keep_freed_memory``, ``llm.models.vml``; ``--no-keep-freed-memory`` for glibc's default), then
profiles one pass of each with torch.profiler and sums the operators' own CPU time by kind: matrix products, attention,
normalisation, elementwise arithmetic and activations, dtype casts and copies (``copy_``), layout, the optimiser,
the rest.
With ``--compile`` it also times the step with each decoder block compiled as the trainer's ``--compile`` does
(``llm.models.model.compile_blocks``: inductor, dynamic shapes), for each dtype, after a first pass that compiles.
``--model benchmark``: the same for the benchmark model of ``benchmarks/throughput.py`` (19.3M parameters, its 4
arithmetic prompts x G = 16, completions of ``--length`` tokens, 48 by default: that benchmark's mean).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import matmul_flops  # noqa: E402

#: Operator name fragments -> kind, first match wins (names of aten operators as torch.profiler reports them).
KINDS = (
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "mkldnn")),
    ("attention", ("attention", "aten::_softmax", "aten::softmax", "_softmax_backward")),
    ("optimiser", ("aten::_fused_adam", "_foreach", "aten::addcdiv", "aten::addcmul", "aten::lerp")),
    ("casts/copies", ("aten::to", "aten::_to_copy", "aten::copy_")),
    ("norm (rms)", ("aten::rsqrt", "aten::pow", "aten::mean")),
    ("layout", ("aten::cat", "aten::index", "aten::clone", "aten::contiguous", "aten::transpose", "aten::view",
                "aten::expand", "aten::slice", "aten::select", "aten::reshape", "aten::unsqueeze", "aten::permute",
                "aten::masked_scatter", "aten::gather", "aten::scatter", "aten::embedding", "aten::fill_",
                "aten::zero_", "aten::empty")),
    ("elementwise", ("aten::mul", "aten::add", "aten::sub", "aten::neg", "aten::silu", "aten::div", "aten::exp",
                     "aten::log", "aten::sum", "aten::cos", "aten::sin", "aten::where", "aten::max", "aten::logsumexp",
                     "aten::sigmoid", "aten::clamp", "aten::abs", "Backward")),
)


def kind(name: str) -> str:
    return next((k for k, frags in KINDS if any(f in name for f in frags)), "other")


def real_batch(prompts: int, generations: int, length: int):
    """The model, and a batch of its real chat-template prompts with ``length``-token completions drawn at random
    from the vocabulary (the arithmetic of a pass depends on the shapes only)."""
    from llm.tensors.batch import make_batch
    from llm.models.pretrained import smollm2_dir

    from real_model import real_workload

    model_dir = smollm2_dir(log=lambda *a: None)
    work = real_workload(model_dir, prompts, generations, length)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    prompt_ids = [list(p) for p in work.prompt_ids[:prompts]]
    g = torch.Generator().manual_seed(0)
    rows = [prompt_ids[i // generations] for i in range(prompts * generations)]
    comps = [torch.randint(0, len(tok), (length,), generator=g).tolist() for _ in rows]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id  # as llm.models.model.load_policy
    return model_dir, make_batch(rows, comps, pad, torch.device("cpu"))


def bench_batch(length: int):
    """The benchmark model of ``benchmarks/throughput.py`` and a batch of its 4 prompts x G = 16 with ``length``-token
    completions drawn at random from the vocabulary (EOS and padding excluded)."""
    from llm.tensors.batch import make_batch
    from llm.models.model import load_policy
    from llm.tasks import arithmetic_task

    from throughput import BENCH, build_bench_model

    model_dir = build_bench_model(Path(__file__).resolve().parents[1] / "runs" / "bench_model")
    _, tok = load_policy(str(model_dir), torch.device("cpu"))
    prompts = [list(p) for p in arithmetic_task().bind(tok).prompt_ids[:BENCH.prompts]]
    rows = [prompts[i // BENCH.generations] for i in range(BENCH.prompts * BENCH.generations)]
    special = {tok.eos_token_id, tok.pad_token_id}
    ids = [i for i in range(len(tok)) if i not in special]
    g = torch.Generator().manual_seed(0)
    comps = [[ids[j] for j in torch.randint(0, len(ids), (length,), generator=g).tolist()] for _ in rows]
    return model_dir, make_batch(rows, comps, tok.pad_token_id, torch.device("cpu"))


def optimise_once(model, opt, batch, precision) -> None:
    from llm.tensors.logprobs import forward_completions

    logp = forward_completions(model, batch, 1.0, precision).logp
    (-(logp * batch.completion_mask).sum() / batch.completion_mask.sum()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["real", "benchmark"], default="real",
                    help="SmolLM2-135M-Instruct (real) or the throughput benchmark's 19.3M-parameter model")
    ap.add_argument("--length", type=int, default=0,
                    help="completion tokens per sequence (0: 96 for the real model, 48 for the benchmark model)")
    ap.add_argument("--reps", type=int, default=3, help="timed passes per dtype after one warm-up")
    ap.add_argument("--compile", action="store_true", help="also time the decoder under torch.compile")
    ap.add_argument("--no-keep-freed-memory", dest="keep", action="store_false",
                    help="let glibc return large blocks at every free, as before the trainer's keep_freed_memory")
    args = ap.parse_args()
    from llm.models.vml import resolve_vml_dispatch
    from runkit.host_memory import keep_freed_memory

    resolve_vml_dispatch()  # as the trainer's setup does
    if args.keep:
        keep_freed_memory()
    print(f"freed memory {'kept in the process (the trainer default)' if args.keep else 'returned at every free'}",
          flush=True)
    from llm.models.model import Precision, compile_blocks, load_policy

    if args.model == "real":
        model_dir, batch = real_batch(4, 8, args.length or 96)
    else:
        model_dir, batch = bench_batch(args.length or 48)
    tokens = int(batch.attention_mask.sum())
    from llm.tensors.logprobs import shared_prompts

    shared = shared_prompts(batch)
    run = tokens if shared is None else int(batch.attention_mask[shared[0], :batch.prompt_width].sum()
                                            + batch.attention_mask[:, batch.prompt_width:].sum())
    print(f"batch: {batch.size} sequences, {tokens} tokens; the decoder runs {run} positions "
          + ("(each distinct prompt once)" if shared is not None else "(prompts too short to share)"), flush=True)
    for dtype in ("float32", "bfloat16"):
        model, _ = load_policy(str(model_dir), torch.device("cpu"), attn_implementation="eager"
                               if dtype == "bfloat16" else "auto")
        n = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        precision = Precision(torch.bfloat16 if dtype == "bfloat16" else None)
        variants = [("eager", model)]
        if args.compile:
            compiled, _ = load_policy(str(model_dir), torch.device("cpu"), attn_implementation="eager"
                                      if dtype == "bfloat16" else "auto")
            compile_blocks(compiled)  # the trainer's --compile
            variants.append(("compiled", compiled))
        before = matmul_flops(getattr(torch, dtype))
        medians = []
        for label, m in variants:
            o = opt if m is model else torch.optim.AdamW(m.parameters(), lr=1e-5)
            optimise_once(m, o, batch, precision)  # warm-up (and compilation)
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                optimise_once(m, o, batch, precision)
                times.append(time.perf_counter() - t0)
            medians.append((label, statistics.median(times)))
        after = matmul_flops(getattr(torch, dtype))
        rate = max(before, after)  # the host's rate drifts; the larger of the two measurements, as the benchmarks
        print(f"{dtype} matmul rate (2048^3) {before / 1e9:.0f} / {after / 1e9:.0f} GFLOP/s before / after", flush=True)
        for label, sec in medians:
            print(f"{dtype} {label}: optimise phase {sec:.2f} s (median of {args.reps}) for {tokens} tokens; "
                  f"6N x tokens / (s x {dtype} matmul rate {rate / 1e9:.0f} GFLOP/s) = "
                  f"{6 * n * tokens / sec / rate:.0%}; over the positions run {6 * n * run / sec / rate:.0%}",
                  flush=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            optimise_once(model, opt, batch, precision)
        by_kind: dict[str, float] = {}
        for ev in prof.key_averages():
            by_kind[kind(ev.key)] = by_kind.get(kind(ev.key), 0.0) + ev.self_cpu_time_total / 1e6
        total = sum(by_kind.values())
        # FLOPs from a pass of their own: counting them slows the elementwise operators' records
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True) as counted:
            optimise_once(model, opt, batch, precision)
        mm_flops = sum(ev.flops for ev in counted.key_averages() if kind(ev.key) == "matmul")
        print(f"  matrix products: {mm_flops / 1e9:.0f} GFLOP in {by_kind.get('matmul', 0.0):.2f} s = "
              f"{mm_flops / max(by_kind.get('matmul', 0.0), 1e-9) / rate:.0%} of the {dtype} matmul rate")
        print(f"  profile of one pass ({dtype}, eager; operators' own CPU time, {total:.2f} s in all):")
        for k, s in sorted(by_kind.items(), key=lambda kv: -kv[1]):
            print(f"    {k:<12} {s:6.2f} s  {s / total:5.1%}")
        top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
        print("    top operators: " + ", ".join(f"{e.key} {e.self_cpu_time_total / 1e6:.2f} s" for e in top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
