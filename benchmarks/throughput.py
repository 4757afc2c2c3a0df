"""Throughput benchmark, everything measured side by side in one run: ``make benchmark``.

Prints one table: our trainer with the in-process vLLM engine at v = 1, 4, 10 (v = 1 and 10 also with the
diagnostics on, '+diag'), with vLLM's server in its own process at v = 1, 4, 10, with the transformers
sampler, and TRL's GRPOTrainer, on the same locally built ~19M-parameter Qwen2 (character tokenizer, random
weights), the built-in arithmetic prompts, G = 16, 4 prompts per step (64 completions), completions of up to
64 tokens, one optimiser step per batch, beta = 0, float32 (``--dtype bfloat16`` for the bf16 variant).

Columns: steps/s; the trainer's own ``time/<phase>`` metrics (mean seconds per step; ``time/sync`` includes
the v - 1 steps without a sync); the end-to-end efficiency = the step's unavoidable arithmetic (2N FLOPs per
generated token, 6N per trained token) / (seconds per step x the matmul rate of the same dtype measured in this
run); the ratio to TRL's steps/s at the same dtype, and to TRL's with glibc keeping freed memory as our trainer
does (``KEEP_FREED_ENV``). Then a step-time model t(v) = per-step work + sync/v fitted
at v = 1, which predicts the v = 10 speed-up here and, fed with the paper's 7B timings, the sync cost those
timings imply.

Steps are timed over whole sync windows after a warm-up window (vLLM's first call compiles), so
window-batched generation is charged in full. TRL runs in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: The 19M-parameter benchmark model (hidden 512, 6 layers, MLP 1408): N ≈ 19.3M.
BENCH_SPEC = dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8,
                  intermediate_size=1408, max_position_embeddings=128)
PROMPTS, G, MAX_TOKENS = 4, 16, 64
#: The paper's colocated 7B measurement (Qwen2.5-7B, TP 4): iterations per second at v = 1 and v = 10.
PAPER_ITS = {1: 0.02828, 10: 0.03828}


@dataclass(frozen=True)
class Workload:
    """What a benchmark step does, the same for ours and TRL's: ``prompts`` x ``generations`` completions of up to
    ``max_tokens`` tokens from prompts of ``prompt_tokens`` tokens on average (for the arithmetic count), the
    task as further GRPOConfig fields (``config``), and TRL's copy of it: the same prompts as text, their answers
    and a reward of ``llm.tasks`` or ``llm.rewards.functions`` (``trl_reward``: a function name there)."""

    prompts: int = PROMPTS
    generations: int = G
    max_tokens: int = MAX_TOKENS
    prompt_tokens: float = 5.0  # the arithmetic prompts are 4-5 characters
    temperature: float = 1.0
    config: dict = field(default_factory=dict)
    trl_prompts: tuple = ()
    trl_answers: tuple = ()
    prompt_ids: tuple = ()  # the prompts as our trainer tokenises them (the real model's workload)
    trl_reward: str = "exact_match_reward"

    def trl_spec(self) -> dict:
        if self.trl_prompts:
            prompts, answers = list(self.trl_prompts), list(self.trl_answers)
        else:  # the built-in task's prompts, four times over
            from llm.tasks import arithmetic_task

            task = arithmetic_task()
            prompts, answers = list(task.prompts) * 4, list(task.answers) * 4
        return {"prompts": prompts, "answers": answers, "reward": self.trl_reward, "batch": self.prompts
                * self.generations, "generations": self.generations, "max_tokens": self.max_tokens,
                "temperature": self.temperature}


#: The benchmark model's workload: the built-in arithmetic prompts, 4 prompts x G = 16, up to 64 tokens.
BENCH = Workload()


def build_bench_model(path: Path, dtype: str = "float32") -> Path:
    if (path / "config.json").is_file():
        return path
    from llm.models.tiny import TinySpec, build_model, build_tokenizer

    tok = build_tokenizer()
    model = build_model(TinySpec(**{k: v for k, v in BENCH_SPEC.items()}), len(tok))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def count_parameters(model_dir: Path) -> int:
    """N of the arithmetic counts: the parameters of the model saved in ``model_dir``."""
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())


def matmul_flops(dtype: torch.dtype, n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def cpu_description() -> str:
    """The CPU model and its widest vector extensions (bf16 speed depends on them)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "unknown")
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []))
    ext = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model} ({', '.join(ext) or 'no AVX2'})"


