"""GPU benchmark: ``python benchmarks/gpu.py`` on a CUDA machine (docs/benchmarks.md, "On a GPU").

A model of Qwen2.5-0.5B's exact shape (hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864, the 151,936-token
vocabulary, tied embeddings; random weights built locally with the built-in character tokenizer; ``--shapes 1.5b``
adds Qwen2.5-1.5B's shape) on the GPU:

1. The GPU's bf16 matmul rate, measured here (8192^3 products, CUDA events, median of 10 after 3 warm-ups): the
   ceiling every efficiency below is a share of.
2. Memory against docs/memory.md's projection (0.5B shape only: the projection's constants were measured at its
   width). The trainer's static part (float32 policy, its gradient, AdamW's two moments, alpha's and pi_ref's
   float32 copies) against 24 bytes per parameter; then one micro-batch of 8 sequences of the GSM8K length
   (150 prompt + 512 completion tokens) through ``llm.tensors.logprobs.forward_completions`` and its backward, in float32
   and under bf16 autocast, with and without gradient checkpointing: the rise of torch.cuda.max_memory_allocated
   above the allocation before the pass, against the projection's activation term (a, b, c of docs/memory.md,
   measured in float32 on a CPU).
3. The trainer end to end (``llm.train`` in this process, ``--device cuda --dtype bfloat16``, the transformers
   sampler, the built-in arithmetic prompts, 8 prompts x G = 8, completions of up to 128 tokens, beta 0, v = 1,
   exact J off, ``mask_zero_std_groups`` off so every step trains every completion): 8 steps, the last 4 timed.
   The optimise phase's trained tokens/s (prompt + completion tokens) and its share of the bf16 rate at 6N FLOPs
   per token; the sampler's generated tokens/s and its share at 2N per token; the run's peak CUDA memory.

4. ``--speed`` (0.5B shape): TRL 1.16's GRPOTrainer first (its default, transformers ``generate``, in a child process
   on the same GPU, model and prompts; a call cut short by its time limit keeps every ratio it measured), then the
   same workload at v = 1 and v = 4 for our trainer with ``--cache-implementation static`` (the decode step under
   CUDA graphs), with that, ``--padding-free`` and ``--token-budget 8192``, and with plain ``generate`` (one prefill
   per prompt); ``--all-rows`` adds both continuous batchings. Steps 2.. timed. ``--check`` (``make
   benchmark-gpu``): tests/gpu first (``--tests-timeout`` caps them), then this part, one table. Ratios are steps
   per second over TRL's default and over TRL's continuous batching, all rows from this one call. TRL needs trl,
   datasets, dill and multiprocess importable (carried as wheels to a GPU machine without them: docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import GSM8K, QWEN05, STATIC_BYTES_PER_PARAM, activation_bytes, build_model  # noqa: E402
from throughput import Workload, run_ours, run_trl  # noqa: E402

#: Qwen2.5-1.5B's published configuration (config.json of Qwen/Qwen2.5-1.5B-Instruct).
QWEN15 = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
              intermediate_size=8960)
SHAPES = {"0.5b": QWEN05, "1.5b": QWEN15}
#: docs/memory.md part 2's constants at Qwen2.5-0.5B's width (``benchmarks/memory.py``, float32 on a CPU): bytes per
#: sequence per layer (a), per sequence outside the layers (b), and the output layer's chunks and the embedding's
#: gradient (c).
DOC_CONSTANTS = {"a": 73 * 2**20, "b": 16 * 2**20, "c": 1.52e9}
#: Micro-batch of part 2 (sequences of the GSM8K length).
MICRO = 8
#: Part 3's workload: 8 prompts x G = 8 completions of up to 128 tokens from the built-in arithmetic prompts.
WORKLOAD = Workload(prompts=8, generations=8, max_tokens=128)
GB = 1e9


def bf16_matmul_rate(n: int = 8192, reps: int = 10) -> float:
    """FLOP/s of an n x n x n bf16 product on the GPU: median of ``reps`` timed by CUDA events, after 3 warm-ups."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n**3 / statistics.median(times)


