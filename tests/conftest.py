"""Hypothesis profiles: ``dev`` (quick, default locally) and ``ci`` (thorough; chosen when CI is set), and the
fixtures several test modules use.

Select explicitly with HYPOTHESIS_PROFILE=dev|ci.
"""

import os
import sys

# Under pytest-xdist (`make test`: two workers on two cores) each worker and every process it starts computes on one
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

# oneMKL's vector math chosen on one thread before any test's first multi-threaded float operator (llm.models.vml)
from llm.models.vml import resolve_vml_dispatch  # noqa: E402

resolve_vml_dispatch()


# ---- two workers: whole modules, the multi-process ones together, the longest first ------------------------

#: Modules whose tests keep both cores busy with processes of their own (a vLLM server, torchrun's two ranks), and the
#: compiled-model tests, which slowed 2x beside them (212 s and 184 s in the suite against about 100 s each alone):
#: under `make test`'s two pytest-xdist workers they form one work unit, run one after the other by a single worker
#: while the other worker runs single-process modules (started together they ran 1.5-1.9x slower; and in 2 of 5
#: parallel runs that let them overlap, the server test under torchrun found the server gone, cause not found).
MULTIPROCESS_MODULES = ("tests/llm/test_server.py", "tests/llm/test_distributed.py", "tests/llm/test_compile.py",
                        "tests/llm/test_generation_paths.py")
#: The next longest modules, longest first (sequential seconds, `pytest --durations=0`, 2-core AMD EPYC, this
#: round: model 150-200, trainer 144, faults 126, vllm_engine 98, logprobs 90, diagnostics 64, evaluation 60,
#: rollout 60, families 58, real_model 53, train 52, sync_policy 49). Order only: every test runs.
LONGEST_MODULES = (*MULTIPROCESS_MODULES, "tests/llm/test_model.py", "tests/llm/test_trainer.py",
                   "tests/contracts/test_faults.py", "tests/llm/test_vllm_engine.py", "tests/llm/test_logprobs.py",
                   "tests/llm/test_diagnostics.py", "tests/llm/test_evaluation.py", "tests/llm/test_rollout.py",
                   "tests/contracts/test_families.py", "tests/contracts/test_real_model.py",
                   "tests/llm/test_train.py", "tests/llm/test_sync_policy.py")


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # one process: the order as collected
        return
    rank = {name: i for i, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(_module(item.nodeid), len(rank)))  # stable: the rest as collected


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`: whole modules per worker (a module's server or engine fixture starts once), with
    ``MULTIPROCESS_MODULES`` as one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = _module(nodeid)
            return "multiprocess" if module in MULTIPROCESS_MODULES else module

    return Scheduling(config, log)


# ---- fixtures several test modules use --------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from llm.models.tiny import tiny_model_dir

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
