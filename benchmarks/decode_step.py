"""The static-cache decode loop against transformers' generate with a static cache: ``python benchmarks/decode_step.py``.

Both sample the same calls from the same model: left-padded prompts of the built-in arithmetic task, each repeated G
times, every completion running its ``--max-tokens`` (an EOS id the model never draws), the transformers sampler's
draw (temperature 1, no kept set, one seeded stream per call on the device) and log alpha. ``generate``: transformers'
own loop with ``cache_implementation="static"`` and its compiled forward (its ``CompileConfig``, CUDA graphs on a GPU),
the sampler's logits processor drawing. Ours: ``llm.sampling.static_decode.StaticDecoder`` (what
``--cache-implementation static`` runs). For each batch size: one warm-up call each (compiling), then the median of
``--repeats`` calls, in turn; tokens per second, milliseconds per decode step, ours over generate, and whether both
drew the same tokens. Then each loop's reads back from the device per step, counted op by op on its eager step
(``tests/llm/test_static_decode.py``'s counter) over 32 steps. ``--profile``: one more call of ours under
torch.profiler, and the operators that took its time (device time on a GPU).

Shapes: ``--shape bench`` is the 19M benchmark model (``benchmarks/throughput.py``, 1,000-odd-token vocabulary);
``--shape 0.5b`` Qwen2.5-0.5B's (151,936-token vocabulary, random weights), the GPU table's (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import QWEN05, build_model  # noqa: E402
from throughput import build_bench_model, cpu_description  # noqa: E402


def prompts(tok, count: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` arithmetic prompts left-padded to ``width``, and their mask."""
    rows = [tok(f"{a}+{b}=").input_ids[-width:] for a, b in zip(range(11, 11 + count), range(40, 40 + count))]
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", choices=["bench", "0.5b"], default=None, help="default: 0.5b on cuda, bench on cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="default: bf16 on cuda")
    ap.add_argument("--rows", type=int, nargs="+", default=None, help="sequences per call (default: 64 256 on cuda, "
                    "64 on cpu)")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt")
    ap.add_argument("--max-tokens", type=int, default=None, help="default: 128 on cuda, 64 on cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default="/tmp/offpolicy_grpo_decode_step")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch.cuda.is_available() is False")
        return 2
    cuda = device.type == "cuda"
    shape = args.shape or ("0.5b" if cuda else "bench")
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    rows_list = args.rows or ([64, 256] if cuda else [64])
    steps = args.max_tokens or (128 if cuda else 64)
    if any(r % args.group for r in rows_list):
        print(f"--rows must be multiples of --group {args.group}")
        return 2
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm.sampling.static_decode import CHECK_EVERY, Draw, StaticDecoder
    from fixtures.static_decode import HostReads, generate_static

    work = Path(args.work)
    model_dir = (build_model(work / "qwen_0.5b", shape=QWEN05, max_positions=1024) if shape == "0.5b"
                 else build_bench_model(work / "bench"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    eos, pad = model.config.vocab_size - 1, tok.pad_token_id  # an EOS never drawn: every row runs its tokens
    n = sum(p.numel() for p in model.parameters())
    where = torch.cuda.get_device_name(0) if cuda else cpu_description()
    print(f"{where}; {shape} shape ({n / 1e6:.1f}M parameters, vocabulary {model.config.vocab_size}), {dtype}, "
          f"torch {torch.__version__}; {steps} tokens per row, G = {args.group}", flush=True)
    decoder = StaticDecoder(model)
    print("| rows | generate tok/s | ours tok/s | generate ms/step | ours ms/step | ours / generate | same tokens |\n"
          "|---:|---:|---:|---:|---:|---:|---|", flush=True)
    for rows in rows_list:
        ids, mask = prompts(tok, rows // args.group, 12)
        ids, mask = ids.repeat_interleave(args.group, 0).to(device), mask.repeat_interleave(args.group, 0).to(device)
        draw = Draw(1.0, eos=eos, pad=pad)

        def theirs(seed=0):
            return generate_static(model, ids, mask, steps, 1.0, eos, pad, seed, compiled=True)

        def ours(seed=0):
            return decoder(ids, mask, steps, draw, torch.Generator(device=device).manual_seed(seed))

        t0 = time.perf_counter()
        a, b = theirs()[0], ours()[0]
        warm = time.perf_counter() - t0
        same = bool(torch.equal(a, b))
        times = {"generate": [], "ours": []}
        with torch.no_grad():
            for _ in range(args.repeats):
                times["generate"].append(timed(theirs, device))
                times["ours"].append(timed(ours, device))
        med = {k: statistics.median(v) for k, v in times.items()}
        tokens = rows * steps
        print(f"| {rows} | {tokens / med['generate']:,.0f} | {tokens / med['ours']:,.0f} | "
              f"{1e3 * med['generate'] / steps:.2f} | {1e3 * med['ours'] / steps:.2f} | "
              f"{med['generate'] / med['ours']:.2f}x | {'yes' if same else 'no'} |", flush=True)
        print(f"  (warm-up and compiling: {warm:.0f} s; calls: generate {[round(t, 3) for t in times['generate']]}, "
              f"ours {[round(t, 3) for t in times['ours']]})", flush=True)
    small_ids, small_mask = ids[:8], mask[:8]
    with HostReads() as r_gen:
        generate_static(model, small_ids, small_mask, 32, 1.0, eos, pad, 0)
    with HostReads() as r_ours:
        StaticDecoder(model, compile=False)(small_ids, small_mask, 32, draw, torch.Generator(device=device))
    print(f"reads back from the device over 32 steps (eager steps, op by op): generate {r_gen.count} "
          f"({r_gen.count / 32:.2f} a step: {r_gen.ops}), ours {r_ours.count} ({r_ours.count / 32:.2f} a step: "
          f"the prefill's mask check and one per {CHECK_EVERY} steps)", flush=True)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            ours()
            sync(device)
        key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=15), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
