"""Multi-turn episodes over any sampler: ``AgentSampler`` (token in, token out).

An episode starts with its environment, when the run has one (``llm.agents.environments``): made and ``reset`` with
the prompt's row on the episode's worker (``llm.agents.workers``); an observation ``reset`` returns is appended to the
prompt's last user message, as TRL 1.16 does, and that episode's prompt is rendered again. Then each round, every
unfinished episode's tokens so far (its prompt, its turns and the environment's tokens, as ids) go to the inner
sampler's ``generate`` as the prompt of one more turn, in one call up to the largest remaining budget; each turn ends
at EOS or is cut at its own episode's remaining budget (the tokens past it are dropped: a stopping rule that reads
only the tokens before it, so the kept ones are alpha's draws as they are), and its tokens and log alpha are appended
as they came. A turn is read as TRL reads it (``ToolTemplate.parse``); one with tool calls gets the tools' answers
appended as the chat template renders them (``ToolTemplate.environment_ids``, mask 0, log-prob 0), and the episode
goes on; a turn without calls (a final answer, or a turn the parser cannot read), a turn cut by the budget, a round
past ``max_tool_calling_iterations`` (its calls are not run) and an answer that would pass the budget end it. Every
episode's calls of a round run at once, on the episodes' workers, under one deadline. At the end each environment's
``get_reward`` runs on its worker, the episodes' again at once under one deadline.

Because the sampler's weights do not change during a call to ``generate`` (``llm.step.rollout``: a window's episodes
are generated in one call), every token of an episode comes from the same alpha: an episode never spans a sync, so
each of its tokens has its step's lag.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from llm.agents.environments import (ENVIRONMENT_COLUMN, Environment, EnvironmentPool, Lease, environment_tools,
                                    reward_value)
from llm.agents.template import ToolTemplate
from llm.agents.tools import AnswerBudget, answer_content, error_content
from llm.agents.workers import Outcome, Worker, Workers
from llm.tensors.token_filter import NO_FILTER, TokenFilter
from llm.sampling.base import Rollout
from runkit.cli import exception_text

#: What an episode's tools or environment did wrong, by kind: each kind gets one log line per run, with a count and
#: its first instance. A failed call counts in ``tools/failure_frequency``; a failed environment (``reset`` or
#: ``get_reward`` raised, hung or returned something else) scores its episode 0 (``tools/env_failure_frequency``).
FAILED_CALLS = ("raised", "timed out", "unknown tool")
FAILED_ENVIRONMENTS = ("reset failed", "get_reward failed")


@dataclass
class Episode:
    prompt: list[int]
    tools: dict  # name -> function: the tools this episode may call
    schemas: list  # what its prompt showed the model (its parse reads calls with them)
    row: dict | None = None
    env: object = None
    environment: Environment | None = None
    lease: Lease | None = None  # its environment's pooled instance (``EnvironmentPool``)
    worker: Worker | None = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    calls: int = 0
    failures: int = 0
    malformed: int = 0
    rounds: int = 0  # tool-calling rounds so far
    done: bool = False
    failed: str = ""  # why its environment failed: the episode then scores 0
    stalled: bool = False  # a call of its environment is still running past its deadline
    reported: bool = True  # the sampler reported log alpha of every turn
    messages: list[dict] = field(default_factory=list)  # the episode as messages (TRL's conversational completion)
    shown: object = None  # its prompt with reset's observation appended (None: the row's prompt as it is)
    rewards: dict = field(default_factory=dict)  # environment reward source -> value (nan: does not apply)

    def add(self, ids, logprobs, policy: bool) -> None:
        self.ids += list(ids)
        self.reported &= logprobs is not None or not policy
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)
        self.mask += [int(policy)] * len(ids)


@dataclass
class Agent:
    """What the episodes need: the template, the standalone tools (``tools``: name -> function), the environments
    (by name, None: the only one; ``llm.agents.environments``), the workers, the answers' budget and the limits."""

    template: ToolTemplate
    budget: AnswerBudget
    workers: Workers
    tools: dict = field(default_factory=dict)
    environments: dict = field(default_factory=dict)
    pool: EnvironmentPool | None = None  # the environments' instances, reused across steps
    max_tool_calling_iterations: int = 0  # 0: no limit but the budget
    log: Callable = print
    said: set = field(default_factory=set)  # the kinds of failure logged so far: each gets one line per run

    @property
    def reward_sources(self) -> list[str]:
        """The environments' reward sources (their classes' names), each once."""
        return list(dict.fromkeys(e.reward_source for e in self.environments.values() if e.reward_source))

    def environment_of(self, row: dict | None) -> Environment | None:
        """The environment of a data row: the only one, or the one its 'environment' column names."""
        if not self.environments:
            return None
        if None in self.environments:
            return self.environments[None]
        name = (row or {}).get(ENVIRONMENT_COLUMN)
        if name not in self.environments:
            raise ValueError(f"environment_factory: a row has {ENVIRONMENT_COLUMN}={name!r}, not one of "
                             f"{', '.join(map(repr, self.environments))}")
        return self.environments[name]

    def schemas(self, row: dict | None) -> list:
        """What a row's prompt shows the model: the standalone tools and its environment's (a probe's methods)."""
        env = self.environment_of(row)
        return list(self.tools.values()) + (environment_tools(env.probe) if env is not None else [])

    def prompt_ids(self, prompt, row: dict | None) -> list[int]:
        """A prompt's tokens with its row's tools."""
        return self.template.prompt_ids(as_messages(prompt), tools=self.schemas(row))

    def accepted_episodes(self, prompt_ids: list[list[int]], scripts) -> tuple[list, list]:
        """``scripted_episodes`` of this agent (an agent task's accepted episodes, for ``TokenizedTask``)."""
        return scripted_episodes(self, prompt_ids, scripts)

    def note(self, events: Counter, first: dict, kind: str, detail: str) -> None:
        events[kind] += 1
        first.setdefault(kind, detail[:200])

    def say(self, events: Counter, first: dict) -> None:
        """One line per kind of failure, the first time it happens in the run."""
        for kind, count in sorted(events.items()):
            if kind in self.said:
                continue
            self.said.add(kind)
            what = ("scored 0 (counted in tools/env_failure_frequency)" if kind in FAILED_ENVIRONMENTS else
                    "counted in tools/failure_frequency" if kind in FAILED_CALLS else "each episode scored by its reward")
            self.log(f"tools: {count} {kind} (first: {first[kind]}); no run stopped, {what}; this kind is not logged "
                     "again")