#: The trainer's timed phases (``llm.run.trainer.PHASES``) shown as columns, under the trainer's own metric names.
SHOWN_PHASES = ("sync", "generate", "score", "behaviour", "optimise", "diagnostics")


@dataclass
class Row:
    """One configuration: steps/s over the timed steps, the mean seconds per step of each trainer phase
    (``time/<phase>``, the trainer's metric names), and the tokens of a step (generated; trained = prompt +
    completion tokens, padding excluded)."""

    name: str
    steps_per_s: float
    gen_tokens: float
    train_tokens: float
    phases: dict = field(default_factory=dict)
    sync_seconds: float = float("nan")  # seconds per weight sync (not per step)
    sync_mb_per_s: float = float("nan")
    v: int = 1
    diagnostics: bool = False
    lag0_logp_gap: float = float("nan")  # median over lag-0 steps of sampling/logp_diff_max (worst token)
    lag0_tv: float = float("nan")  # median over lag-0 steps of tv/pi_k_alpha: the sampler-trainer noise floor
    sampler_tokens_per_s: float = float("nan")  # every token the sampler generated (held-out prompts too) / its time
    note: str = ""

    @property
    def gen_tokens_per_s(self) -> float:
        t = self.phases.get("time/generate")
        return self.gen_tokens / t if t else float("nan")


def run_child(code: str, *args: str, what: str) -> dict:
    """``code`` in a fresh Python process (``sys.argv[1:]`` = ``args``, run from the checkout), which prints one line
    ``RESULT <json>``: that object. A process that fails or prints none ends the benchmark naming ``what``."""
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if res.returncode != 0 or not line:
        raise SystemExit(f"{what} failed: {res.stderr[-1500:]}")
    return json.loads(line[0][len("RESULT "):])


def cell(value: float, spec: str) -> str:
    """A table cell: the value formatted, or empty when it was not measured (NaN)."""
    return "" if value != value else format(value, spec)


def step_flops(n_params: int, gen_tokens: float, train_tokens: float) -> float:
    """The arithmetic a GRPO step cannot avoid: 2N FLOPs per generated token (one forward while sampling) and 6N
    per trained token (forward and backward of the policy), N = the model's parameters. Diagnostics, the sync and
    any second forward are not counted: they are what an efficiency below 100% pays for."""
    return 2 * n_params * gen_tokens + 6 * n_params * train_tokens


