"""A TRL 1.16 GRPO script as a TRL user writes it, with this project's readings added by two lines (marked below).

    .venv/bin/python examples/trl_watch.py                     # the built-in tiny model and arithmetic task, ~1 minute
    .venv/bin/python examples/trl_watch.py --model "$(.venv/bin/python -m llm pretrained smollm2)" --max-steps 8

Each generation is trained over steps_per_generation x num_iterations optimiser steps, so most steps train on
completions drawn by an older policy (lag 1, 2, 3): the log shows TV(pi_k, alpha), its standard error and the
effective sample size at every step, the held-out improvement with its certificate, and at the end the readings by
lag (docs/integrations.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import tyro
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from llm.integrations.trl import watch  # (1) this project's readings


@dataclass
class Args:
    model: str = ""
    """A model directory or hub name; empty: the built-in tiny model (llm.models.tiny)."""
    max_steps: int = 16
    steps_per_generation: int = 2
    num_iterations: int = 2
    learning_rate: float = 3e-4
    heldout_prompts: int = 8
    bf16: bool | None = None
    """TRL's bf16 (autocast of the trainer's forward); None: TRL's default (True)."""
    output_dir: str = "runs/trl_watch"


def reward(completions, answer, **kwargs):
    """1 when the completion's last number is the answer, else 0: rewards in [0, 1]."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    last = [re.findall(r"-?\d+", t) for t in texts]
    return [1.0 if n and n[-1] == a else 0.0 for n, a in zip(last, answer)]


def main(args: Args) -> None:
    from llm.tasks import arithmetic_task

    task = arithmetic_task()
    if args.model:
        model = args.model
        prompts = [[{"role": "user", "content": f"{p} Reply with the number only."}] for p in task.prompts]
    else:
        from llm.models.tiny import tiny_model_dir

        model, prompts = str(tiny_model_dir()), list(task.prompts)
    dataset = Dataset.from_dict({"prompt": prompts, "answer": list(task.answers)})
    config = GRPOConfig(output_dir=args.output_dir, max_steps=args.max_steps, learning_rate=args.learning_rate,
                        num_generations=8, per_device_train_batch_size=32,
                        steps_per_generation=args.steps_per_generation, num_iterations=args.num_iterations,
                        max_completion_length=8 if not args.model else 24, beta=0.0, logging_steps=1,
                        report_to="none", save_strategy="no", use_cpu=True, seed=0,
                        **({} if args.bf16 is None else {"bf16": args.bf16}))
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset)
    watch(trainer, reward_range=(0, 1), heldout_prompts=args.heldout_prompts)  # (2) the readings, into TRL's logs
    trainer.train()


if __name__ == "__main__":
    main(tyro.cli(Args))