def as_messages(prompt) -> list[dict]:
    """A prompt as a conversation: a text is one user message."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def with_observation(prompt, observation) -> list[dict]:
    """The prompt with ``reset``'s observation appended to its last message, as TRL 1.16 does (content blocks where
    either is a list)."""
    messages = as_messages(prompt)
    content = messages[-1]["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return messages[:-1] + [{**messages[-1], "content": content + observation}]


def _reset(lease: Lease, factory, row: dict, multi: bool):
    """Reset the lease's instance on the row, made first if it is new; an ``async def reset`` gives a coroutine of
    both, which the episode's worker awaits on its own event loop."""
    if lease.env is None:
        lease.env = factory()
    env = lease.env
    kwargs = {k: v for k, v in row.items() if k != ENVIRONMENT_COLUMN} if multi else dict(row)
    observation = env.reset(**kwargs)
    if inspect.isawaitable(observation):
        return _with_env(env, observation)
    return env, observation


async def _with_env(env, observation):
    return env, await observation



class AgentSampler:
    """A sampler whose completions are an agent's episodes (module docstring); ``inner`` generates every turn."""

    def __init__(self, inner, agent: Agent):
        self.inner, self.agent = inner, agent

    def __getattr__(self, name):  # name, model, load_weights ...: the inner sampler's
        return getattr(self.inner, name)

    def close(self) -> None:
        if self.agent.pool is not None:
            self.agent.pool.close()
        self.agent.workers.close()
        self.inner.close()

    def generate(self, prompt_ids: list[list[int]], n: int, max_tokens: int, temperature: float, seed: int,
                 greedy: bool = False, token_filter: TokenFilter = NO_FILTER, rows: list[dict] | None = None) \
            -> Rollout:
        """``n`` episodes per prompt, prompt-major, each of at most ``max_tokens`` completion tokens (the policy's and
        the environment's together, TRL's budget); ``rows``: each prompt's data row, for ``reset(**row)``."""
        agent = self.agent
        events: Counter = Counter()
        first: dict[str, str] = {}
        episodes = [Episode(list(p), dict(agent.tools), agent.schemas(rows[i] if rows else None),
                            rows[i] if rows else None) for i, p in enumerate(prompt_ids) for _ in range(n)]
        try:
            changed = self._start(episodes, events, first)
            if changed:  # some prompts differ from their group's: one completion per episode's own prompt
                first_turn = self.inner.generate([e.prompt for e in episodes], 1, max_tokens, temperature, seed,
                                                 greedy=greedy, token_filter=token_filter)
            else:
                first_turn = self.inner.generate(prompt_ids, n, max_tokens, temperature, seed, greedy=greedy,
                                                 token_filter=token_filter)
            self._round(episodes, first_turn, max_tokens, events, first)
            turn = 1
            while live := [e for e in episodes if not e.done]:
                for e in live:  # an episode whose answers filled its budget ends there, as TRL's does
                    e.done = len(e.ids) >= max_tokens
                live = [e for e in live if not e.done]
                if not live:
                    break
                budget = max(max_tokens - len(e.ids) for e in live)  # each turn is then cut to its own episode's
                roll = self.inner.generate([e.prompt + e.ids for e in live], 1, budget, temperature,
                                           seed + 7919 * turn, greedy=greedy, token_filter=token_filter)
                self._round(live, roll, max_tokens, events, first)
                turn += 1
            self._rewards(episodes, events, first)
        finally:
            for e in episodes:
                if e.lease is not None and (e.failed or e.stalled):  # a failed instance is not reused
                    agent.pool.drop(e.lease)
                    e.lease = None
                elif e.worker is not None and e.lease is None:
                    agent.workers.release(e.worker)
                e.worker = None  # a leased instance keeps its worker: given back with it (``Rollout.release``)
        agent.say(events, first)
        sources = agent.reward_sources
        return Rollout([e.ids for e in episodes],
                       None if not all(e.reported for e in episodes) else [e.logprobs for e in episodes],
                       tool_mask=[e.mask for e in episodes], tool_calls=[e.calls for e in episodes],
                       tool_failures=[e.failures for e in episodes], messages=[e.messages for e in episodes],
                       env_rewards=[{s: e.rewards.get(s, math.nan) for s in sources} for e in episodes]
                       if sources else None,
                       environments=[e.env for e in episodes] if agent.environments else None,
                       prompt_ids=[e.prompt for e in episodes] if changed else None,
                       env_failed=[bool(e.failed) for e in episodes], malformed=[e.malformed for e in episodes],
                       leases=[e.lease for e in episodes] if agent.environments else None,
                       prompts_shown=[e.shown for e in episodes] if changed else None)

    # ---- the phases of an episode ---------------------------------------------------------------------------------

    def _start(self, episodes: list[Episode], events: Counter, first: dict) -> bool:
        """Make and reset every episode's environment at once on their workers; append observations to their prompts.
        Returns whether any prompt changed."""
        agent = self.agent
        if not agent.environments:
            return False
        multi = None not in agent.environments
        calls = []
        for e in episodes:
            e.environment = agent.environment_of(e.row)
            e.lease = agent.pool.take(e.environment.name)
            e.worker = e.lease.worker
            calls.append((e.worker, _reset, (e.lease, e.environment.factory, e.row or {}, multi)))
        changed = False
        for e, out in zip(episodes, agent.workers.run(calls)):
            if not out.ok:
                self._fail(e, "reset failed", _why(out, agent.workers.timeout), events, first)
                continue
            e.env, observation = out.value
            e.tools.update({t.__name__: t for t in environment_tools(e.env)})
            if observation is None:
                continue
            if not isinstance(observation, (str, list)):
                self._fail(e, "reset failed", f"reset returned a {type(observation).__name__}; expected None, text "
                           "or a list of content blocks", events, first)
                continue
            e.shown = with_observation((e.row or {}).get("prompt", ""), observation)
            e.prompt = agent.template.prompt_ids(e.shown, tools=e.schemas)
            changed = True
        return changed

    def _fail(self, e: Episode, kind: str, detail: str, events: Counter, first: dict) -> None:
        e.failed = e.failed or f"{kind}: {detail}"
        self.agent.note(events, first, kind, detail)

    def _round(self, episodes: list[Episode], roll: Rollout, max_tokens: int, events: Counter, first: dict) -> None:
        """Append each episode's new turn, run every episode's calls of this round at once, append their answers."""
        pending = []
        for j, e in enumerate(episodes):
            room = max_tokens - len(e.ids)  # the tokens past an episode's budget are dropped: a stopping rule
            calls = read_turn(self.agent, e, roll.completion_ids[j][:room],
                              roll.logprobs[j][:room] if roll.logprobs is not None else None, events, first)
            if calls:
                pending.append((e, calls))
        run_calls(self.agent, pending, max_tokens, events, first)

    def _rewards(self, episodes: list[Episode], events: Counter, first: dict) -> None:
        """Every environment's reward source, read on its worker at once under one deadline."""
        agent = self.agent
        todo = [e for e in episodes if e.environment is not None and e.environment.reward and not e.failed]
        for e in todo:
            if e.stalled:
                self._fail(e, "get_reward failed", "its environment had not answered an earlier call", events, first)
        todo = [e for e in todo if not e.failed]
        outs = agent.workers.run([(e.worker, reward_value, (e.env, e.environment.reward)) for e in todo])
        for e, out in zip(todo, outs):
            source = e.environment.reward_source
            if not out.ok:
                self._fail(e, "get_reward failed", _why(out, agent.workers.timeout), events, first)
            elif out.value is None:
                e.rewards[source] = math.nan  # TRL's None: the source does not apply
            elif isinstance(out.value, float) and math.isnan(out.value):  # TRL's nansum reads nan as None
                agent.note(events, first, "get_reward returned nan (read as None: the source does not apply to "
                           "the episode, as TRL reads it)", source)
                e.rewards[source] = math.nan
            elif isinstance(out.value, (str, bytes)) or not hasattr(out.value, "__float__") \
                    or not math.isfinite(float(out.value)):
                self._fail(e, "get_reward failed", f"{source} returned {out.value!r}; expected a finite number or None",
                           events, first)
            else:
                e.rewards[source] = float(out.value)


