"""Hypothesis profiles: ``dev`` (quick, default locally) and ``ci`` (thorough; chosen when CI is set), and the
fixtures several test modules use.

Select explicitly with HYPOTHESIS_PROFILE=dev|ci.
"""

import os
import sys

# Under pytest-xdist (`make test TEST_WORKERS=2`: two workers on two cores) each worker and every process it starts computes on one
# thread: two workers of two threads each on two cores run the compiled-model tests 4-5x slower than one thread each.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# oneMKL's vector math chosen on one thread before any test's first multi-threaded float operator (llm.vml)
from llm.vml import resolve_vml_dispatch  # noqa: E402

resolve_vml_dispatch()


# ---- fixtures several test modules use --------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from llm.tiny import tiny_model_dir

    return AutoTokenizer.from_pretrained(tiny_model_dir())


REWARDS_MODULE = '''
def correct(prompts, completions, answer, **kwargs):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

def short(prompts, completions, completion_ids, **kwargs):
    return [1.0 if len(ids) <= 3 else 0.0 for ids in completion_ids]

def only_even(prompts, completions, answer, **kwargs):
    return [None if int(a) % 2 else 1.0 for a in answer]

def wrong_length(prompts, completions, **kwargs):
    return [0.5]

def text(prompts, completions, **kwargs):
    return ["high" for _ in completions]

def boom(prompts, completions, **kwargs):
    raise KeyError("no column 'solution'")

calls = []

def length_minus_three(prompts, completions, completion_ids, **kwargs):
    bonus = 10.0 if len(calls) == 1 else 0.0  # the second call: step 0's held-out completions
    calls.append([len(ids) - 3.0 + bonus for ids in completion_ids])
    return calls[-1]
'''


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_batch_rewards.py").write_text(REWARDS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_batch_rewards", raising=False)  # imported afresh, forgotten afterwards
    yield "my_batch_rewards"
    sys.modules.pop("my_batch_rewards", None)