def run_ours(name: str, model_dir: Path, sampler: str, v: int, dtype: str, out: Path, windows: int = 0,
             server_url: str = "", diagnostics: bool = False, attn: str = "auto", workload: Workload = BENCH,
             **extra) -> Row:
    """Run our trainer for ``windows`` sync windows (at least 4 steps each); time all but the first.
    ``diagnostics``: the chain-rule TV and in-sample bound estimates on (``tv_diagnostics``,
    ``insample_diagnostics``); off, the step does what TRL's does (exact J is off in both: real tasks lack it).
    ``extra``: further GRPOConfig fields (e.g. ``async_generation``, ``num_threads``, ``verify_sync``)."""
    from llm import GRPOConfig, train
    from llm.run.rundir import read_metrics

    import shutil

    per_window = max(v, 4 if v == 1 else v)
    windows = windows or (2 if v >= 10 else 3)  # at least 8 timed steps after the warm-up window
    steps = per_window * windows
    cfg = GRPOConfig(model_name_or_path=str(model_dir), output_dir=str(out / name.replace(" ", "_")),
                     sampler=sampler, sync_period=v, max_steps=steps, prompts_per_step=workload.prompts,
                     num_generations=workload.generations, max_completion_length=workload.max_tokens,
                     temperature=workload.temperature, beta=0.0, tv_diagnostics=diagnostics,
                     insample_diagnostics=diagnostics, dtype=dtype, progress=False, save_steps=0, learning_rate=1e-5,
                     server_url=server_url, attn_implementation=attn,
                     # a random model earns no reward: without the mask every step still does the full
                     # forward/backward (zero advantages), as TRL does, so the work compared is equal
                     mask_zero_std_groups=False, exact_j=False, **{**workload.config, **extra})
    shutil.rmtree(cfg.output_dir, ignore_errors=True)  # a fresh run, never a resumed one
    train(cfg, log=lambda *a: None)
    rows = read_metrics(cfg.output_dir)[per_window:]
    from llm.tensors.metrics import PHASE_KEYS

    keys = list(PHASE_KEYS)
    phases = {k: sum(r.get(k, 0.0) for r in rows) / len(rows) for k in keys}
    wall = sum(phases.values())
    completions = workload.prompts * workload.generations
    gen_tok = statistics.mean(r["completions/mean_length"] for r in rows) * completions
    prompt_tok = workload.prompt_tokens * completions
    syncs = [r for r in read_metrics(cfg.output_dir) if "sync/mb" in r]  # every sync after the first step
    sync_s = statistics.median(r["time/sync"] for r in syncs) if syncs else float("nan")
    sync_rate = statistics.median(r["time/sync_mb_per_s"] for r in syncs) if syncs else float("nan")
    lag0 = [r for r in read_metrics(cfg.output_dir) if r["lag"] == 0 and "sampling/logp_diff_max" in r]
    gap = statistics.median(r["sampling/logp_diff_max"] for r in lag0) if lag0 else float("nan")
    tv0 = statistics.median(r["tv/pi_k_alpha"] for r in lag0) if lag0 else float("nan")
    calls = [r for r in rows if r.get("sampling/call_tokens")]
    call_seconds = sum(r["sampling/call_tokens"] / r["time/sampler_tokens_per_s"] for r in calls)
    sampler_rate = sum(r["sampling/call_tokens"] for r in calls) / call_seconds if calls else float("nan")
    return Row(name, 1 / wall, gen_tok, gen_tok + prompt_tok, phases, sync_s, sync_rate, v, diagnostics, gap, tv0,
               sampler_tokens_per_s=sampler_rate)


TRL_SCRIPT = r'''
import json, sys, time, os
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
model_dir, out, use_vllm, dtype, steps = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4], int(sys.argv[5])
sys.path.insert(0, sys.argv[6])
attn = sys.argv[7]
spec = json.loads(open(sys.argv[8]).read())
on_cuda, continuous = sys.argv[9] == "cuda", sys.argv[10] == "1"
import llm.rewards.functions, llm.tasks
score = getattr(llm.tasks, spec["reward"], None) or getattr(llm.rewards.functions, spec["reward"])
ds = Dataset.from_dict({"prompt": spec["prompts"], "answer": spec["answers"]})
def reward(completions, answer, **kw):
    return [float(score(c, a)) for c, a in zip(completions, answer)]
times = []
class Clock(TrainerCallback):
    def on_step_begin(self, args, state, control, **kw): self.t = time.perf_counter()
    def on_step_end(self, args, state, control, **kw): times.append(time.perf_counter() - self.t)
lengths = []
class Len(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "completions/mean_length" in logs: lengths.append(logs["completions/mean_length"])
cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=spec["batch"], num_generations=spec["generations"],
                 max_completion_length=spec["max_tokens"], beta=0.0, num_iterations=1, learning_rate=1e-5,
                 max_steps=steps, logging_steps=1, report_to=[], save_strategy="no", use_cpu=not on_cuda,
                 use_transformers_continuous_batching=continuous,
                 bf16=dtype == "bfloat16", use_vllm=use_vllm, vllm_mode="colocate", temperature=spec["temperature"],
                 top_k=0, top_p=1.0, dataloader_num_workers=0, shuffle_dataset=False,
                 model_init_kwargs=None if attn == "auto" else {"attn_implementation": attn})
trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=cfg, train_dataset=ds, callbacks=[Clock(), Len()])
trainer.train()
print("RESULT " + json.dumps({"times": times, "lengths": lengths}))
'''