def _why(out: Outcome, timeout: float) -> str:
    if out.timed_out:
        return f"no answer within tool_timeout = {timeout:g} s"
    return f"{type(out.error).__name__}: {exception_text(out.error)}"


def read_turn(agent: Agent, e: Episode, ids: list[int], logprobs, events: Counter, first: dict) -> list[dict]:
    """Append one turn of the policy to episode ``e``; the calls it makes (to run now), or [] with the episode done."""
    prefix = e.prompt + e.ids
    e.add(ids, logprobs, policy=True)
    if not ids:
        e.done = True
        return []
    # a turn cut by the budget is read too, as TRL reads it: its calls run, and their answers cannot fit
    parsed = agent.template.parse(ids, prefix, e.schemas)
    e.messages.append(parsed.message)
    if parsed.malformed:  # the parser could not read it: a final answer, as TRL takes it
        e.malformed += 1
        agent.note(events, first, "turns the parser could not read (malformed calls; each ends its episode as a final "
                   "answer, counted in tools/malformed_frequency)", parsed.malformed)
    limit = agent.max_tool_calling_iterations
    if not parsed.calls or e.failed:
        e.done = True
        return []
    if limit and e.rounds >= limit:  # TRL: the calls past the limit are not run, nor counted
        agent.note(events, first, "turns past max_tool_calling_iterations (their calls not run; the episode ends)",
                   f"round {e.rounds + 1} > {limit}")
        e.done = True
        return []
    e.rounds += 1
    return parsed.calls


