"""Rewards: the checks of a reference answer and user functions (``functions``), DAPO's soft overlong punishment
(``overlong``) and reward models (``model``). ``reward_funcs`` turns the entries of ``--reward-funcs`` into weighted
reward functions with TRL's signature:

- ``module:function``: a function of the user's (TRL's signature);
- ``soft_overlong_punishment``: the built-in length penalty, with ``max_completion_length`` and ``soft_punish_cache``;
- a model directory holding a sequence classifier: a reward model scoring prompt and completion.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from llm.config.ranges import TEXT_REWARD_RANGE, weighted_range
from llm.rewards.functions import (ANSWER_CHECKS, BatchReward, RewardFn, batch_rewards, check_answers, import_reward_fn,
                        math_verify_reward, numeric_reward, parse_answer, parse_number, text_reward)
from llm.rewards.model import RewardModel, is_reward_model
from llm.rewards.overlong import NAME as OVERLONG, SoftOverlongPunishment

__all__ = ["ANSWER_CHECKS", "BUILTIN_REWARD_FUNCS", "BatchReward", "OVERLONG", "RewardContext", "RewardFn", "RewardModel",
           "SoftOverlongPunishment", "batch_rewards", "check_answers", "import_reward_fn", "is_reward_model",
           "math_verify_reward", "numeric_reward", "parse_answer", "parse_number", "reward_funcs", "reward_name",
           "sources_range", "text_reward"]


@dataclass(frozen=True)
class RewardContext:
    """What the built-in reward functions and reward models need from the run (``GRPOConfig`` names)."""

    max_completion_length: int = 16
    soft_punish_cache: int = 0
    device: str = "cpu"
    trust_remote_code: bool = False

#: The built-in reward functions of ``--reward-funcs``, by name; each class declares its ``reward_range``.
BUILTIN_REWARD_FUNCS = {OVERLONG: SoftOverlongPunishment}


def sources_range(reward_funcs: Sequence[str], reward_weights: Sequence[float], environment: bool) \
        -> tuple[float, float] | None:
    """The total reward's range from its sources' own (``llm.config.ranges``): the task's own text reward's
    (``TEXT_REWARD_RANGE``), or the weighted sum of the ``reward_funcs``' ranges (a built-in function's class declares
    its own; any other declares none); None with an environment (its ``get_reward`` declares nothing)."""
    if environment:
        return None
    if not reward_funcs:
        return TEXT_REWARD_RANGE
    weights = list(reward_weights) or [1.0] * len(reward_funcs)
    builtin = [BUILTIN_REWARD_FUNCS.get(f) for f in reward_funcs]
    return weighted_range([None if cls is None else cls.reward_range for cls in builtin], weights)


def reward_function(spec: str, context: RewardContext):
    """One entry of ``--reward-funcs`` as (name, function)."""
    if spec in BUILTIN_REWARD_FUNCS:
        fn = BUILTIN_REWARD_FUNCS[spec](context.max_completion_length, context.soft_punish_cache)
        return fn.__name__, fn
    if is_reward_model(spec):
        fn = RewardModel(spec, context.device, context.trust_remote_code)
        return fn.__name__, fn
    try:
        fn = import_reward_fn(spec)
    except ValueError as exc:
        raise ValueError(str(exc).replace("reward_fn:", "reward_funcs:", 1).replace(
            "expected 'module:name'", f"expected 'module:function', {OVERLONG} or a reward model's directory")) \
            from None
    return reward_name(fn), fn


def reward_name(fn) -> str:
    """TRL's name of a reward function (``get_callable_name``): its ``__name__``, for a ``functools.partial`` its
    function's (unless the partial was given a ``__name__`` of its own), for a callable instance its class's."""
    base = fn
    while isinstance(base, functools.partial):
        base = base.func
    for candidate in (fn, base):
        if isinstance(getattr(candidate, "__name__", None), str) and candidate.__name__:
            return candidate.__name__
    return type(base).__name__


def reward_funcs(specs: Sequence[str], weights: Sequence[float], context: RewardContext = RewardContext()) \
        -> list[BatchReward]:
    """The reward functions of ``--reward-funcs`` with their weights (1 each when none are given), each named (its
    metrics: ``rewards/<name>/mean|std``)."""
    weights = list(weights) or [1.0] * len(specs)
    funcs = [BatchReward(*reward_function(spec, context), float(w)) for spec, w in zip(specs, weights, strict=True)]
    names = [f.name for f in funcs]
    for name in sorted({n for n in names if names.count(n) > 1})[:1]:
        raise ValueError(f"reward_funcs: {names.count(name)} functions are named {name!r} (TRL's name: a function's "
                         "__name__, a partial's function's, an instance's class's), so their metrics would clash; give "
                         "each a name of its own: fn.__name__ = 'my_name' (a partial or an instance takes one too)")
    return funcs
