"""Rewards as functions: the default checks of a reference answer, a user's text reward, and reward functions with
TRL's signature called once per batch (their weighted sum is the reward).

- ``math_verify_reward``: 1 iff ``math-verify`` (the checker of open-r1 and TRL's examples) finds the completion's
  answer equal to the reference (``1,000`` = ``1000``, ``\\frac{1}{2}`` = ``0.5``); ``numeric_reward``: 1 iff the last
  number of the completion equals it (``answer_check="last_number"``).
- ``text_reward``: a user's ``(completion, answer) -> float in [0, 1]``, checked value by value.
- ``batch_rewards``: TRL's ``f(prompts, completions, completion_ids, **columns) -> list[float | None]``, several with
  weights (``BatchReward``); None means the function does not apply to that completion (counted as 0, as TRL does);
  an ``async def`` one is awaited on one event loop of its own thread (``reward_loop``), the async ones together; one
  that runs past ``REWARD_NOTICE_S`` is named while the step waits (``watched``).
  For conversational data they receive the prompts as message lists and each completion as
  ``[{"role": "assistant", "content": text}]``, as TRL passes them.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import re
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from runkit.cli import first_line

from llm.config.ranges import TEXT_REWARD_RANGE, beyond_range

RewardFn = Callable[[str, str], float]


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class BatchReward:
    """A reward function with TRL's signature, its name (logged as ``rewards/<name>/mean|std``) and its weight."""

    name: str
    fn: Callable
    weight: float = 1.0


def is_number(value) -> bool:
    """A reward value is one real number: it converts with float() (numbers, bools, 0-d arrays and tensors do) and
    is not a string (``float("0.5")`` would pass)."""
    return not isinstance(value, (str, bytes)) and hasattr(value, "__float__")


