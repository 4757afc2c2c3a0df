"""Agents beside TRL 1.16's own trainer: the same tiny model, environments, rows and chat template, one step each,
greedy decoding; the episodes' token ids, the tool masks, the episodes as messages (TRL's completions: what reward
functions and ``--log-completions`` get), the rewards per source and TRL's two tool metrics compared.

    .venv-bench/bin/python benchmarks/trl_agents.py        # (make check-trl-agents) about 2 minutes on 2 cores

Each case uses items of TRL 1.16's environment contract (``benchmarks/trl_agent_envs.py``): a class factory, a lambda
and a ``functools.partial``, a dict of factories chosen by an ``environment`` column, an environment that owns the
data (no dataset), an observation from ``reset``, sync and async tools, ``get_reward`` and reward functions, rewards
outside [0, 1], a reward function over ``environments=``, a tool that raises, a call of a tool the row's environment lacks, a property
that must not be evaluated, standalone tools beside an environment; and the start-up refusal without any reward.

TRL's side is its ``GRPOTrainer.train()`` for one step (transformers generation with ``do_sample=False``), read
through three hooks that change nothing (the rows it drew, what ``_generate`` returned, the rewards per function)
and its logged metrics. Ours is the run's own set-up (``llm.run.trainer.setup``: the task, the agent, the sampler)
and the rollout and score stages of a step on the rows TRL drew, in its order (``AgentSampler.generate`` with greedy
decoding, ``TokenizedTask.score_rollout``, ``llm.core.diagnostics.tool_metrics``). Prints one line per case and
exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import trl_agent_envs as envs  # noqa: E402

G = 2  # completions per prompt
MAX_TOKENS = 48


def rows_of(questions, **columns) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": q}], **{k: v[i] for k, v in columns.items()}}
            for i, q in enumerate(questions)]


QUESTIONS = ["3*4=", "6*7=", "12*3=", "5*9="]

#: name -> (TRL's environment_factory, reward functions, tools, rows (None: the environment owns the data))
CASES = {
    "class factory, sync get_reward, a reward function over environments=": (
        envs.Calculator, [envs.env_reward], [], rows_of(QUESTIONS)),
    "lambda factory, observation from reset, a tool that raises, answer reward": (
        lambda: envs.Picky(), [envs.answer_reward], [], rows_of(QUESTIONS)),
    "functools.partial factory, async tool and get_reward in [-1, 2], an async reward function": (
        functools.partial(envs.AsyncCalculator), [envs.async_env_reward], [], rows_of(QUESTIONS)),
    "dict of factories by the environment column, unknown tool, None rewards": (
        {"mul": envs.Calculator, "add": envs.Adder}, [envs.env_reward], [],
        rows_of(QUESTIONS, environment=["mul", "add", "mul", "add"])),
    "the environment owns the data (no dataset)": (envs.OwnsTheData, [], [], None),
    "no get_reward, reward functions only, a standalone tool beside the environment": (
        envs.Unscored, [envs.answer_reward, envs.env_reward], [envs.multiply],
        rows_of(["7*8=", "4*4="])),
}


def trl_step(model_dir: Path, factory, reward_funcs, tools, rows, out: Path) -> dict:
    """One step of TRL's GRPOTrainer; what it drew, generated, scored and logged."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from llm.models.model import load_tokenizer

    class Probe(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            self.seen = [dict(x) for x in inputs]
            return super()._generate_and_score_completions(inputs)

        def _generate(self, prompts):
            self.generated = super()._generate(prompts)
            return self.generated

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self.per_func = rewards.detach().cpu().numpy().copy()
            return rewards


    n_rows = len(rows) if rows is not None else 2
    args = GRPOConfig(output_dir=str(out), max_steps=1, num_generations=G, per_device_train_batch_size=n_rows * G,
                      max_completion_length=MAX_TOKENS, generation_kwargs={"do_sample": False}, beta=0.0,
                      learning_rate=1e-6, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                      shuffle_dataset=False, seed=0, bf16=False, max_tool_calling_iterations=3)
    class Logged(TrainerCallback):
        seen: dict = {}

        def on_log(self, args, state, control, logs=None, **kwargs):
            Logged.seen.update(logs or {})

    tok = load_tokenizer(str(model_dir))  # the tokenizer as saved (transformers 5's AutoTokenizer drops its spaces)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = Probe(model=model, reward_funcs=list(reward_funcs), args=args, processing_class=tok,
                    train_dataset=Dataset.from_list(rows) if rows is not None else None,
                    environment_factory=factory, tools=list(tools) or None, callbacks=[Logged()])
    trainer.train()
    prompt_ids, completion_ids, tool_mask, completions = trainer.generated[:4]
    return {"rows": trainer.seen, "prompt_ids": [list(p) for p in prompt_ids],
            "completion_ids": [list(c) for c in completion_ids], "tool_mask": [list(m) for m in tool_mask],
            "messages": [list(c) for c in completions], "rewards": dict(zip(trainer.reward_func_names, trainer.per_func.T.tolist())),
            "call_frequency": float(Logged.seen["tools/call_frequency"]),
            "failure_frequency": float(Logged.seen["tools/failure_frequency"])}