#: glibc's environment for a process that keeps freed memory as our trainer does (``keep_freed_memory``): TRL's
#: process gets it for the row that asks how much of a speed-up is the allocator's.
KEEP_FREED_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "2147483647"}
#: The name suffix of that row.
KEPT = ", freed memory kept"


def run_trl(model_dir: Path, dtype: str, out: Path, python: str, steps: int = 5,
            attn: str = "auto", workload: Workload = BENCH, vllm: bool = True,
            keep_freed_memory: bool = False, device: str = "cpu",
            continuous_batching: bool = False) -> tuple[Row | None, str]:
    """TRL's GRPOTrainer on ``workload`` in ``python``'s environment: first with its vLLM colocate mode (``vllm``),
    then generating with transformers (``continuous_batching``: TRL's use_transformers_continuous_batching); steps
    2.. are timed (the first includes start-up). ``keep_freed_memory``: glibc set as our trainer sets it
    (``KEEP_FREED_ENV``; the row's name ends with ``KEPT``). ``device``: 'cuda' runs TRL on the GPU."""
    script, spec = out / "trl_bench.py", out / "trl_workload.json"
    script.write_text(TRL_SCRIPT)
    spec.write_text(json.dumps(workload.trl_spec()))
    notes = []
    for use_vllm in (True, False) if vllm else (False,):
        mode = ("TRL vLLM colocate" if use_vllm else "TRL continuous batching" if continuous_batching
                else "TRL transformers generate")
        env = {**os.environ, **(KEEP_FREED_ENV if keep_freed_memory else {})}
        res = subprocess.run([python, str(script), str(model_dir), str(out / "trl"), "1" if use_vllm else "0",
                              dtype, str(steps), str(ROOT), attn, str(spec), device,
                              "1" if continuous_batching else "0"], capture_output=True, text=True, timeout=3600,
                             env=env)
        line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
        if res.returncode != 0 or not line:
            err = [ln.strip() for ln in (res.stderr or "").splitlines() if "Error" in ln or "error:" in ln]
            notes.append(f"{mode} failed: {err[-1][:200] if err else 'exit code ' + str(res.returncode)}")
            continue
        data = json.loads(line[0][7:])
        t = data["times"][1:]  # the first step includes start-up
        mean_len = statistics.mean(data["lengths"]) if data["lengths"] else float("nan")
        sec = statistics.mean(t)
        completions = workload.prompts * workload.generations
        gen_tok = mean_len * completions
        row = Row(mode + (KEPT if keep_freed_memory else ""), 1 / sec, gen_tok,
                  gen_tok + workload.prompt_tokens * completions, note="; ".join(notes))
        return row, "; ".join(notes)
    return None, "; ".join(notes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--trl-python", default=str(ROOT / ".venv-bench" / "bin" / "python"),
                    help="Python of an environment with TRL installed ('' skips TRL)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "benchmark"))
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--skip-server", action="store_true", help="skip the rows with vLLM's server in its own process")
    ap.add_argument("--skip-inprocess", action="store_true", help="skip the rows with the in-process vLLM engine")
    ap.add_argument("--attn-implementation", choices=["auto", "sdpa", "eager"], default=None,
                    help="the trainers' attention kernel, the same for ours and TRL's (default: eager for bfloat16, "
                         "whose sdpa backward is slow on CPUs, auto for float32)")
    args = ap.parse_args()
    attn = args.attn_implementation or ("eager" if args.dtype == "bfloat16" else "auto")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from llm.models.tiny import cache_root

    model_dir = build_bench_model(cache_root() / "bench-qwen2-19m")
    n_params = count_parameters(model_dir)
    print(f"model: Qwen2, {n_params / 1e6:.1f}M parameters; {PROMPTS} prompts x G={G}, <= {MAX_TOKENS} tokens, "
          f"{args.dtype}, attention {attn} (ours and TRL), torch threads {torch.get_num_threads()}", flush=True)
    dt = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    rates = [matmul_flops(dt, reps=3 if dt == torch.bfloat16 else 10)]  # again at the end; the larger one is used

    rows: list[Row] = []

    def done(row: Row) -> None:
        rows.append(row)
        print(f"  done: {row.name}: {row.steps_per_s:.3f} steps/s", flush=True)

    if not args.skip_inprocess:
        for v, diag in ((1, False), (1, True), (4, False), (10, False), (10, True)):
            done(run_ours(f"ours vLLM v={v}" + (" +diag" if diag else ""), model_dir, "vllm", v, args.dtype, out,
                          diagnostics=diag, attn=attn))
    if not args.skip_server:
        from llm.sampling.launch import ServeConfig, ServerProcess

        print("  starting vLLM's server for the benchmark model (python -m llm serve)", flush=True)
        with ServerProcess(ServeConfig(model=str(model_dir), port=0, dtype=args.dtype, max_model_len=128),
                           log=lambda *a: None, log_file=out / "server.log") as server:
            for v in (1, 4, 10):
                done(run_ours(f"ours server v={v}", model_dir, "server", v, args.dtype, out, server_url=server.url,
                              attn=attn))
    if not args.skip_transformers:
        done(run_ours("ours transformers v=1", model_dir, "transformers", 1, args.dtype, out, windows=2, attn=attn))
    trl_note = "TRL skipped"
    if args.trl_python and Path(args.trl_python).exists():
        for kept in (False, True):  # the second: glibc keeping freed memory, as our trainer's keep_freed_memory
            trl, note = run_trl(model_dir, args.dtype, out, args.trl_python, attn=attn, vllm=not kept,
                                keep_freed_memory=kept)
            trl_note = note if not kept else trl_note
            if trl is not None:
                done(trl)
    rates.append(matmul_flops(dt, reps=3 if dt == torch.bfloat16 else 10))
    peak = max(rates)
    trl = next((r for r in rows if r.name.startswith("TRL") and not r.name.endswith(KEPT)), None)
    trl_kept = next((r for r in rows if r.name.endswith(KEPT)), None)

    print(f"\nCPU: {cpu_description()}; {args.dtype} matmul rate measured in this run (2048x2048, median): "
          f"{rates[0] / 1e9:.0f} GFLOP/s before the runs, {rates[1] / 1e9:.0f} after; efficiency uses "
          f"{peak / 1e9:.0f}\n")
    cols = [f"time/{p}" for p in SHOWN_PHASES]
    print(f"| {'configuration':<24} | steps/s | s/step | " + " | ".join(cols)
          + f" | gen tok/s | end-to-end eff. | x TRL | x TRL{KEPT} | s per sync | sync MB/s | lag-0 logp gap | "
          "lag-0 TV |")
    print("|" + "---|" * (len(cols) + 11))
    for r in rows:
        eff = step_flops(n_params, r.gen_tokens, r.train_tokens) * r.steps_per_s / peak
        vs_trl = r.steps_per_s / trl.steps_per_s if trl is not None else float("nan")
        vs_kept = r.steps_per_s / trl_kept.steps_per_s if trl_kept is not None else float("nan")
        times = " | ".join(f"{r.phases[c]:.3f}" if c in r.phases else "" for c in cols)
        print(f"| {r.name:<24} | {r.steps_per_s:7.3f} | {1 / r.steps_per_s:6.2f} | {times} | "
              f"{cell(r.gen_tokens_per_s, '9.0f')} | {eff:15.0%} | {cell(vs_trl, '5.2f')} | {cell(vs_kept, '5.2f')} | "
              f"{cell(r.sync_seconds, '10.3f')} | {cell(r.sync_mb_per_s, '9.0f')} | {cell(r.lag0_logp_gap, '14.2g')} | "
              f"{cell(r.lag0_tv, '8.2g')} |")
    (out / "results.json").write_text(json.dumps(
        {"dtype": args.dtype, "n_params": n_params, "matmul_flops": rates, "rows": [asdict(r) for r in rows]}, indent=1))
    print("\nend-to-end eff. = (2N x generated + 6N x trained tokens of a step) / (s per step x the matmul rate); "
          f"x TRL = steps/s over TRL's at the same dtype (x TRL{KEPT}: over TRL's with glibc keeping freed memory, "
          "as our trainer does). '+diag': the TV and in-sample bound estimates on. "
          "lag-0 logp gap / TV: medians over the steps right after a sync of the worst token's |log alpha (sampler) - "
          "log pi_k (trainer)| and of tv/pi_k_alpha, which is then 0 up to rounding: the precision's noise floor.")
    print(f"TRL: {trl_note or 'ran'}")
    by = {r.name: r for r in rows}
    if "ours server v=1" in by and "ours vLLM v=1" in by:
        print()
        for v in (1, 4, 10):
            a, b = by[f"ours server v={v}"], by[f"ours vLLM v={v}"]
            print(f"ratio ours server v={v} / ours vLLM v={v} (steps/s): {a.steps_per_s / b.steps_per_s:.2f}x; "
                  f"sync {a.sync_seconds:.3f} s vs {b.sync_seconds:.3f} s")
    if "ours server v=1" in by:
        server_step_model(by)
    if "ours vLLM v=1" in by:
        step_model(by)
    return 0


def per_step(row: Row) -> float:
    """Seconds of a step that do not depend on v (everything but the sync)."""
    return sum(row.phases.values()) - row.phases.get("time/sync", 0.0)


def step_model(by: dict[str, Row]) -> None:
    """Step-time model t(v) = per-step work + sync/v, fitted at v = 1, against the measured v = 10 speed-up."""
    base, ten = by["ours vLLM v=1"], by["ours vLLM v=10"]
    work, sync = per_step(base), base.sync_seconds
    meas = ten.steps_per_s / base.steps_per_s
    print(f"\nstep-time model t(v) = {work:.3f} + {sync:.3f}/v s (fitted at v=1; per-step work + the median sync)")
    print(f"  from fewer syncs alone: predicted v=10 speed-up {(work + sync) / (work + sync / 10):.3f}x; measured "
          f"{meas:.3f}x")
    g1, g10 = base.phases["time/generate"], ten.phases["time/generate"]
    pred_w = (work + sync) / (work - g1 + g10 + sync / 10)
    print(f"  with the measured window-batched generation at v=10 ({g10:.3f} s/step vs {g1:.3f}): predicted "
          f"{pred_w:.3f}x; measured {meas:.3f}x")
    t1, t10 = 1 / PAPER_ITS[1], 1 / PAPER_ITS[10]
    s_paper = (t1 - t10) / (1 - 1 / 10)
    print(f"  paper 7B (TP 4): {t1:.1f} s/step at v=1, {t10:.1f} at v=10 ({PAPER_ITS[10] / PAPER_ITS[1]:.2f}x): "
          f"the model implies a sync cost of {s_paper:.1f} s per sync = {s_paper / t1:.0%} of a v=1 step; here "
          f"the sync is {sync / (work + sync):.1%} of a v=1 step")


def server_step_model(by: dict[str, Row]) -> None:
    """The step-time model fed with the measured over-the-wire sync: t(v) = per-step work + sync/v."""
    base = by["ours server v=1"]
    work, sync = per_step(base), base.sync_seconds
    print(f"\nserver step-time model t(v) = {work:.3f} + {sync:.3f}/v s (fitted at v=1; the sync measured over the "
          f"wire: {sync:.3f} s at {base.sync_mb_per_s:.0f} MB/s)")
    for v in (4, 10):
        pred = (work + sync) / (work + sync / v)
        meas = by[f"ours server v={v}"].steps_per_s / base.steps_per_s
        print(f"  v={v}: predicted speed-up from fewer syncs {pred:.3f}x; measured {meas:.3f}x "
              "(the measurement adds window-batched generation)")
    for ratio in (0.1, 1.0):
        s_big = ratio * work
        print(f"  a sync costing {ratio:g} x the per-step work (a large model over a slow link) would make v=10 "
              f"{(work + s_big) / (work + s_big / 10):.2f}x faster than v=1")


if __name__ == "__main__":
    raise SystemExit(main())
