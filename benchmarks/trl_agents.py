"""Agents beside TRL 1.16's own trainer, over several steps: our trainer (``llm.train``'s ``train()``, its default
sampler) and TRL's ``GRPOTrainer.train()`` on the same tiny model, environments and rows, step by step.

    .venv-bench/bin/python benchmarks/trl_agents.py        # (make check-trl-agents) about 8 minutes on 2 cores

Each case uses items of TRL 1.16's environment contract (``benchmarks/trl_agent_envs.py``): a class factory, a lambda
and a ``functools.partial``, a dict of factories chosen by an ``environment`` column, an environment that owns the
data and draws its next question from a stream seeded in ``__init__`` (TRL pools instances and resets them again), an
observation from ``reset`` taken from a column other than the prompt (every row's prompt is the same), a ``reward``
attribute read back by a reward function (TRL's OpenEnv pattern), a ``get_reward`` that returns nan where it does not
apply, sync and async tools, rewards outside [0, 1], a reward function over ``environments=``, a tool that raises, a
call of a tool the row's environment lacks, a property that must not be evaluated, a standalone tool beside an
environment; and the start-up refusal without any reward.

Ours runs first: ``train()`` for ``STEPS`` steps (the in-process vLLM sampler at temperature 0.01, learning rate 1e-9,
``--log-completions``), observed by a wrapper around the agent sampler's ``generate`` that records what it was given
and returned and changes nothing. TRL then trains for as many steps on the rows our trainer drew, in its order
(``shuffle_dataset=False``, greedy transformers generation, learning rate 1e-9), observed by four overrides that call
TRL's own methods and keep what they return. Compared at every step, rows matched on every column (with no dataset:
all episodes together): the prompt each episode was shown (reset's observation appended), the tools offered with their
JSON schemas, the prompt and episode token ids, the tool masks, the episodes as messages, each reward source's value
and the total (ours: completions.jsonl and metrics.jsonl; TRL's: its per-source rewards, their sum under its
``reward_weights`` with nan as "does not apply", and its logged ``reward``), and TRL's two tool metrics. Episodes of
one row are compared as a set (which pooled instance serves which episode is each trainer's own). Each case runs in
its own process; one line per case, the questions reset drew at every step where the environment owns the data, and
exit 1 on any difference.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import os
import subprocess
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
P = 3  # prompts per step
STEPS = 3
MAX_TOKENS = 48
LEARNING_RATE = 1e-9  # both trainers update, by too little to change a greedy token


def rows_of(questions, **columns) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": q}], **{k: v[i] for k, v in columns.items()}}
            for i, q in enumerate(questions)]


QUESTIONS = ["3*4=", "6*7=", "12*3=", "5*9=", "8*6=", "7*7="]

#: name -> (TRL's environment_factory, reward functions, tools, rows (None: the environment owns the data))
CASES = {
    "class factory, sync get_reward, a reward function over environments=": (
        envs.Calculator, [envs.env_reward], [], rows_of(QUESTIONS)),
    "lambda factory, the observation from another column, a tool that raises, answer reward": (
        lambda: envs.Announcer(), [envs.answer_reward], [],
        rows_of([""] * len(QUESTIONS), question=QUESTIONS, level=list(range(len(QUESTIONS))))),
    "functools.partial factory, async tool and get_reward in [-1, 2], an async reward function": (
        functools.partial(envs.AsyncCalculator), [envs.async_env_reward], [], rows_of(QUESTIONS)),
    "dict of factories by the environment column, unknown tool, None rewards": (
        {"mul": envs.Calculator, "add": envs.Adder}, [envs.env_reward], [],
        rows_of(QUESTIONS, environment=["mul", "add"] * (len(QUESTIONS) // 2))),
    "the environment owns the data, its next question from a stream seeded in __init__": (
        envs.OwnsTheData, [], [], None),
    "a reward attribute read back by a reward function (the OpenEnv pattern)": (
        envs.KeepsScore, [envs.kept_reward], [], rows_of(QUESTIONS)),
    "get_reward nan where it does not apply, beside a reward function": (
        envs.Abstains, [envs.answer_reward], [], rows_of(QUESTIONS)),
    "no get_reward, reward functions only, a standalone tool beside the environment": (
        envs.Unscored, [envs.answer_reward, envs.env_reward], [envs.multiply], rows_of(QUESTIONS)),
}


def schemas(tools) -> list:
    """The JSON schemas of the tools a prompt offers, as a chat template gets them (transformers' own function)."""
    from transformers.utils import get_json_schema

    return [get_json_schema(t) for t in tools]


def key_of(row) -> str:
    """A row by every column ("" without a dataset: the episodes of a step are then compared together)."""
    return "" if row is None else json.dumps(row, sort_keys=True, default=str)


def _nan(x):
    return math.nan if x is None else float(x)


# ---- ours ------------------------------------------------------------------------------------------------------------

def ours(model_dir: Path, factory, reward_funcs, tools, rows, tmp: Path) -> list[dict]:
    """``STEPS`` steps of our trainer; per step, what its agent sampler was given and returned and what its run files
    say of each episode."""
    from llm import GRPOConfig, train
    from llm.agents.episodes import AgentSampler

    seen = []
    generate = AgentSampler.generate
    signature = inspect.signature(generate)

    @functools.wraps(generate)
    def observed(self, *args, **kwargs):
        roll = generate(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        prompts, n, given = bound.arguments["prompt_ids"], bound.arguments["n"], bound.arguments["rows"]
        per_episode = [r for r in (given or [None] * len(prompts)) for _ in range(n)]
        seen.append({"rows": [None if rows is None else r for r in per_episode],
                     "schemas": [schemas(self.agent.schemas(r)) for r in per_episode],
                     "prompt_ids": [list(p) for p in roll.prompt_ids] if roll.prompt_ids is not None
                     else [list(p) for p in prompts for _ in range(n)],
                     "completion_ids": [list(c) for c in roll.completion_ids],
                     "tool_mask": [list(m) for m in roll.tool_mask]})
        return roll

    data = None
    if rows is not None:
        data = tmp / "rows.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp / "ours"
    config = GRPOConfig(model_name_or_path=str(model_dir), dataset=str(data) if data else None,
                        environment_factory=factory, reward_funcs=list(reward_funcs), tools=list(tools),
                        answer_check="last_number", max_completion_length=MAX_TOKENS, num_generations=G,
                        prompts_per_step=P, max_steps=STEPS, temperature=0.01, learning_rate=LEARNING_RATE,
                        exact_j=False, eval_steps=0, heldout_prompts=0, log_completions=True, progress=False,
                        max_tool_calling_iterations=3, output_dir=str(out))
    AgentSampler.generate = observed
    try:
        train(config, log=lambda *a: None)
    finally:
        AgentSampler.generate = generate
    table = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    if len(seen) != STEPS:
        raise RuntimeError(f"our agent sampler was called {len(seen)} times in {STEPS} steps")
    steps = []
    for step, (s, m) in enumerate(zip(seen, metrics)):
        logged = [r for r in table if r["step"] == step]
        sources = [k for k in logged[0] if k not in ("step", "prompt", "completion", "reward", "advantage")]
        steps.append({**s, "shown": [r["prompt"] for r in logged], "messages": [r["completion"] for r in logged],
                      "sources": {k: [_nan(r[k]) for r in logged] for k in sources},
                      "total": [_nan(r["reward"]) for r in logged], "reward": m["reward"],
                      "call_frequency": m.get("tools/call_frequency", 0.0),
                      "failure_frequency": m.get("tools/failure_frequency", 0.0)})
    return steps


# ---- TRL's -----------------------------------------------------------------------------------------------------------

def trls(model_dir: Path, factory, reward_funcs, tools, rows, out: Path) -> list[dict]:
    """``STEPS`` steps of TRL's GRPOTrainer on ``rows`` in their order (None: its placeholder rows); per step what it
    drew, offered, generated, scored and logged."""
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from llm.models.model import load_tokenizer

    steps: list[dict] = []

    class Probe(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            steps.append({"rows": [None if rows is None else dict(x) for x in inputs]})
            return super()._generate_and_score_completions(inputs)

        def _tokenize_prompts(self, prompts):
            steps[-1]["schemas"] = [schemas(self._env_tools[name]) for name in self._batch_environments]
            return super()._tokenize_prompts(prompts)

        def _generate(self, prompts):
            generated = super()._generate(prompts)
            prompt_ids, completion_ids, tool_mask, completions = generated[:4]
            steps[-1].update(shown=[list(p) for p in prompts], prompt_ids=[list(p) for p in prompt_ids],
                             completion_ids=[list(c) for c in completion_ids], tool_mask=[list(m) for m in tool_mask],
                             messages=[list(c) for c in completions])
            return generated

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            values = per_func.detach().cpu().numpy().astype(np.float64)
            weights = self.reward_weights.detach().cpu().numpy().astype(np.float64)
            weighted = values * weights  # TRL's total: the weighted sum with nan as "does not apply" (nansum) ...
            total = np.where(np.isnan(values).all(axis=1), np.nan, np.nansum(weighted, axis=1))  # ... nan if none
            steps[-1].update(sources=dict(zip(self.reward_func_names, values.T.tolist())), total=total.tolist())
            return per_func

    class Logged(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                steps[state.global_step - 1].update(reward=float(logs["reward"]),
                                                    call_frequency=float(logs.get("tools/call_frequency", 0.0)),
                                                    failure_frequency=float(logs.get("tools/failure_frequency", 0.0)))

    args = GRPOConfig(output_dir=str(out), max_steps=STEPS, num_generations=G, per_device_train_batch_size=P * G,
                      max_completion_length=MAX_TOKENS, generation_kwargs={"do_sample": False}, beta=0.0,
                      learning_rate=LEARNING_RATE, logging_steps=1, report_to="none", save_strategy="no",
                      use_cpu=True, shuffle_dataset=False, seed=0, bf16=False, max_tool_calling_iterations=3)
    tok = load_tokenizer(str(model_dir))  # the tokenizer as saved (transformers 5's AutoTokenizer drops its spaces)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = Probe(model=model, reward_funcs=list(reward_funcs), args=args, processing_class=tok,
                    train_dataset=Dataset.from_list(rows) if rows is not None else None,
                    environment_factory=factory, tools=list(tools) or None, callbacks=[Logged()])
    trainer.train()
    return steps


# ---- the comparison --------------------------------------------------------------------------------------------------

def same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return False
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-6
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


EPISODE_FIELDS = ("shown", "schemas", "prompt_ids", "completion_ids", "tool_mask", "messages", "total")


def episodes_by_row(step: dict) -> dict[str, list[dict]]:
    """A step's episodes grouped by their row (every column), each episode with its per-source values; a row's
    episodes sorted (compared as a set)."""
    out: dict[str, list[dict]] = {}
    for j, row in enumerate(step["rows"]):
        episode = {f: step[f][j] for f in EPISODE_FIELDS}
        episode["sources"] = {k: v[j] for k, v in step["sources"].items()}
        out.setdefault(key_of(row), []).append(episode)
    return {k: sorted(v, key=lambda e: json.dumps(e, sort_keys=True, default=str)) for k, v in out.items()}


def first_difference(a: dict, b: dict) -> str:
    """The fields in which two episodes differ, the first of them with both values."""
    fields = [f for f in (*EPISODE_FIELDS, "sources") if not same(a[f], b[f])]
    if not fields:
        return ""
    f = fields[0]
    return f"{', '.join(fields)} differ; {f}: TRL {a[f]!r} ours {b[f]!r}"[:700]


def compare(trl: list[dict], our: list[dict]) -> list[str]:
    """The differences, step by step."""
    out = []
    for step, (t, o) in enumerate(zip(trl, our)):
        if sorted(t["sources"]) != sorted(o["sources"]):
            out.append(f"step {step}: reward sources TRL {sorted(t['sources'])} ours {sorted(o['sources'])}")
        for name in ("reward", "call_frequency", "failure_frequency"):
            if not same(t[name], o[name]):
                out.append(f"step {step}: {name} TRL {t[name]:.6g} ours {o[name]:.6g}")
        tb, ob = episodes_by_row(t), episodes_by_row(o)
        if tb.keys() != ob.keys():
            out.append(f"step {step}: rows TRL {sorted(tb)} ours {sorted(ob)}"[:700])
            continue
        for key in tb:
            if len(tb[key]) != len(ob[key]):
                out.append(f"step {step}, row {key[:80]}: {len(tb[key])} episodes in TRL, {len(ob[key])} ours")
                continue
            for a, b in zip(tb[key], ob[key]):
                if d := first_difference(a, b):
                    out.append(f"step {step}, row {key[:80]}: {d}")
                    break
    if len(trl) != len(our):
        out.append(f"steps: TRL {len(trl)} ours {len(our)}")
    return out


def drawn(steps: list[dict]) -> str:
    """The questions reset appended, step by step (where the environment owns the data)."""
    return "; ".join(f"step {k}: " + " ".join(sorted(str(e[-1]["content"]) for e in s["shown"]))
                     for k, s in enumerate(steps))


def say(line: str) -> None:
    """A result line of a case's process (the parent keeps these, not the trainers' own console output)."""
    print(MARK + line.replace("\n", "\n" + MARK), flush=True)


MARK = "@@ "


def run_case(name: str) -> int:
    """One case: ours, then TRL on the rows ours drew."""
    from llm.models.tiny import agent_model_dir

    factory, reward_funcs, tools, rows = CASES[name]
    model_dir = agent_model_dir()
    with tempfile.TemporaryDirectory() as tmp:
        mine = ours(model_dir, factory, reward_funcs, tools, rows, Path(tmp))
        drew = None if rows is None else [r for s in mine for r in s["rows"][::G]]
        theirs = trls(model_dir, factory, reward_funcs, tools, drew, Path(tmp) / "trl")
    diffs = compare(theirs, mine)
    episodes = sum(len(s["completion_ids"]) for s in theirs)
    calls = sum(s["call_frequency"] for s in theirs) / len(theirs)
    by_step = " ".join(f"{s['reward']:.3f}" for s in theirs)
    say(f"{'same' if not diffs else 'DIFFERENT'}: {name} ({STEPS} steps, {episodes} episodes, {calls:.2f} calls "
        f"per episode, reward by step {by_step}, sources {', '.join(theirs[0]['sources'])})")
    if rows is None:
        say(f"    reset drew (TRL) {drawn(theirs)}\n    reset drew (ours) {drawn(mine)}")
    for d in diffs[:6]:
        say(f"    {d}")
    if len(diffs) > 6:
        say(f"    ... and {len(diffs) - 6} more")
    return 1 if diffs else 0


def refusals() -> int:
    """No reward source at all: TRL and ours both refuse at start-up."""
    from llm.config import GRPOConfig
    from llm.models.tiny import agent_model_dir
    from llm.run.trainer import setup

    model_dir, problems = agent_model_dir(), []
    try:
        trls(model_dir, envs.Unscored, [], [], rows_of(QUESTIONS), Path(tempfile.mkdtemp()))
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
    for p in problems:
        say(f"DIFFERENT: {p}")
    if not problems:
        say("same: no reward source at all is refused at start-up by both")
    return 1 if problems else 0


def quiet() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch

    torch.set_num_threads(2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--case", default="", help=argparse.SUPPRESS)  # one case, in this process
    args = ap.parse_args()
    if args.case:
        quiet()
        return refusals() if args.case == "refusal" else run_case(args.case)
    import trl

    print(f"TRL {trl.__version__} against this package, the built-in agent model: {STEPS} steps of {P} prompts x "
          f"G = {G}; ours on its default sampler at temperature 0.01, TRL greedy; learning rate {LEARNING_RATE:g}; "
          f"max_completion_length {MAX_TOKENS}, max_tool_calling_iterations 3", flush=True)
    names = [n for n in CASES if args.only in n] + ([] if args.only else ["refusal"])
    failed = 0
    for name in names:
        res = subprocess.run([sys.executable, __file__, "--case", name], text=True, capture_output=True)
        kept = [line[len(MARK):] for line in res.stdout.splitlines() if line.startswith(MARK)]
        print("\n".join(kept), flush=True)
        if res.returncode not in (0, 1) or not kept:
            print(f"DIFFERENT: {name}: the case stopped (exit {res.returncode}): "
                  + " | ".join(res.stderr.strip().splitlines()[-3:]))
        failed += res.returncode != 0
    print(f"{len(names) - failed} of {len(names)} cases the same")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
