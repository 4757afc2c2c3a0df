"""TRL 1.16's environment contract, and user code that raises, hangs, holds a database, is async or returns garbage
(docs/agents.md; benchmarks/trl_agents.py checks the same environments beside TRL's own trainer).

Each test is one case of the issue that asked for it: each failed before the change (the reward taken for a tool,
the observation dropped, reward functions without ``environments=``, a traceback, a step's worth of timeouts, a
failure frequency above 1, a coroutine as an answer...)."""

import dataclasses
import math
import random
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from llm.agents.episodes import AgentSampler
from llm.agents.setup import build_agent
from llm.config import GRPOConfig
from llm.config.agent import AgentConfig
from llm.tasks import Task
from tests.llm.test_agents import QUIET, Script, _agent, _tokenizer

ENVS = "fixtures.agent_envs"
CALL = '[multiply{{"a":{a},"b":{b}}}]<eos>'
ROWS = [{"prompt": "3*4="}, {"prompt": "5*4="}]


def _env_agent(factory, log=QUIET, reward_funcs=(), task=None, **kw):
    """The built-in agent model's tokenizer with ``factory`` (a name in fixtures.agent_envs, a dict, a callable)."""
    from llm.rewards import reward_funcs as resolve

    tok = _tokenizer()
    names = list(factory) if isinstance(factory, dict) else []
    task = task or Task("rows", tuple(r["prompt"] for r in ROWS), (), env_reward=True,
                        columns={"environment": tuple(names[i % len(names)] for i in range(len(ROWS)))} if names else {})
    if reward_funcs:
        task = dataclasses.replace(task.with_reward_funcs(resolve(reward_funcs, ())), env_reward=True)
    spec = {k: f"{ENVS}:{v}" for k, v in factory.items()} if isinstance(factory, dict) else \
        f"{ENVS}:{factory}" if isinstance(factory, str) else factory
    agent = build_agent(AgentConfig(environment_factory=spec, **kw), task, tok, log)
    return tok, task, agent


def _episodes(agent, tok, turns, rows=ROWS, max_tokens=60):
    prompts = [agent.prompt_ids(r["prompt"], r) for r in rows]
    return AgentSampler(Script(tok, turns), agent).generate(prompts, 1, max_tokens, 1.0, 0, rows=rows)


# ---- the contract ------------------------------------------------------------------------------------------------


def test_get_reward_is_the_reward_not_a_tool_and_properties_are_never_evaluated():
    """get_reward (no docstring) is a reward source named after the class, weight 1, not a tool; a property that
    raises is neither evaluated nor offered."""
    tok, task, agent = _env_agent("Multiplier")
    env = agent.environments[None]
    assert env.tool_names == ["multiply"] and env.reward == "get_reward" and agent.reward_sources == ["Multiplier"]
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"])
    assert roll.env_rewards == [{"Multiplier": 1.0}, {"Multiplier": 0.0}]
    rewards, parts = task.bind(tok, agent=agent).score_parts([0, 1], ["", ""], roll.completion_ids, episodes=roll)
    assert rewards.tolist() == [1.0, 0.0] and list(parts) == ["Multiplier"]


def test_a_reward_method_is_a_tool_as_in_trl_and_its_refusal_points_to_get_reward():
    with pytest.raises(ValueError, match="name it get_reward"):
        _env_agent("RewardMethod")


def test_an_environment_without_any_reward_source_is_refused_at_start_up():
    with pytest.raises(ValueError, match="no reward source"):
        _env_agent("NoReward")


def test_resets_observation_is_appended_to_the_last_user_message():
    """TRL appends reset's text to the prompt's last user message: the episode's prompt is rendered again with it."""
    tok, task, agent = _env_agent("Observed")
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"])
    assert [tok.decode(p) for p in roll.prompt_ids] == ["3*4= please", "5*4= please"]
    assert roll.env_rewards[0] == {"Observed": 1.0}


def test_reward_functions_get_the_prompts_as_shown_with_the_observation():
    """TRL gives reward functions the prompts after reset's observation was appended (the ones the model saw)."""
    tok, task, agent = _env_agent("Observed", reward_funcs=[f"{ENVS}:saw_the_observation"])
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"])
    rewards, parts = task.bind(tok, agent=agent).score_parts([0, 1], ["", ""], roll.completion_ids, episodes=roll)
    assert parts["saw_the_observation"].tolist() == [1.0, 1.0]


