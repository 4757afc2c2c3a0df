"""Multi-turn episodes over any sampler: ``AgentSampler`` (token in, token out).

Each round, every unfinished episode's tokens so far (its prompt, its turns and the environment's tokens, as ids)
go to the inner sampler's ``generate`` as the prompt of one more turn, in one call up to the largest remaining budget;
each turn ends at EOS or is cut at its own episode's remaining budget (the tokens past it are dropped: a stopping rule
that reads only the tokens before it, so the kept ones are alpha's draws as they are), and its tokens and log alpha
are appended as they came. A turn whose parse has tool calls gets
the tools' answers appended as the chat template renders them (``ToolTemplate.environment_ids``, mask 0, log-prob
0), and the episode goes on; a turn without calls, a turn cut by the budget, a malformed call and a call past
``max_tool_calling_iterations`` end it. Because the sampler's weights do not change during a call to ``generate``
(``llm.step.rollout``: a window's episodes are generated in one call), every token of an episode comes from the same
alpha: an episode never spans a sync, so each of its tokens has its step's lag.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from llm.agents.template import ToolTemplate
from llm.agents.tools import CallResult, ToolRunner, environment_tools
from llm.core.token_filter import NO_FILTER, TokenFilter
from llm.sampling.base import Rollout


@dataclass
class Episode:
    prompt: list[int]
    tools: dict
    env: object = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    calls: int = 0
    failures: int = 0
    rounds: int = 0  # tool-calling rounds so far
    done: bool = False
    reported: bool = True  # the sampler reported log alpha of every turn
    messages: list[dict] = field(default_factory=list)  # the episode as messages (TRL's conversational completion)

    def add(self, ids, logprobs, policy: bool) -> None:
        self.ids += list(ids)
        self.reported &= logprobs is not None or not policy
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.mask += [int(policy)] * len(ids)


@dataclass
class Agent:
    """What the episodes need: the template, the tools (``tools``: name -> function; or ``environment_factory``,
    whose instances' methods are the tools), the runner, and the limits."""

    template: ToolTemplate
    runner: ToolRunner
    tools: dict = field(default_factory=dict)
    environment_factory: object = None
    max_tool_calling_iterations: int = 0  # 0: no limit but the budget
    log: object = print

    def accepted_episodes(self, prompt_ids: list[list[int]], scripts) -> tuple[list, list]:
        """``scripted_episodes`` of this agent (an agent task's accepted episodes, for ``TokenizedTask``)."""
        return scripted_episodes(self, prompt_ids, scripts)

    def start(self, prompt: list[int], row: dict | None) -> Episode:
        if self.environment_factory is None:
            return Episode(list(prompt), self.tools)
        env = self.environment_factory()
        env.reset(**(row or {}))
        return Episode(list(prompt), {**self.tools, **{t.__name__: t for t in environment_tools(env)}}, env)


class AgentSampler:
    """A sampler whose completions are an agent's episodes (module docstring); ``inner`` generates every turn."""

    def __init__(self, inner, agent: Agent):
        self.inner, self.agent = inner, agent
        self.said: set[str] = set()  # the failure kinds logged so far: each gets one line per run

    def __getattr__(self, name):  # name, model, load_weights, close ...: the inner sampler's
        return getattr(self.inner, name)

    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 greedy: bool = False, token_filter: TokenFilter = NO_FILTER, rows: list[dict] | None = None) \
            -> Rollout:
        """``n`` episodes per prompt, prompt-major, each of at most ``max_tokens`` completion tokens (the policy's and
        the environment's together, TRL's budget); ``rows``: each prompt's data row, for ``reset(**row)``."""
        agent = self.agent
        episodes = [agent.start(p, rows[i] if rows else None) for i, p in enumerate(prompt_ids) for _ in range(n)]
        events: Counter = Counter()
        first: dict[str, str] = {}
        first_turn = self.inner.generate(prompt_ids, n, max_tokens, temperature, seed, greedy=greedy,
                                         token_filter=token_filter)
        self._take(episodes, first_turn, max_tokens, events, first)
        turn = 1
        while True:
            live = [e for e in episodes if not e.done]
            if not live:
                break
            budget = max(max_tokens - len(e.ids) for e in live)  # each turn is then cut to its own episode's
            roll = self.inner.generate([e.prompt + e.ids for e in live], 1, budget, temperature, seed + 7919 * turn,
                                       greedy=greedy, token_filter=token_filter)
            self._take(live, roll, max_tokens, events, first)
            turn += 1
        for kind, count in sorted(events.items()):
            if kind not in self.said:
                self.said.add(kind)
                agent.log(f"tools: {count} {kind} (first: {first[kind]}); no run stopped, each episode scored by its "
                          "reward (this kind is not logged again; failed calls count in tools/failure_frequency)")
        return Rollout([e.ids for e in episodes],
                       None if not all(e.reported for e in episodes) else [e.logprobs for e in episodes],
                       tool_mask=[e.mask for e in episodes], tool_calls=[e.calls for e in episodes],
                       tool_failures=[e.failures for e in episodes], messages=[e.messages for e in episodes],
                       env_rewards=None if agent.environment_factory is None else [
                           _env_reward(e.env) for e in episodes])

    def _take(self, episodes: list[Episode], roll: Rollout, max_tokens: int, events: Counter, first: dict) -> None:
        """Append each episode's new turn (``take_turn``)."""
        for j, e in enumerate(episodes):
            room = max_tokens - len(e.ids)  # the tokens past an episode's budget are dropped: a stopping rule
            take_turn(self.agent, e, roll.completion_ids[j][:room],
                      roll.logprobs[j][:room] if roll.logprobs is not None else None, max_tokens, events, first)


