"""The run's plan: everything a run decides from what the user said, resolved once at start-up.

``GRPOConfig`` holds the options as given (config.json: None stays None). What the run derives from them, the task
and the machine is decided here, in one place each, and written beside config.json as plan.json:

- the sampler and why (``llm.sampling.resolve_sampler``: 'auto' and the transformers modes);
- the completion budget (``llm.config.grpo.completion_budget``: ``max_completion_length``, else the task's own);
- the reward range the guarantees read and where it comes from (``llm.config.ranges.range_origin`` over
  ``llm.rewards.sources_range``);
- the batch geometry (completions per step, per pass, passes per step);
- the sync clock (v, its policy, how many weight copies the fixed policy makes).

A resume compares the options (``llm.run.rundir``) and, for the derived values, the plans: a run started with the
task's budget of 6 resumes with ``--max-completion-length 6``. ``llm.analysis.report`` reads plan.json.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from llm.config import GRPOConfig
from llm.config.ranges import RangeOrigin, range_origin, range_text
from llm.rewards import sources_range
from llm.sampling import kind_class, resolve_sampler

__all__ = ["PLAN_FILE", "Plan", "read_plan", "resolve_plan", "reward_range_origin"]

#: The plan's file in the run directory, beside config.json.
PLAN_FILE = "plan.json"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the run decided (module docstring); ``to_dict`` is plan.json."""

    sampler: str
    """The kind of sampler (a key of ``llm.sampling.SAMPLERS``)."""
    sampler_origin: str
    """'given' (``--sampler``), or what 'auto' read."""
    max_completion_length: int
    """The completion budget in tokens."""
    completion_budget_origin: str
    """'given' (``--max-completion-length``) or "the task's own"."""
    reward_range: tuple[float, float] | None
    """The range of the total reward the guarantees read (None: none, the certificates abstain)."""
    reward_range_origin: str
    """``llm.config.ranges``: 'declared with --reward-range', "the reward's own sources" or 'none'."""
    completions_per_step: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    sync_policy: str
    sync_period: int
    num_syncs: int | None
    """Weight copies into the sampler with the fixed policy, step 0's (the initial policy) included (None: the divergence
    policy decides as it goes)."""

    @property
    def sampler_class(self) -> type:
        """The sampler's class (its attributes say what it is, ``llm.sampling.base.Sampler``), imported on demand."""
        return kind_class(self.sampler)

    def to_dict(self) -> dict:
        """plan.json's object (a tuple as a list, as JSON holds it)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, stored: dict) -> "Plan":
        """The plan a plan.json holds (its range a list there)."""
        rng = stored.get("reward_range")
        known = {f.name: stored.get(f.name, "") for f in dataclasses.fields(cls)}  # a key added later: ""
        return cls(**{**known, "reward_range": None if rng is None else tuple(rng)})

    def lines(self) -> list[str]:
        """The plan's key line, for the start of a run and the report (the batch and the sync have lines of their own
        at start-up)."""
        return [f"plan ({PLAN_FILE}): sampler {self.sampler} ({self.sampler_origin}); completions of <= {self.max_completion_length} tokens "
                f"({self.completion_budget_origin}); reward range {range_text(self.reward_range)} "
                f"({self.reward_range_origin})"]


def reward_range_origin(config: GRPOConfig) -> RangeOrigin:
    """The reward range ``config``'s run reads and where it comes from; a declared range that does not hold the
    sources' own is a ValueError (one line)."""
    data = config.data
    return range_origin(data.reward_range, sources_range(data.reward_funcs, data.reward_weights,
                                                         bool(config.agent.environment_factory)))


def resolve_plan(config: GRPOConfig) -> Plan:
    """The plan of a run of ``config`` on this machine (module docstring)."""
    if not isinstance(config, GRPOConfig):
        raise TypeError(f"resolve_plan() takes a GRPOConfig, got {type(config).__name__}")
    rng = reward_range_origin(config)
    adaptive = config.sync.sync_policy == "divergence"
    sampler, sampler_origin = resolve_sampler(config.sampling)
    return Plan(sampler=sampler, sampler_origin=sampler_origin,
                max_completion_length=config.completion_budget,
                completion_budget_origin="given" if config.sampling.max_completion_length is not None else
                "the task's own",
                reward_range=rng.range, reward_range_origin=rng.origin,
                completions_per_step=config.sampling.completions_per_step,
                micro_batch_size=config.micro_batch_size,
                gradient_accumulation_steps=config.gradient_accumulation_steps,
                sync_policy=config.sync.sync_policy, sync_period=config.sync.sync_period,
                num_syncs=None if adaptive else config.num_syncs)


def read_plan(run_dir: str | Path) -> dict | None:
    """A run directory's plan.json as a dict, or None for a run written before plans (its config.json then holds the
    budget and range it resolved)."""
    path = Path(run_dir) / PLAN_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())