class UnknownTool(ValueError):
    """A call of a tool the episode does not have (TRL's ValueError, with its text)."""


def _call(tools: dict, call: dict):
    """One call, as TRL 1.16 makes it: a function call to a known tool with its arguments as keywords."""
    fn = call.get("function", call)
    if call.get("type", "function") != "function":
        raise ValueError(f"Unsupported tool call type: {call.get('type')}")
    name = fn["name"]
    if name not in tools:
        raise UnknownTool(f"Tool {name} not found.")
    return tools[name](**fn["arguments"])


def run_calls(agent: Agent, pending: list[tuple[Episode, list[dict]]], max_tokens: int, events: Counter,
              first: dict) -> None:
    """Run the calls of a round, every episode's at once on its worker (one deadline), then append each episode's
    answers as the environment's tokens, or end the episode when they would pass its budget."""
    jobs, where = [], []
    for e, calls in pending:
        if e.worker is None:
            e.worker = agent.workers.acquire()
        elif e.stalled and e.env is None:  # plain tools hold no state: a fresh worker for a stalled episode
            agent.workers.release(e.worker)
            e.worker, e.stalled = agent.workers.acquire(), False
        for call in calls:
            e.calls += 1
            if e.stalled:  # its environment is still running an abandoned call: this one cannot run
                where.append((e, call, Outcome(timed_out=True)))
                continue
            where.append((e, call, None))
            jobs.append((e.worker, _call, (e.tools, call)))
    outs = iter(agent.workers.run(jobs))
    answers: dict[int, list[dict]] = {}
    for e, call, out in where:
        out = out or next(outs)
        name = call.get("function", call).get("name", "unknown")
        content = None
        if out.ok:
            try:  # str() of the tool's value runs the user's code too
                content = agent.budget(answer_content(out.value))
            except Exception as exc:  # noqa: BLE001 - any exception becomes the call's error
                out = Outcome(error=ValueError(f"its answer (a {type(out.value).__name__}) could not be turned into "
                                               f"text: {type(exc).__name__}: {exception_text(exc)}"))
        if content is None:
            e.failures += 1
            if out.timed_out:
                e.stalled = True
                kind, detail = "timed out", f"no answer within tool_timeout = {agent.workers.timeout:g} s"
            else:
                kind = "unknown tool" if isinstance(out.error, UnknownTool) else "raised"
                detail = exception_text(out.error)
            agent.note(events, first, kind, f"{name}: {type(out.error).__name__ + ': ' if out.error else ''}{detail}")
            content = agent.budget(error_content(detail))
        answers.setdefault(id(e), []).append({"role": "tool", "name": name, "content": content})
    for e, _ in pending:
        messages = answers[id(e)]
        env_ids = agent.template.environment_ids(messages)
        if len(e.ids) + len(env_ids) > max_tokens:  # the answers would pass the budget: TRL drops them
            agent.note(events, first, "answers past the completion budget (not appended; the episode ends)",
                       f"{len(env_ids)} tokens")
            e.done = True
            continue
        e.messages += messages
        e.add(env_ids, None, policy=False)