def memory_against_projection(model_dir: Path, log=print, device: str = "cuda") -> dict:
    """Part 2: the static allocation and one micro-batch's peak rise, measured against the projection."""
    from llm.tensors.batch import make_batch
    from llm.tensors.logprobs import forward_completions
    from llm.models.model import Precision, frozen_copy, load_policy

    device = torch.device(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    policy, _ = load_policy(str(model_dir), device)
    policy.train()
    n_params = sum(p.numel() for p in policy.parameters())
    copies = [frozen_copy(policy) for _ in range(2)]  # alpha's and pi_ref's float32 copies
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-7)
    length, prompt = GSM8K["prompt_tokens"] + GSM8K["completion_tokens"], GSM8K["prompt_tokens"]
    g = torch.Generator().manual_seed(0)

    def batch(seqs: int):
        return make_batch(torch.randint(3, 99, (seqs, prompt), generator=g).tolist(),
                          torch.randint(3, 99, (seqs, length - prompt), generator=g).tolist(), 0, device)

    forward_completions(policy, batch(1), 1.0).logp.sum().backward()  # gradients and AdamW's moments allocated
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    torch.cuda.synchronize()
    static = torch.cuda.memory_allocated() - base
    out = {"parameters": n_params, "static_gb": static / GB,
           "static_projected_gb": STATIC_BYTES_PER_PARAM * n_params / GB, "passes": []}
    log(f"  static: {static / GB:.2f} GB measured, {STATIC_BYTES_PER_PARAM * n_params / GB:.2f} GB projected "
        f"({STATIC_BYTES_PER_PARAM} bytes x {n_params / 1e6:.1f}M parameters)", flush=True)
    layers = policy.config.num_hidden_layers
    for ckpt in (False, True):
        if ckpt:
            policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for name, precision in (("float32", Precision()), ("bfloat16", Precision(torch.bfloat16))):
            b = batch(MICRO)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            forward_completions(policy, b, 1.0, precision).logp.sum().backward()
            torch.cuda.synchronize()
            rise = torch.cuda.max_memory_allocated() - before
            policy.zero_grad(set_to_none=False)
            projected = activation_bytes(DOC_CONSTANTS, MICRO, layers, ckpt)
            out["passes"].append({"checkpointing": ckpt, "dtype": name, "rise_gb": rise / GB,
                                  "projected_gb": projected / GB, "peak_gb": (static + rise) / GB,
                                  "peak_projected_gb": (STATIC_BYTES_PER_PARAM * n_params + projected) / GB})
            log(f"  {MICRO} x {length} tokens, checkpointing {'on' if ckpt else 'off'}, {name}: rise "
                f"{rise / GB:.2f} GB, projected {projected / GB:.2f} GB", flush=True)
    del policy, optimizer, copies
    torch.cuda.empty_cache()
    return out