def test_reward_functions_get_the_environments_and_the_environments_reward_is_added():
    """TRL's documented pattern: a reward function reads ``environments=``; the environment's get_reward is one more
    source of weight 1 beside it."""
    tok, task, agent = _env_agent("Multiplier", reward_funcs=[f"{ENVS}:asked_with_environment"])
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"])
    rewards, parts = task.bind(tok, agent=agent).score_parts([0, 1], ["", ""], roll.completion_ids, episodes=roll)
    assert parts["asked_with_environment"].tolist() == [0.5, 0.0] and parts["Multiplier"].tolist() == [1.0, 0.0]
    assert rewards.tolist() == [1.5, 0.0]


def test_async_tools_and_get_reward_are_awaited_and_rewards_may_leave_the_unit_interval():
    tok, task, agent = _env_agent("AsyncMultiplier")
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"])
    assert "=12|" in tok.decode(roll.completion_ids[0]) and roll.tool_failures == [0, 0]
    assert roll.env_rewards == [{"AsyncMultiplier": 2.0}, {"AsyncMultiplier": -1.0}]
    tok, _, plain, _ = _agent(tools=[f"{ENVS}:async_multiply"])
    roll = AgentSampler(Script(tok, ['[async_multiply{"a":3,"b":4}]<eos>', "12<eos>"]), plain).generate(
        [plain.prompt_ids("3*4=", None)], 1, 60, 1.0, 0)
    assert tok.decode(roll.completion_ids[0]) == '[async_multiply{"a":3,"b":4}]<eos>=12|12<eos>'


def test_state_bound_to_a_thread_works_under_the_default_timeout():
    """An sqlite connection opened in reset is used by the tool and get_reward: all on the episode's one worker."""
    tok, task, agent = _env_agent("WithDatabase")
    assert agent.workers.timeout == 10.0
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"])
    assert roll.tool_failures == [0, 0] and roll.env_rewards == [{"WithDatabase": 1.0}, {"WithDatabase": 0.0}]


@pytest.mark.parametrize("factory,kind", [("ResetRaises", "reset failed"), ("ResetHangs", "reset failed"),
                                          ("RewardHangs", "get_reward failed"), ("RewardGarbage", "get_reward failed")])
def test_a_reset_or_get_reward_that_raises_hangs_or_returns_garbage_fails_its_episode_alone(factory, kind):
    """Scored 0, counted (env_failed), one log line, no traceback; the other rows go on."""
    said = []
    tok, task, agent = _env_agent({"bad": factory, "good": "Multiplier"}, log=said.append, tool_timeout=0.5)
    rows = [{"prompt": "3*4=", "environment": "bad"}, {"prompt": "3*4=", "environment": "good"}]
    t0 = time.perf_counter()
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"], rows=rows)
    assert time.perf_counter() - t0 < 5  # one deadline, not an hour
    assert roll.env_failed == [True, False] and len(roll.completion_ids) == 2
    rewards, _ = task.bind(tok, agent=agent).score_parts([0, 0], ["", ""], roll.completion_ids, episodes=roll)
    assert rewards.tolist() == [0.0, 1.0]
    assert len(said) == 1 and kind in said[0]


def test_a_round_with_many_hung_calls_costs_one_timeout_and_abandoned_workers_come_back():
    """Eight episodes whose calls hang for 1.5 s at tool_timeout = 0.5: one round costs about one timeout (eight
    after one another cost 4 s); the workers left running rejoin the pool when their calls return."""
    tok, task, agent = _env_agent("HangsSometimes", tool_timeout=0.5)
    rows = [{"prompt": "2*4="}] * 8
    t0 = time.perf_counter()
    roll = _episodes(agent, tok, [CALL.format(a=2, b=4), "8<eos>"], rows=rows)
    took = time.perf_counter() - t0
    assert roll.tool_failures == [1] * 8 and took < 2.5, took
    assert agent.workers.abandoned == 8
    time.sleep(2.0)  # the hung calls return
    assert agent.workers.abandoned == 0 and len(agent.workers.idle) >= 8
    made = agent.workers.made
    _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"], rows=[{"prompt": "3*4="}] * 8)
    assert agent.workers.made == made  # reused, not piled up


