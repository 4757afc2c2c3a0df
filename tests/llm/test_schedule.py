"""llm.optim.schedule: the learning rate of every optimiser step is transformers' schedule, logged per step as
``learning_rate``, and a run killed and resumed continues it exactly."""

import math
import os
import signal

import pytest
import torch

from llm import GRPOConfig, train
from llm.optim.schedule import Schedule, make_optimizer
from llm.run.rundir import read_metrics


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine", "constant_with_warmup"])
@pytest.mark.parametrize("iterations", [1, 3])
def test_the_rate_of_each_optimiser_step_is_transformers_schedule_stepped_that_far(kind, iterations):
    """Schedule.rate(k, j) is the rate transformers' scheduler gives at optimiser step k i + j when stepped there."""
    from transformers import get_scheduler

    cfg = GRPOConfig(max_steps=10, num_iterations=iterations, lr_scheduler_type=kind, warmup_ratio=0.2,
                     learning_rate=1e-3)
    schedule = Schedule.from_config(cfg.optim, cfg.max_steps)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    reference = get_scheduler(kind, opt, num_warmup_steps=schedule.warmup, num_training_steps=10 * iterations)
    for k in range(10):
        for j in range(iterations):
            assert schedule.rate(k, j) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12, abs=1e-18)
            opt.step()
            reference.step()
    assert schedule.warmup == math.ceil(0.2 * 10 * iterations)


def test_the_optimiser_takes_the_configs_betas_and_epsilon():
    cfg = GRPOConfig(adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6, weight_decay=0.1)
    group = make_optimizer(cfg.optim, [torch.nn.Parameter(torch.zeros(2))]).param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.8, 0.95), 1e-6, 0.1)


def _config(tmp_path, name, **kw):
    base = dict(output_dir=str(tmp_path / name), sampler="transformers", progress=False, logging_steps=100,
                max_steps=6, prompts_per_step=4, num_generations=4, sync_period=2, lr_scheduler_type="cosine",
                warmup_steps=2, learning_rate=1e-3, save_steps=0, exact_j=False)
    return GRPOConfig(**base | kw)


@pytest.mark.slow
def test_a_run_logs_the_schedule_and_a_resumed_one_continues_it_exactly(tmp_path):
    """Cosine with 2 warm-up steps over 6 steps: the logged learning_rate is Schedule.rate of each step (0 at step 0,
    the peak at step 2, falling after); a run stopped by Ctrl-C after step 2 and resumed logs the same rates, losses
    and gradient norms as the uninterrupted run, and a resume with another schedule is refused in one line."""
    full = read_metrics(train(_config(tmp_path, "full"), log=lambda *a: None))
    x = _config(tmp_path, "x")
    schedule = Schedule.from_config(x.optim, x.max_steps)
    assert [r["learning_rate"] for r in full] == pytest.approx([schedule.rate(k) for k in range(6)], rel=1e-12)
    assert full[0]["learning_rate"] == 0.0 and full[2]["learning_rate"] == pytest.approx(1e-3)
    assert full[3]["learning_rate"] > full[4]["learning_rate"] > full[5]["learning_rate"] > 0

    def ctrl_c_after_step_2(step, row):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    cfg = _config(tmp_path, "resumed")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, log=lambda *a: None, callbacks=[ctrl_c_after_step_2])
    with pytest.raises(ValueError, match="^lr_scheduler_type: the checkpoint's schedule"):
        train(cfg.replace(max_steps=8), log=lambda *a: None)  # a cosine over 8 steps is another schedule
    resumed = read_metrics(train(cfg, log=lambda *a: None))
    for a, b in zip(full, resumed, strict=True):
        assert a["learning_rate"] == b["learning_rate"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5) and a["grad_norm"] == pytest.approx(b["grad_norm"],
                                                                                                   rel=1e-4)