def batch_rewards(funcs: Sequence[BatchReward], prompts: list, completions: list, completion_ids: list[list[int]],
                  columns: dict[str, list]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The weighted sum of the reward functions' values for each completion, and each function's values (nan
    where it returned None). Each function is called once for the batch with TRL's keyword arguments (``prompts``,
    ``completions``, ``completion_ids`` and the data's columns, ``answer`` among them). A function that raises, returns
    the wrong number of values or a value that is neither a real number nor None raises one line (a completion no
    source scores: ``require_scored``). The weighted sum may be any finite number: its range is declared
    (``llm.config.ranges``), never read off the rewards."""
    n = len(completions)
    total, parts = np.zeros(n), {}
    environments = columns.get("environments")
    failed = sum(e is None for e in environments) if environments is not None else 0

    def raised(f: BatchReward, exc: BaseException) -> ValueError:  # the user's code: any exception is one line
        if failed and "NoneType" in str(exc):  # it read an episode whose environment failed
            hint = (f" (environments= holds None for the {failed} episode{'s' if failed > 1 else ''} whose environment "
                    "failed, which score 0: skip them, e.g. [None if e is None else e.reward for e in environments])")
        else:
            hint = ENVIRONMENT_THREAD_HINT if environments is not None else ""
        return ValueError(f"reward_funcs: {f.name} raised {type(exc).__name__}: {first_line(exc, 200)}{hint}")

    outputs = []
    for f in funcs:
        try:
            with watched(f.name, n):
                outputs.append(f.fn(prompts=prompts, completions=completions, completion_ids=completion_ids,
                                    **columns))
        except Exception as exc:  # noqa: BLE001
            for out in outputs:  # the async functions' calls made so far are not awaited now: closed, not left to warn
                if inspect.iscoroutine(out):
                    out.close()
            raise raised(f, exc) from None
    pending, results = [i for i, out in enumerate(outputs) if inspect.isawaitable(out)], []
    if pending:
        with watched(", ".join(funcs[i].name for i in pending), n):
            results = awaited_together([outputs[i] for i in pending])
    for i, out in zip(pending, results, strict=True):
        if isinstance(out, BaseException):
            raise raised(funcs[i], out) from None
        outputs[i] = out
    for f, values in zip(funcs, outputs, strict=True):
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) != n:
            got = f"{len(values)} values" if hasattr(values, "__len__") else f"a {type(values).__name__}"
            raise ValueError(f"reward_funcs: {f.name} returned {got} for {n} completions; expected one number or "
                             "None per completion")
        arr = np.empty(n)
        for j, v in enumerate(values):
            if v is None:
                arr[j] = np.nan
            elif not is_number(v) or not math.isfinite(float(v)):
                raise ValueError(f"reward_funcs: {f.name} returned {v!r} for completion {shown(completions[j])}; "
                                 "expected a finite number or None")
            else:
                arr[j] = float(v)
        parts[f.name] = arr
        total += f.weight * np.nan_to_num(arr)
    return total, parts


#: Seconds a reward function runs before the run names it (it is not stopped: reward functions have no time limit,
#: as in TRL 1.16).
REWARD_NOTICE_S = 60.0


@contextmanager
def watched(name: str, n: int):
    """Say, above the progress bar, which reward function the step waits for once it has run ``REWARD_NOTICE_S``
    seconds: a hung one would otherwise leave a run silent for good."""
    from tqdm.auto import tqdm

    def notice():
        tqdm.write(f"reward_funcs: {name} has run {REWARD_NOTICE_S:g} s on {n} completions without returning; reward "
                   "functions have no time limit (as in TRL): Ctrl-C twice stops the run, keeping its last checkpoint")

    timer = threading.Timer(REWARD_NOTICE_S, notice)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


#: Said after the error of a reward function given ``environments=``: it runs on the trainer's thread, each
#: environment on its episode's worker thread (``llm.agents.workers``), so state bound to a thread cannot be read here.
ENVIRONMENT_THREAD_HINT = (" (reward functions run on the trainer's thread and each environment on its episode's "
                           "worker thread: read state bound to a thread, such as an sqlite connection opened in reset, "
                           "in get_reward or a tool, or open it with check_same_thread=False)")


def reward_loop() -> asyncio.AbstractEventLoop:
    """The event loop that async reward functions run on, in a daemon thread of its own (TRL 1.16 runs them on one
    such loop too): one for the process, so an async client made in one call is usable in the next."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="reward-loop", daemon=True).start()
        return _LOOP


def awaited_together(awaitables: list) -> list:
    """The async reward functions' results (or the exceptions they raised), awaited at once on ``reward_loop``, as
    TRL's ``asyncio.gather`` does."""
    if not awaitables:
        return []

    async def together():
        return await asyncio.gather(*awaitables, return_exceptions=True)

    return asyncio.run_coroutine_threadsafe(together(), reward_loop()).result()


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def require_scored(parts: dict[str, np.ndarray], completions: list, exempt=None) -> None:
    """Refuse, in one line, a completion that no reward source scored (every one returned None), unless ``exempt``
    (an episode whose environment failed: it scores 0 and is counted)."""
    if not parts:
        return
    scored = np.any([~np.isnan(v) for v in parts.values()], axis=0)
    if exempt is not None:
        scored |= np.asarray(exempt, dtype=bool)
    for j in np.flatnonzero(~scored)[:1]:
        raise ValueError(f"reward_funcs: every reward source returned None for completion {shown(completions[j])}; "
                         "each completion needs a number from one source at least (TRL 1.16 masks such a completion; "
                         "docs/trl.md)")


def shown(completion) -> str:
    """A completion (text, or TRL's conversational [{"role": "assistant", "content": text}]) quoted in an error."""
    text = completion[0]["content"] if isinstance(completion, list) else completion
    return repr(text[:200])


class RewardOutOfRange(ValueError):
    """A text reward outside [0, 1], the range the run's certificates were read under: the run stops and, as for a
    declared range, every certificate it logged is void (``llm.run.trainer``)."""


def text_reward(fn: RewardFn, completion: str, answer: str) -> float:
    """``fn(completion, answer)`` as a float in [0, 1]; anything else (an exception, a value that is not one real
    number, nan, inf, a value outside [0, 1]) raises one line naming the completion and the answer."""
    where = f"for completion {completion[:200]!r} (answer {answer!r})"
    try:
        value = fn(completion, answer)
    except Exception as exc:  # noqa: BLE001 - the user's code: any exception becomes one line
        raise ValueError(f"reward_fn: raised {type(exc).__name__}: {first_line(exc, 200)} {where}") from None
    if isinstance(value, (list, tuple, np.ndarray)) and np.ndim(value) > 0:
        raise ValueError(f"reward_fn: returned {len(value)} values {where}; it scores one completion, "
                         "so it must return one number")
    if not is_number(value):
        raise ValueError(f"reward_fn: returned a {type(value).__name__} ({value!r}) {where}; "
                         "expected a number in [0, 1]")
    r = float(value)
    if math.isnan(r):
        raise ValueError(f"reward_fn: returned nan {where}; expected a number in [0, 1]")
    if beyond_range([r], *TEXT_REWARD_RANGE)[0]:
        raise RewardOutOfRange(f"reward_fn: rewards must lie in [0, 1] (Theorem 1's bound needs it; the run's "
                               f"certificates were read under it), got {r!r} {where}")
    return r  # within rounding of [0, 1] (a scorer's 1.0000000000000002): the run's range check reads it as the edge


def parse_number(text: str) -> float | None:
    """The last number in ``text`` (commas allowed as thousands separators), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def numeric_reward(completion: str, answer: str) -> float:
    """1.0 iff the last number in the completion equals the numeric answer."""
    got, want = parse_number(completion), parse_number(answer)
    return 1.0 if got is not None and want is not None and math.isclose(got, want, rel_tol=0, abs_tol=1e-6) else 0.0


def math_verify_reward(completion: str, answer: str) -> float:
    """1.0 iff ``math-verify`` (the checker of open-r1 and TRL's examples) finds the completion's answer equal to
    ``answer``: numbers with thousands separators, fractions, LaTeX and plain expressions compare by value."""
    from math_verify import parse, verify

    return 1.0 if verify(parse_answer(answer), parse(completion)) else 0.0


def parse_answer(answer: str) -> list:
    """A reference answer as math-verify reads it: as written, or, when that finds nothing and the answer holds a
    digit or a LaTeX command (bare LaTeX such as ``x^2+1`` or ``\\pi``, as MATH's answers are written), inside
    $...$. Empty when neither applies (a word such as 'seven' is not read as a product of symbols)."""
    from math_verify import parse

    return parse(answer) or (parse(f"${answer}$") if re.search(r"[\\\d]", answer) else [])


ANSWER_CHECKS: dict[str, RewardFn] = {"math_verify": math_verify_reward, "last_number": numeric_reward}


def check_answers(answers: Sequence[str], source: str, answer_check: str) -> None:
    """Refuse reference answers the default reward cannot read (every completion would score 0): for
    ``last_number`` one without a number, for ``math_verify`` one math-verify parses to nothing."""
    readable = (lambda a: parse_number(a) is not None) if answer_check == "last_number" else parse_answer
    for i, a in enumerate(answers, 1):
        if not readable(a):
            raise ValueError(f"dataset: {source}: the answer of row {i} ({a!r}) cannot be read by --answer-check "
                             f"{answer_check}, so the default reward would score every completion 0; fix the row or "
                             "pass --reward-fn / --reward-funcs for such answers")


def import_reward_fn(path) -> RewardFn:
    """The function of ``package.module:function`` (or an 'object:...' kept for this process, or the function itself);
    it maps (completion, answer) to a float in [0, 1]."""
    from llm.config.user_code import import_object

    fn = import_object(path, "reward_fn")
    if not callable(fn):
        raise ValueError(f"reward_fn: {path!r} is not callable")
    return fn