def test_a_call_that_never_returns_does_not_keep_the_process_from_exiting(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""
        import time
        from llm.agents.workers import Workers
        workers = Workers(0.2)
        out = workers.run([(workers.acquire(), time.sleep, (3600,))])
        assert out[0].timed_out
        print("done")
    """))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "done" in done.stdout and time.perf_counter() - t0 < 30


def test_a_dict_of_environments_is_chosen_by_the_environment_column_with_its_own_tools():
    tok, task, agent = _env_agent({"mul": "Multiplier", "add": "Adder"})
    assert [t.__name__ for t in agent.schemas({"environment": "mul"})] == ["multiply"]
    assert [t.__name__ for t in agent.schemas({"environment": "add"})] == ["add"]
    rows = [{"prompt": "3*4=", "environment": "mul"}, {"prompt": "3*4=", "environment": "add"}]
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"], rows=rows, max_tokens=120)
    assert roll.tool_failures == [0, 1]  # the add episode has no multiply
    assert "Tool multiply not found." in roll.messages[1][1]["content"]
    assert roll.env_rewards == [{"Multiplier": 1.0, "Adder": float("nan")}, {"Multiplier": float("nan"), "Adder": 0.0}] \
        or (roll.env_rewards[0]["Multiplier"] == 1.0 and np.isnan(roll.env_rewards[0]["Adder"])
            and np.isnan(roll.env_rewards[1]["Multiplier"]) and roll.env_rewards[1]["Adder"] == 0.0)


def test_a_factory_may_be_any_callable():
    import functools

    from fixtures import agent_envs

    for factory in (lambda: agent_envs.Multiplier(), functools.partial(agent_envs.Multiplier)):
        tok, task, agent = _env_agent(factory)
        assert _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"]).env_rewards[0] == {"Multiplier": 1.0}


# ---- answers and metrics -----------------------------------------------------------------------------------------


def test_a_huge_answer_is_cut_by_characters_before_it_is_tokenised():
    from llm.agents.tools import AnswerBudget
    from llm.models.model import load_tokenizer
    from llm.models.tiny import agent_model_dir

    tok = load_tokenizer(str(agent_model_dir()))
    seen = []

    class Counting:
        def __call__(self, text, **kw):
            seen.append(len(text))
            return tok(text, **kw)

        def __getattr__(self, name):
            return getattr(tok, name)

    budget = AnswerBudget(8, Counting())
    out = budget("9" * 1_000_000)
    assert out == "99999999 [truncated]" and max(seen) <= 8 * budget.token_chars + 1
    assert budget("1234") == "1234" and budget.truncated == 1


def test_a_tools_file_that_does_not_compile_is_one_line_with_its_file_and_line(tmp_path, monkeypatch):
    (tmp_path / "broken_tools.py").write_text("def f(a: int) -> int:\n    return a +\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"tools: .*broken_tools.py:2: invalid syntax") as err:
        _agent(tools=["broken_tools:f"])
    assert "\n" not in str(err.value)


# ---- the built-in task on its own --------------------------------------------------------------------------------


def test_the_builtin_agent_task_brings_its_own_budget():
    assert GRPOConfig(dataset="arithmetic_tools").completion_budget == 40
    assert GRPOConfig().completion_budget == 6
    assert GRPOConfig(dataset="arithmetic_tools", max_completion_length=50).completion_budget == 50
    assert GRPOConfig(dataset="arithmetic_tools").max_completion_length is None  # what was said


def test_a_users_tool_that_fails_on_some_questions_leaves_them_without_an_accepted_episode():
    """The questions a*0 and 0*b: the tool raises, so there is no answer to copy: no accepted episode, reward 0 and
    exact J 0 for them, one line; the others as before."""
    said = []
    tok, task, agent, bound = _agent(tools=["tests.llm.agent_zero_tools:multiply"], log=said.append)
    zero = [i for i, p in enumerate(task.prompts) if 0 in (int(x) for x in p.rstrip("=").split("*"))]
    assert zero and all(bound.accepted_ids[i] == [] for i in zero)
    others = [i for i in range(len(task.prompts)) if i not in zero]
    assert all(bound.accepted_ids[i] for i in others)
    assert [re.search(r"failed on (\d+ of \d+)", s).group(1) for s in said if "failed on" in s] == \
        [f"{len(zero)} of 160", "7 of 40"]


# ---- training with TRL's environments ----------------------------------------------------------------------------


def _train_env(tmp_path, name, **kw):
    from llm import train
    from llm.models.tiny import agent_model_dir
    from llm.run.rundir import read_metrics

    base = dict(model_name_or_path=str(agent_model_dir()), max_steps=2, sampler="transformers", prompts_per_step=4,
                num_generations=4, max_completion_length=40, exact_j=False, eval_steps=0, progress=False,
                logging_steps=1000)
    said = []
    rows = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / name), **{**base, **kw}), log=said.append))
    return rows, said


@pytest.fixture
def multiply_rows(tmp_path):
    import json

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}*{b}="}) + "\n" for a in range(2, 9) for b in range(2, 6)))
    return str(data)


def test_an_environment_that_owns_the_data_trains_without_a_dataset(tmp_path):
    """TRL's train_dataset=None: every prompt is reset's observation (a lambda factory, given from Python)."""
    from fixtures import agent_envs

    rows, _ = _train_env(tmp_path, "owned", dataset=None, environment_factory=lambda: agent_envs.OwnsTheData())
    assert [r["step"] for r in rows] == [0, 1] and all(r["tools/call_frequency"] > 0 for r in rows)
    assert any(r["rewards/OwnsTheData/mean"] > 0 for r in rows)


def test_held_out_prompts_are_refused_where_the_environment_owns_the_data():
    """Held-out episodes would take pooled instances whose streams replay the training questions: not independent."""
    with pytest.raises(ValueError, match="heldout_prompts: with --dataset none .* independent of training"):
        GRPOConfig(dataset=None, environment_factory=f"{ENVS}:Quizmaster", heldout_prompts=2)
    assert GRPOConfig(dataset=None, environment_factory=f"{ENVS}:Quizmaster").heldout_prompts == 0


def test_rewards_of_any_size_and_environments_in_reward_functions_train(tmp_path, multiply_rows):
    """get_reward in [-1, 2] and a reward function over environments=: the run goes on, each source logged."""
    rows, _ = _train_env(tmp_path, "any", dataset=multiply_rows, environment_factory=f"{ENVS}:AsyncMultiplier",
                         reward_funcs=(f"{ENVS}:asked_with_environment",))
    assert all(-1 <= r["rewards/AsyncMultiplier/mean"] <= 2 for r in rows)
    assert all("rewards/asked_with_environment/mean" in r for r in rows)


def test_an_environment_holding_a_database_trains_under_the_default_timeout(tmp_path, multiply_rows):
    rows, said = _train_env(tmp_path, "db", dataset=multiply_rows, environment_factory=f"{ENVS}:WithDatabase")
    assert all(r["tools/env_failure_frequency"] == 0 for r in rows) and max(r["reward"] for r in rows) > 0
    assert not any("thread" in line for line in said)  # sqlite's "objects created in a thread can only be used..."


@pytest.mark.slow
def test_the_builtin_agent_task_runs_on_its_own(tmp_path):
    rows, _ = _train_env(tmp_path, "builtin", dataset="arithmetic_tools", model_name_or_path="",
                         max_completion_length=None, exact_j=True, max_steps=1)
    assert rows[0]["tools/call_frequency"] > 0 and 0 <= rows[0]["j/pi_k"] <= 1


def test_the_documented_example_trains_on_its_own_rows(tmp_path, monkeypatch):
    """docs/agents.md's tool file and environment class, as a user runs them (two steps here)."""
    from tests.helpers import ROOT

    examples = ROOT / "examples" / "agents"
    monkeypatch.syspath_prepend(str(examples))
    rows, _ = _train_env(tmp_path, "example", dataset=str(examples / "questions.jsonl"), model_name_or_path="",
                         environment_factory="calculator_env:CalculatorEnv", tools=("calculator_tools:add",),
                         reward_funcs=("calculator_tools:reward_used_the_tool",), prompts_per_step=8)
    assert all("rewards/CalculatorEnv/mean" in r and "rewards/reward_used_the_tool/mean" in r for r in rows)
    assert max(r["reward"] for r in rows) > 0 and all(r["tools/env_failure_frequency"] == 0 for r in rows)


# ---- user code a TRL user wrote (an outside user's findings, 2026-11-28) ---------------------------------------------


def test_an_async_reset_is_awaited_on_the_episodes_worker():
    """docs/agents.md: async reset runs on the worker's event loop. It failed every episode ('reset returned a
    coroutine'), scoring each 0 while the run went on."""
    said = []
    tok, task, agent = _env_agent("AsyncReset", log=said.append)
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"])
    assert roll.env_failed == [False, False] and not said
    assert [tok.decode(p) for p in roll.prompt_ids] == ["3*4= please", "5*4= please"]
    assert roll.env_rewards == [{"AsyncReset": 1.0}, {"AsyncReset": 0.0}]


def test_a_tool_answer_whose_str_raises_is_the_calls_error_not_the_runs_end():
    """str() of a tool's value is the user's code: it raised through the run ('error: cannot render me', exit 2)."""
    said = []
    tok, task, agent = _env_agent("UnprintableAnswer", log=said.append)
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"], max_tokens=200)
    assert roll.tool_failures == [1, 1] and len(said) == 1
    assert "multiply" in said[0] and "could not be turned into text: RuntimeError: cannot render me" in said[0]
    assert "could not be turned into text" in tok.decode(roll.completion_ids[0])


def test_a_reward_function_reading_thread_bound_state_says_where_each_runs():
    """A reward function over environments= that reads an sqlite connection opened in reset: sqlite refuses it on
    the trainer's thread, and the one line says why and what to do instead."""
    tok, task, agent = _env_agent("WithDatabase", reward_funcs=[f"{ENVS}:reads_the_database"])
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"])
    with pytest.raises(ValueError, match=r"reads_the_database raised ProgrammingError: .*worker thread.*get_reward"):
        task.bind(tok, agent=agent).score_parts([0, 1], ["", ""], roll.completion_ids, episodes=roll)


# ---- instances pooled across steps, as TRL 1.16 pools them ---------------------------------------------------------


def test_instances_are_pooled_and_reset_again_so_an_environment_that_owns_its_data_moves_on():
    """The probe instance is the pool's first; each step's episodes take the lowest-numbered free instances and reset
    them again once the step was scored, so a seeded stream of questions made in __init__ goes on (TRL: "5*5=" then
    "3*4=", where fresh instances asked "5*5=" every time). Episode j of every step gets instance j."""
    tok, task, agent = _env_agent("Quizmaster")
    bound = task.bind(tok, agent=agent)
    seen = []
    for step in range(3):
        roll = _episodes(agent, tok, ["12<eos>"])
        seen.append([m[-1]["content"] for m in roll.prompts_shown])
        bound.score_parts([0, 1], ["", ""], roll.completion_ids, episodes=roll)  # gives the instances back
    stream = random.Random(0)  # instances 0 (the probe) and 1 each draw from a stream seeded alike
    questions = [f"{stream.randint(2, 9)}*{stream.randint(2, 9)}=" for _ in range(3)]
    assert [[p.split(" ")[-1] for p in step] for step in seen] == [[q, q] for q in questions]
    assert len(set(questions)) == 3  # the questions move on
    assert agent.pool.made == {None: 2}  # two instances for two episodes a step, however many steps


def test_an_instance_is_not_reset_before_its_episodes_are_scored_and_a_failed_one_is_dropped():
    """Episodes of a window not scored yet keep their instances (the next call takes new ones); an instance whose reset
    raised is never handed out again."""
    tok, task, agent = _env_agent("Quizmaster")
    first = _episodes(agent, tok, ["12<eos>"])
    second = _episodes(agent, tok, ["12<eos>"])  # the first call's instances are still out
    assert {id(x) for x in first.leases}.isdisjoint({id(x) for x in second.leases})
    assert agent.pool.made == {None: 4}
    first.release()
    second.release()
    tok, task, agent = _env_agent({"bad": "ResetRaises", "good": "Multiplier"}, tool_timeout=0.5)
    rows = [{"prompt": "3*4=", "environment": "bad"}, {"prompt": "3*4=", "environment": "good"}]
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"], rows=rows)
    assert roll.leases[0] is None and roll.leases[1] is not None
    roll.release()
    assert [x.index for x in agent.pool.free["bad"]] == []  # the probe raised in reset: dropped
    assert [x.index for x in agent.pool.free["good"]] == [0]


def test_state_made_in_init_keeps_its_thread_across_steps():
    """An sqlite connection opened in __init__ is used by reset, the tool and get_reward at every step: each pooled
    instance lives on the worker that made it."""
    tok, task, agent = _env_agent("DatabaseFromInit")
    bound = task.bind(tok, agent=agent)
    for _ in range(3):
        roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"])
        assert roll.tool_failures == [0, 0] and not any(roll.env_failed)
        assert roll.env_rewards == [{"DatabaseFromInit": 1.0}, {"DatabaseFromInit": 0.0}]
        bound.score_parts([0, 1], ["", ""], roll.completion_ids, episodes=roll)


def test_a_reward_attribute_read_by_a_reward_function_is_counted_once():
    """TRL's OpenEnv pattern: the environment keeps ``self.reward``, a reward function returns it. The total is that
    function's value (1, as in TRL), never the attribute added a second time (2); without the function there is no
    reward source at all, refused at start-up as TRL refuses it."""
    tok, task, agent = _env_agent("KeepsReward", reward_funcs=[f"{ENVS}:kept_reward"])
    assert agent.reward_sources == []
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"])
    rewards, parts = task.bind(tok, agent=agent).score_parts([0, 1], ["", ""], roll.completion_ids, episodes=roll)
    assert list(parts) == ["kept_reward"] and rewards.tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="no reward source"):
        _env_agent("KeepsReward")