def trainer_end_to_end(model_dir: Path, work: Path, rate: float, log=print) -> dict:
    """Part 3: ``llm.train`` on the GPU in bf16 with the transformers sampler; the last 4 of 8 steps timed."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    row = run_ours("ours transformers bf16", model_dir, "transformers", 1, "bfloat16", work, windows=2,
                   workload=WORKLOAD, device="cuda")
    n_params = saved_parameters(model_dir)
    optimise, generate = row.phases["time/optimise"], row.phases["time/generate"]
    out = {"seconds": time.perf_counter() - t0, "parameters": n_params, "s_per_step": 1 / row.steps_per_s,
           "phases": row.phases, "gen_tokens": row.gen_tokens, "train_tokens": row.train_tokens,
           "optimise_tokens_per_s": row.train_tokens / optimise,
           "optimise_share": 6 * n_params * row.train_tokens / optimise / rate,
           "sampler_tokens_per_s": row.gen_tokens / generate,
           "sampler_share": 2 * n_params * row.gen_tokens / generate / rate,
           "peak_gb": torch.cuda.max_memory_allocated() / GB}
    log(f"  {out['s_per_step']:.2f} s/step: optimise {optimise:.2f} s, {out['optimise_tokens_per_s']:.0f} trained "
        f"tokens/s ({100 * out['optimise_share']:.1f}% of the bf16 rate); generate {generate:.2f} s, "
        f"{out['sampler_tokens_per_s']:.0f} tokens/s ({100 * out['sampler_share']:.2f}%); peak "
        f"{out['peak_gb']:.1f} GB", flush=True)
    return out


#: Part 4's rows of our trainer: (name, extra GRPOConfig fields), each at v = 1 and v = 4.
SPEED_ROWS = [("ours static cache", {"cache_implementation": "static"}),
              ("ours static cache + padding-free + token budget", {"cache_implementation": "static",
                                                                   "padding_free": True, "token_budget": 8192}),
              ("ours generate", {})]
#: The name ``throughput.run_trl`` gives TRL's default row (transformers ``generate``): every ratio's baseline.
TRL_DEFAULT = "TRL transformers generate"
#: ``--all-rows`` adds transformers' continuous batching (slower than generate on an H200, 2026-11-27).
MORE_ROWS = [("ours continuous batching", {"use_transformers_continuous_batching": True})]


def speed_against_trl(model_dir: Path, work: Path, rate: float, log=print, save=lambda rows: None,
                      device: str = "cuda", workload: Workload = WORKLOAD, ours=SPEED_ROWS,
                      trl_continuous: bool = True) -> list[dict]:
    """Part 4: our rows (``SPEED_ROWS`` at v = 1 and 4) and TRL's two, each a dict of s/step, phases and shares;
    ``save(rows)`` after each row, so a call cut short keeps what it measured. ``device`` 'cpu' (with a small
    ``workload``) tries the part out without a GPU."""
    cuda = device == "cuda"
    n_params = saved_parameters(model_dir)
    rows = []

    def add(row: dict) -> None:
        rows.append(row)
        save(rows)
        phases = ", ".join(f"{k[5:]} {v:.2f}" for k, v in row.get("phases", {}).items() if v >= 0.005)
        trl = next((r["s_per_step"] for r in rows if r["name"] == TRL_DEFAULT), None)
        ratio = f"; {trl / row['s_per_step']:.2f}x TRL's default" if trl and not row["name"].startswith("TRL") else ""
        shares = (f"; sampler {row['sampler_tokens_per_s']:.0f} tok/s, update {100 * row['optimise_share']:.1f}% of "
                  "bf16" if "sampler_tokens_per_s" in row else "")
        log(f"  {row['name']}: {row['s_per_step']:.2f} s/step ({phases}); {row['gen_tokens']:.0f} generated tokens "
            f"a step{shares}{ratio}", flush=True)

    def run_trl_row(continuous: bool) -> None:
        trl, note = run_trl(model_dir, "bfloat16", work, sys.executable, steps=6, workload=workload, vllm=False,
                            device=device, continuous_batching=continuous)
        if trl is None:
            log(f"  TRL {'continuous batching' if continuous else 'default'}: {note}", flush=True)
            return
        add({"name": trl.name, "s_per_step": 1 / trl.steps_per_s, "gen_tokens": trl.gen_tokens,
             "train_tokens": trl.train_tokens})

    run_trl_row(False)  # the baseline first: a call cut short by its time limit keeps every ratio it measured
    for name, extra in ours:
        for v in (1, 4):
            shutil.rmtree(work / "runs", ignore_errors=True)
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            try:
                r = run_ours(name.replace(" ", "_") + f"_v{v}", model_dir, "transformers", v, "bfloat16",
                             work / "runs", windows=2, workload=workload, device=device, **extra)
            except Exception as exc:  # a failing row is reported and the others still run
                log(f"  {name} v={v} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            optimise, generate = r.phases["time/optimise"], r.phases["time/generate"]
            add({"name": f"{name} v={v}", "v": v, "s_per_step": 1 / r.steps_per_s, "phases": r.phases,
                 "gen_tokens": r.gen_tokens, "train_tokens": r.train_tokens,
                 "sampler_tokens_per_s": r.gen_tokens / generate,
                 "sampler_share": 2 * n_params * r.gen_tokens / generate / rate,
                 "optimise_tokens_per_s": r.train_tokens / optimise,
                 "optimise_share": 6 * n_params * r.train_tokens / optimise / rate,
                 "peak_gb": torch.cuda.max_memory_allocated() / GB if cuda else float("nan")})
    if cuda:
        torch.cuda.empty_cache()
    for continuous in (True,) if trl_continuous else ():
        run_trl_row(continuous)
    base = {r["name"]: r["s_per_step"] for r in rows if r["name"].startswith("TRL")}
    for r in rows:
        for key, trl_name in (("x_trl_default", TRL_DEFAULT),
                              ("x_trl_continuous_batching", "TRL continuous batching")):
            if trl_name in base:
                r[key] = base[trl_name] / r["s_per_step"]
    save(rows)
    log("\n| row | s/step | generate s | optimise s | sampler tok/s | sampler share | optimise share | x TRL default "
        "| x TRL continuous batching |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    for r in rows:
        ph = r.get("phases", {})
        cells = [f"{r['s_per_step']:.2f}", f"{ph.get('time/generate', float('nan')):.2f}",
                 f"{ph.get('time/optimise', float('nan')):.3f}", f"{r.get('sampler_tokens_per_s', float('nan')):.0f}",
                 f"{100 * r.get('sampler_share', float('nan')):.2f}%",
                 f"{100 * r.get('optimise_share', float('nan')):.1f}%",
                 f"{r.get('x_trl_default', float('nan')):.2f}", f"{r.get('x_trl_continuous_batching', float('nan')):.2f}"]
        log(f"| {r['name']} | " + " | ".join(cells) + " |", flush=True)
    return rows


def gpu_tests(timeout: int = 0) -> str:
    """``make test-gpu``'s tests (tests/gpu) in a child process: pytest's summary line. ``timeout`` seconds at most
    (0: no limit; all of them took about 10 minutes on an H200, 2026-11-28)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider",
                               "tests/gpu"], cwd=root, capture_output=True, text=True, timeout=timeout or None)
    except subprocess.TimeoutExpired:
        return f"stopped after {timeout} s"
    lines = [ln for ln in done.stdout.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit {done.returncode}"


def saved_parameters(model_dir: Path) -> int:
    """N of the arithmetic counts: the parameters in the model's safetensors files (tied embeddings once)."""
    import math

    from safetensors import safe_open

    total = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            total += sum(math.prod(st.get_slice(key).get_shape()) for key in st.keys())
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="0.5b", help="comma-separated: 0.5b, 1.5b")
    ap.add_argument("--work", default="/tmp/offpolicy_grpo_gpu_bench", help="model files and run directories")
    ap.add_argument("--json", default="", help="write every number here too")
    ap.add_argument("--speed", action="store_true", help="part 4 only (0.5B shape): ours against TRL 1.16")
    ap.add_argument("--check", action="store_true",
                    help="make benchmark-gpu: tests/gpu, then part 4 (ours: generate, static cache, and with packing "
                         "and a token budget; TRL's default), one table")
    ap.add_argument("--tests-timeout", type=int, default=0,
                    help="with --check: stop tests/gpu after this many seconds (default 0: no limit)")
    ap.add_argument("--all-rows", action="store_true", help="with --speed: also continuous batching, ours and TRL's")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA device (torch.cuda.is_available() is False)")
        return 2
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        print(f"--shapes: unknown {unknown}; choose from {sorted(SHAPES)}")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    work = Path(args.work)
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "shapes": {}}
    import transformers

    result["transformers"] = transformers.__version__
    rate = bf16_matmul_rate()
    result["bf16_flops"] = rate
    print(f"{result['gpu']}, torch {torch.__version__}, transformers {transformers.__version__}: bf16 matmul "
          f"{rate / 1e12:.0f} TFLOP/s (8192^3, median of 10)", flush=True)
    if args.check:
        tests = gpu_tests(args.tests_timeout)
        result["test_gpu"] = tests
        print(f"make test-gpu: {tests}", flush=True)
    if args.speed or args.check:
        model_dir = build_model(work / "qwen_0.5b", shape=QWEN05, max_positions=1024)

        def save(rows):
            result["speed"] = rows
            if args.json:
                Path(args.json).write_text(json.dumps(result, indent=1))

        speed_against_trl(model_dir, work, rate, save=save, ours=SPEED_ROWS + (MORE_ROWS if args.all_rows else []),
                          trl_continuous=args.all_rows)
        return 0
    for shape in shapes:
        t0 = time.perf_counter()
        model_dir = build_model(work / f"qwen_{shape}", shape=SHAPES[shape], max_positions=1024)
        print(f"{shape} shape: model built in {time.perf_counter() - t0:.0f} s", flush=True)
        entry = {}
        if shape == "0.5b":
            entry["memory"] = memory_against_projection(model_dir)
        shutil.rmtree(work / "runs", ignore_errors=True)
        entry["train"] = trainer_end_to_end(model_dir, work / "runs", rate)
        result["shapes"][shape] = entry
        if args.json:  # after every shape: a later one that runs out of time leaves the earlier ones written
            Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