def scripted_episodes(agent: Agent, prompt_ids: list[list[int]], scripts) -> tuple[list, list]:
    """An agent task's accepted episodes (``Task.accepted_scripts``) built by the episode loop itself: per prompt, per
    script, its call turns as the template writes them, the tools' answers, then the last answer as the final turn;
    every script's calls of a round at once, as a step's are. Returns the episodes' token ids and tool masks, per
    prompt. A question whose tool fails has no accepted episode (there is no answer to copy): every episode of it
    scores 0 and its exact J is 0, one line says how many."""
    events: Counter = Counter()
    first: dict = {}
    built = [[(Episode(list(prompt), dict(agent.tools), list(agent.tools.values())), script) for script in accepted]
             for prompt, accepted in zip(prompt_ids, scripts, strict=True)]
    flat = [pair for pairs in built for pair in pairs]
    try:
        for r in range(max((len(script) for _, script in flat), default=0)):
            pending = []
            for e, script in flat:
                if r < len(script) and not e.done:
                    turn = agent.template.turn_ids(agent.template.call_message([(n, dict(a)) for n, a in script[r]]))
                    if calls := read_turn(agent, e, turn, None, events, first):
                        pending.append((e, calls))
            run_calls(agent, pending, 1 << 30, events, first)
    finally:
        for e, _ in flat:
            if e.worker is not None:
                agent.workers.release(e.worker)
    ids, masks, failed, first_failure = [], [], 0, ""
    for pairs in built:
        if any(e.failures or e.done for e, _ in pairs):
            failed += 1
            bad = next(e for e, _ in pairs if e.failures or e.done)
            first_failure = first_failure or next((m["content"] for m in bad.messages if m["role"] == "tool"), "")
            ids.append([])
            masks.append([])
            continue
        for e, _ in pairs:
            answer = e.messages[-1]["content"] if e.messages else ""
            read_turn(agent, e, agent.template.turn_ids({"role": "assistant", "content": answer}), None, events, first)
        ids.append([e.ids for e, _ in pairs])
        masks.append([e.mask for e, _ in pairs])
    if failed:
        agent.log(f"tools: the task's tool failed on {failed} of {len(prompt_ids)} questions (first answer: "
                  f"{first_failure}); they have no accepted episode, so every episode of them scores 0 and their exact "
                  "J is 0")
    return ids, masks
