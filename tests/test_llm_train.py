"""End-to-end training on the built-in task with the transformers sampler (CPU, tiny model)."""

import os
import signal

import numpy as np
import pytest
import torch

from llm import GRPOConfig, train
from llm.rundir import read_metrics
from llm.tiny import tiny_model_dir
from llm.batch import completion_logprobs, make_batch
from llm.model import load_policy

#: Learning test: mean reward over the last WINDOW steps must beat the first WINDOW by this margin.
LEARNING_MARGIN = 0.08
WINDOW = 10
#: Right after a sync, pi_k = alpha: is_weight within this of 1 and TV within this of 0
#: (sampler and trainer compute the same log-probs with and without a KV cache).
SYNC_TOL = 1e-4


def _config(tmp_path, name, **kw):
    base = dict(output_dir=str(tmp_path / name), sampler="transformers", progress=False, logging_steps=1000, seed=0)
    base.update(kw)
    return GRPOConfig(**base)


def _rewards(run):
    return np.array([row["reward"] for row in read_metrics(run)])


@pytest.mark.slow
@pytest.mark.parametrize("v", [1, 4])
def test_reward_rises(tmp_path, v):
    run = train(_config(tmp_path, f"v{v}", max_steps=80, sync_period=v), log=lambda *a: None)
    r = _rewards(run)
    assert len(r) == 80
    first, last = r[:WINDOW].mean(), r[-WINDOW:].mean()
    assert last - first >= LEARNING_MARGIN, (first, last)


@pytest.mark.slow
def test_off_policy_diagnostics_follow_the_sync_cycle(tmp_path):
    """v = 4: after the first update pi_k != alpha (is_weight departs from 1, TV > 0); right after
    each sync they return to 1 and 0."""
    run = train(_config(tmp_path, "diag", max_steps=12, sync_period=4), log=lambda *a: None)
    rows = read_metrics(run)
    assert [r["lag"] for r in rows] == [0, 1, 2, 3] * 3
    for r in rows:
        if r["lag"] == 0:
            assert abs(r["is_weight/mean"] - 1) < SYNC_TOL and r["tv/pi_k_alpha"] < SYNC_TOL
            assert r["tv/pi_k_alpha_tok_ub"] < SYNC_TOL
        else:
            assert r["is_weight/max"] - r["is_weight/min"] > 1e-3
            assert r["tv/pi_k_alpha"] > 1e-3 and r["tv/pi_k_alpha_tok_ub"] > 0
        assert r["tv/pi_new_alpha"] > 0
        # token-level chain rule bound is an upper bound of TV; the IS estimate is noisy but the two agree in size
        assert np.isfinite(r["bound/lower"]) and r["bound/lower_tight"] >= r["bound/lower"]
    for key in ("time/generate", "time/optimise", "time/sync", "entropy", "kl", "clip_ratio/low_mean",
                "clip_ratio/high_mean", "frac_reward_zero_std", "completions/mean_length", "improvement"):
        assert key in rows[0]


@pytest.mark.slow
def test_resume_continues_the_same_run(tmp_path):
    """An interrupted run resumed from its checkpoint equals an uninterrupted one, row for row."""
    kw = dict(max_steps=6, sync_period=2, save_steps=0)
    full = read_metrics(train(_config(tmp_path, "full", **kw), log=lambda *a: None))

    def ctrl_c_after_step_3(step, row):  # as if the user pressed Ctrl-C during step 3
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    cfg = _config(tmp_path, "resumed", **kw)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, log=lambda *a: None, callbacks=[ctrl_c_after_step_3])
    # step 3 was finished and logged, then the run saved and stopped
    assert [r["step"] for r in read_metrics(cfg.output_dir)] == [0, 1, 2, 3]
    resumed = read_metrics(train(cfg, log=lambda *a: None))
    assert [r["step"] for r in resumed] == list(range(6))
    for a, b in zip(full, resumed):
        assert a["reward"] == b["reward"] and a["lag"] == b["lag"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)


def test_resume_refuses_a_different_config(tmp_path):
    cfg = _config(tmp_path, "x", max_steps=1)
    train(cfg, log=lambda *a: None)
    with pytest.raises(ValueError, match="output_dir: .* different config \\(sync_period\\)"):
        train(cfg.replace(sync_period=3), log=lambda *a: None)


def test_metrics_rows_after_the_checkpoint_are_dropped_on_resume(tmp_path):
    from llm.rundir import RunDir

    cfg = _config(tmp_path, "trunc", max_steps=3)
    train(cfg, log=lambda *a: None)
    run = RunDir(cfg.replace(max_steps=5))
    run.append_metrics({"step": 3, "reward": 0.0})  # as if a crash happened after logging step 3
    ckpt = run.open()
    assert ckpt["step"] == 3
    assert [r["step"] for r in read_metrics(cfg.output_dir)] == [0, 1, 2]


def test_positions_match_generation_with_left_padding():
    """Trainer log-probs of a batch with left-padded prompts equal those of each sequence alone."""
    policy, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    prompts = [tok("1+2=").input_ids, tok("13+7=").input_ids]
    comps = [tok("3").input_ids + [tok.eos_token_id], tok("20").input_ids + [tok.eos_token_id]]
    with torch.no_grad():
        both, _ = completion_logprobs(policy, make_batch(prompts, comps, tok.pad_token_id, "cpu"), 1.0)
        for j in range(2):
            alone, _ = completion_logprobs(policy, make_batch([prompts[j]], [comps[j]], tok.pad_token_id, "cpu"), 1.0)
            n = len(comps[j])
            assert torch.allclose(both[j, :n], alone[0, :n], atol=1e-5)
