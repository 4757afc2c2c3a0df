"""Where the memory of the in-process vLLM sampler goes, on SmolLM2-135M-Instruct: ``python benchmarks/sampler_memory.py``
(``make benchmark-memory`` runs it after ``benchmarks/memory.py``; about 5 minutes).

Two parts, each in a fresh process so that one's memory does not hide in the other's:

1. **The engine, stage by stage** (resident set size after each): the policy loaded, then read once (its weights are
   mapped from the safetensors file and become resident at their first read, which in the trainer is the first
   forward pass; without this stage the first sync reads them and seems to cost their size); a vLLM engine started with
   the trainer's settings for a window (``llm.sampling.vllm_settings``: v = 4 x (8 + 4 held-out) prompts x G = 8,
   completions of up to 24 tokens); the first window generated; the first weight sync; a second window and sync.
2. **Two training steps of llm.train** with ``--sampler vllm`` and ``--sampler transformers`` (the real-model
   settings of ``make run-real``, evaluation off): the peak resident set size of each process (``ru_maxrss``), at
   the defaults (freed memory kept in the process) and with ``--no-keep-freed-memory``.

Prints a table for each part; numbers are bytes as the kernel counts them (shared libraries included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WINDOW = dict(prompts=8, heldout=4, G=8, v=4, max_tokens=24)
REAL = ["--dataset", "reasoning_gym:basic_arithmetic", "--generator-kwargs", "min_terms=2", "max_terms=2",
        "min_digits=1", "max_digits=1", "--chat-template", "--temperature", "0.7", "--max-completion-length", "24",
        "--prompts-per-step", "8", "--sync-period", "4", "--heldout-prompts", "4", "--learning-rate", "1e-5",
        "--beta", "0", "--max-steps", "2", "--no-progress", "--save-steps", "0"]


def rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def stages(model_dir: str) -> None:
    """Part 1, in this process: resident memory after each stage, as JSON lines."""
    import torch

    from llm.models.model import load_policy
    from llm.sampling.vllm_engine import VLLMSampler
    from llm.sampling.vllm_settings import cpu_engine_args

    def mark(stage, **extra):
        print(json.dumps({"stage": stage, "rss_gb": round(rss_gb(), 3), **extra}), flush=True)

    mark("python with torch")
    policy, tok = load_policy(model_dir, torch.device("cpu"))
    mark("policy loaded", weights_gb=round(sum(p.numel() * 4 for p in policy.parameters()) / 2**30, 3))
    with torch.no_grad():  # the weights are mapped from the safetensors file: resident once read (the first forward)
        sum(float(p.sum()) for p in policy.parameters())
    mark("policy read once")
    w = WINDOW
    sequences = w["v"] * (w["prompts"] + w["heldout"]) * w["G"]
    prompt = tok.apply_chat_template([{"role": "user", "content": "Calculate 3 + 4.\nReply with the final answer "
                                                                   "only."}], add_generation_prompt=True)
    prompt = prompt if isinstance(prompt, list) else prompt["input_ids"]
    prompts = [prompt[:-3] + tok(str(i)).input_ids + prompt[-3:] for i in range(sequences // w["G"])]
    longest = max(map(len, prompts))
    max_len = longest + w["max_tokens"]  # as the trainer's llm.sampling.max_model_len
    args = cpu_engine_args(policy.config, "float32", max_len, sequences, w["G"], longest)
    sampler = VLLMSampler(model_dir, dtype="float32", seed=0, max_model_len=max_len, eos_token_id=tok.eos_token_id,
                          model_config=policy.config, sequences=sequences, group=w["G"], prompt_tokens=longest)
    mark("vLLM engine started", kv_cache_gb=round(args["kv_cache_memory_bytes"] / 2**30, 3), max_model_len=max_len)
    for k in range(2):
        sampler.generate(prompts, w["G"], w["max_tokens"], 0.7, k)
        mark(f"window {k + 1} generated")
        sampler.load_weights(policy)
        mark(f"sync {k + 1}", sync_gb=round(sampler.last_sync_bytes / 2**30, 3))


def peak_of_a_run(model_dir: str, sampler: str, extra: tuple[str, ...] = ()) -> float:
    """Part 2: the peak resident set size (GiB) of two steps of llm.train in a child process."""
    with tempfile.TemporaryDirectory() as out:
        code = ("import resource, runpy, sys; sys.argv = sys.argv[1:]\n"
                "try:\n    runpy.run_module('llm.train', run_name='__main__')\n"
                "except SystemExit:\n    pass\n"
                "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
        res = subprocess.run([sys.executable, "-c", code, "llm.train", "--model-name-or-path", model_dir, *REAL,
                              "--sampler", sampler, *extra, "--output-dir", out], cwd=ROOT, capture_output=True, text=True)
        peaks = [line for line in res.stdout.splitlines() if line.startswith("PEAK")]
        if res.returncode != 0 or not peaks:
            raise SystemExit(f"llm.train --sampler {sampler} failed: {res.stderr[-2000:]}")
        return int(peaks[-1].split()[1]) / 2**20  # ru_maxrss is in KiB on Linux


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", action="store_true", help=argparse.SUPPRESS)  # part 1's own process
    args = ap.parse_args()
    from llm.models.pretrained import smollm2_dir

    model_dir = str(smollm2_dir())
    if args.stages:
        stages(model_dir)
        return 0
    print(f"SmolLM2-135M-Instruct ({model_dir}), float32, {os.cpu_count()} cores")
    print("\n1. the in-process engine, stage by stage (resident set size, GiB)")
    res = subprocess.run([sys.executable, __file__, "--stages"], capture_output=True, text=True, cwd=ROOT)
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    if res.returncode != 0 or not rows:
        raise SystemExit(res.stderr[-2000:])
    prev = None
    print(f"  {'stage':<24}{'RSS':>8}{'added':>8}  notes")
    for r in rows:
        notes = ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("stage", "rss_gb"))
        added = "" if prev is None else f"{r['rss_gb'] - prev:+.2f}"
        print(f"  {r['stage']:<24}{r['rss_gb']:>8.2f}{added:>8}  {notes}")
        prev = r["rss_gb"]
    print("\n2. peak resident set size of two steps of llm.train (make run-real's settings), GiB")
    print(f"  {'':<24}{'default':>10}{'--no-keep-freed-memory':>24}")
    peaks = {(s, keep): peak_of_a_run(model_dir, s, () if keep else ("--no-keep-freed-memory",))
             for s in ("transformers", "vllm") for keep in (True, False)}
    for s in ("transformers", "vllm"):
        print(f"  --sampler {s:<14}{peaks[s, True]:>10.2f}{peaks[s, False]:>24.2f}")
    gap = {keep: peaks["vllm", keep] - peaks["transformers", keep] for keep in (True, False)}
    print(f"  {'vllm - transformers':<24}{gap[True]:>+10.2f}{gap[False]:>+24.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