def take_turn(agent: Agent, e: Episode, ids: list[int], logprobs, max_tokens: int, events: Counter,
              first: dict) -> list[dict]:
    """Append one turn of the policy to episode ``e``, run the calls it makes and append their answers (the
    environment's tokens), or mark the episode done (module docstring). Returns the tool messages."""
    e.add(ids, logprobs, policy=True)
    if not ids or ids[-1] != agent.template.eos:  # cut by the budget: the episode ends here
        e.messages.append({"role": "assistant", "content": agent.template.tokenizer.decode(
            list(ids), skip_special_tokens=True)})
        e.done = True
        return []
    parsed = agent.template.parse(ids)
    e.messages.append({"role": "assistant", "content": parsed.content, **({"tool_calls": [
        {"type": "function", "function": c} for c in parsed.calls]} if parsed.calls else {})})
    if parsed.malformed:
        e.failures += 1
        _note(events, first, "malformed call", parsed.malformed)
        e.done = True
        return []
    if not parsed.calls:  # a final answer
        e.done = True
        return []
    limit = agent.max_tool_calling_iterations
    if limit and e.rounds >= limit:
        e.calls += len(parsed.calls)
        e.failures += len(parsed.calls)
        _note(events, first, "over the call limit", f"round {e.rounds + 1} > max_tool_calling_iterations = {limit}")
        e.done = True
        return []
    e.rounds += 1
    messages = []
    for call in parsed.calls:
        e.calls += 1
        result: CallResult = agent.runner.call(e.tools, call["name"], call["arguments"])
        if result.failure:
            e.failures += 1
            _note(events, first, result.failure, result.detail or call["name"])
        messages.append({"role": "tool", "name": call["name"], "content": result.text})
    e.messages += messages
    env_ids = agent.template.environment_ids(messages)
    if len(e.ids) + len(env_ids) >= max_tokens:  # no room left for a turn after the answer
        _note(events, first, "answers past the completion budget", f"{len(env_ids)} tokens")
        e.done = True
        return messages
    e.add(env_ids, None, policy=False)
    return messages


def scripted_episodes(agent: Agent, prompt_ids: list[list[int]], scripts) -> tuple[list, list]:
    """An agent task's accepted episodes (``Task.accepted_scripts``) built by ``take_turn`` itself: per prompt, per
    script, its call turns as the template writes them, the tools' answers, then the last answer as the final turn.
    Returns the episodes' token ids and tool masks, per prompt. A tool that fails here is refused at start-up."""
    ids, masks = [], []
    events: Counter = Counter()
    first: dict = {}
    for prompt, accepted in zip(prompt_ids, scripts, strict=True):
        ids.append([])
        masks.append([])
        for script in accepted:
            e, messages = agent.start(prompt, None), []
            for calls in script:
                turn = agent.template.turn_ids(agent.template.call_message([(n, dict(a)) for n, a in calls]))
                messages = take_turn(agent, e, turn, None, 1 << 30, events, first)
            answer = messages[-1]["content"] if messages else ""
            take_turn(agent, e, agent.template.turn_ids({"role": "assistant", "content": answer}), None, 1 << 30,
                      events, first)
            if events:
                kind = next(iter(events))
                raise ValueError(f"tools: the task's accepted episodes need its tools, and a call {kind} "
                                 f"({first[kind]})")
            ids[-1].append(e.ids)
            masks[-1].append(e.mask)
    return ids, masks


def _note(events: Counter, first: dict, kind: str, detail: str) -> None:
    events[kind] += 1
    first.setdefault(kind, detail[:200])


def _env_reward(env) -> float:
    reward = getattr(env, "reward", None)
    return float(reward() if callable(reward) else reward) if reward is not None else 0.0