def our_step(model_dir: Path, factory, reward_funcs, tools, rows, trl_rows: list[dict], tmp: Path) -> dict:
    """The rollout and score stages of one of our steps on TRL's rows, in its order, greedy."""
    from llm.config import GRPOConfig
    from llm.core.diagnostics import tool_metrics
    from llm.run.trainer import setup

    data = None
    if rows is not None:
        data = tmp / "rows.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = GRPOConfig(model_name_or_path=str(model_dir), dataset=str(data) if data else None,
                        environment_factory=factory, reward_funcs=list(reward_funcs), tools=list(tools),
                        answer_check="last_number",
                        sampler="transformers", max_completion_length=MAX_TOKENS, num_generations=G,
                        prompts_per_step=max(1, len(trl_rows) // G), exact_j=False, eval_steps=0,
                        max_tool_calling_iterations=3, output_dir=str(tmp / "run"))
    weights, task, _ = setup(config, log=lambda *a: None)
    try:
        prompts = [json.dumps(p, sort_keys=True) for p in task.task.prompts]
        idx = [prompts.index(json.dumps(r.get("prompt"), sort_keys=True)) if rows is not None else 0 for r in trl_rows]
        roll = weights.sampler.generate([task.prompt_ids[i] for i in idx], 1, MAX_TOKENS, 1.0, 0, greedy=True,
                                        rows=task.task.rows(idx))
        _, _, parts = task.score_rollout(idx, roll)
        metrics = tool_metrics(roll.tool_mask, roll.tool_calls, roll.tool_failures, roll.malformed, roll.env_failed)
        prompt_ids = roll.prompt_ids or [task.prompt_ids[i] for i in idx]
        return {"prompt_ids": [list(p) for p in prompt_ids], "completion_ids": roll.completion_ids,
                "tool_mask": roll.tool_mask, "messages": roll.messages,
                "rewards": {k: v.tolist() for k, v in parts.items()},
                "call_frequency": metrics["tools/call_frequency"],
                "failure_frequency": metrics["tools/failure_frequency"]}
    finally:
        weights.close()


def same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-6
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def compare(trl: dict, ours: dict) -> list[str]:
    """The differences, by what differs."""
    out = []
    for key in ("prompt_ids", "completion_ids", "tool_mask", "messages", "rewards", "call_frequency",
                "failure_frequency"):
        if not same(trl[key], ours[key]):
            if isinstance(trl[key], list) and isinstance(ours[key], list) and len(trl[key]) == len(ours[key]):
                j = next(j for j, (a, b) in enumerate(zip(trl[key], ours[key])) if not same(a, b))
                out.append(f"{key} of episode {j}: TRL {trl[key][j]!r} ours {ours[key][j]!r}")
            else:
                out.append(f"{key}: TRL {trl[key]!r} ours {ours[key]!r}"[:600])
    return out


def refusals(model_dir: Path) -> list[str]:
    """No reward source at all: TRL and ours both refuse at start-up."""
    from llm.config import GRPOConfig
    from llm.run.trainer import setup

    problems = []
    try:
        trl_step(model_dir, envs.Unscored, [], [], rows_of(QUESTIONS), Path(tempfile.mkdtemp()))
        problems.append("TRL did not refuse an environment without any reward")
    except ValueError as exc:
        if "No reward source" not in str(exc):
            problems.append(f"TRL refused otherwise: {exc}")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "rows.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows_of(QUESTIONS)))
        try:
            setup(GRPOConfig(model_name_or_path=str(model_dir), dataset=str(data), environment_factory=envs.Unscored,
                             sampler="transformers", output_dir=str(Path(tmp) / "run")), log=lambda *a: None)
            problems.append("ours did not refuse an environment without any reward")
        except ValueError as exc:
            if "no reward source" not in str(exc):
                problems.append(f"ours refused otherwise: {exc}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    import trl

    from llm.models.tiny import agent_model_dir

    torch.set_num_threads(2)
    model_dir = agent_model_dir()
    print(f"TRL {trl.__version__} against this package, the built-in agent model, G = {G}, greedy, "
          f"max_completion_length {MAX_TOKENS}, max_tool_calling_iterations 3")
    failed = 0
    for name, (factory, reward_funcs, tools, rows) in CASES.items():
        if args.only and args.only not in name:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            trl_out = trl_step(model_dir, factory, reward_funcs, tools, rows, Path(tmp) / "trl")
            ours = our_step(model_dir, factory, reward_funcs, tools, rows, trl_out["rows"], Path(tmp))
        diffs = compare(trl_out, ours)
        failed += bool(diffs)
        calls = trl_out["call_frequency"]
        print(f"{'same' if not diffs else 'DIFFERENT'}: {name} ({len(trl_out['completion_ids'])} episodes, "
              f"{calls:g} calls per episode, failure frequency {trl_out['failure_frequency']:g}, reward sources "
              f"{', '.join(trl_out['rewards'])})")
        for d in diffs:
            print("   ", d)
    for problem in refusals(model_dir) if not args.only else []:
        failed += 1
        print("DIFFERENT:", problem)
    if not args.only:
        print("same: no reward source at all is refused at start-up by both" if failed == 0 else "")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