def test_nan_from_get_reward_means_does_not_apply_as_in_trl():
    """A reward function's share stands where get_reward says nan (TRL's nansum), and one line per run says so."""
    said = []
    tok, task, agent = _env_agent("NanReward", reward_funcs=[f"{ENVS}:asked_with_environment"], log=said.append)
    roll = _episodes(agent, tok, ["12<eos>", "12<eos>"])  # no call: get_reward is nan, the reward function 0
    rewards, parts = task.bind(tok, agent=agent).score_parts([0, 1], ["", ""], roll.completion_ids, episodes=roll)
    assert all(math.isnan(v) for v in parts["NanReward"]) and not any(roll.env_failed)
    assert rewards.tolist() == [0.0, 0.0]
    roll = _episodes(agent, tok, [CALL.format(a=3, b=4), "12<eos>"])
    rewards, parts = task.bind(tok, agent=agent).score_parts([0, 1], ["", ""], roll.completion_ids, episodes=roll)
    assert rewards.tolist() == [1.5, 0.0]  # 0.5 from the function, 1 from get_reward; the nan row keeps its 0
    assert sum("get_reward returned nan" in line for line in said) == 1


def test_a_reward_function_tripping_on_a_failed_episodes_none_is_told_so():
    """environments= holds None where an episode's environment failed; a reward function reading it raises, and the
    line says why (not the thread-state hint, which fits other errors)."""
    from llm.rewards import reward_funcs as resolve
    from llm.rewards.functions import batch_rewards

    funcs = resolve([f"{ENVS}:kept_reward"], ())
    from fixtures.agent_envs import KeepsReward

    env = KeepsReward()
    with pytest.raises(ValueError, match="holds None for the 1 episode whose environment failed") as err:
        batch_rewards(funcs, ["3*4=", "3*4="], ["12", "12"], [[1], [1]], {"environments": [None, env]})
    assert "sqlite" not in str(err.value)
    values, parts = batch_rewards(funcs, ["3*4="], ["12"], [[1]], {"environments": [env]})
    assert values.tolist() == [0.0]
