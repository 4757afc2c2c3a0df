"""Ratios that cannot overflow, and what a non-finite loss does: bounded_ratios against the unbounded objective,
extreme log-probability gaps, a stale engine, NaN losses (skipped updates, then a one-line stop)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from llm import GRPOConfig, train
from llm.tensors.loss import LOG_RATIO_MAX, clip_objective_torch, grpo_loss, loss_weights
from llm.run.rundir import read_metrics
from runkit.cli import RunError


def _loss_and_grad(fn, logp, logp_k, logp_alpha, adv, clip):
    x = torch.tensor(logp, dtype=torch.float32, requires_grad=True)
    k, a = torch.tensor(logp_k, dtype=torch.float32), torch.tensor(logp_alpha, dtype=torch.float32)
    A = torch.tensor(adv, dtype=torch.float32)
    w = loss_weights(torch.ones_like(x), "dapo", x.shape[1])
    loss = fn(x, k, a, A, w, clip)
    loss.backward()
    return float(loss.detach()), x.grad.clone()


def bounded(x, k, a, A, w, clip):
    return grpo_loss(x, k, a, A, w, clip=clip)[0]


def unbounded(x, k, a, A, w, clip):
    """The objective as written, exponentiating the raw log-ratios."""
    return (-clip_objective_torch(torch.exp(x - a), torch.exp(k - a), A[:, None], clip) * w).sum()


log_ratios = st.floats(-60, 88)


@given(l=st.lists(log_ratios, min_size=4, max_size=4), lk=st.lists(st.floats(-60, LOG_RATIO_MAX), min_size=4, max_size=4),
       adv=st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.5, 2.0]), min_size=4, max_size=4),
       clip=st.sampled_from([0.0, 0.1, 0.2, 2.0]))
def test_bounded_ratios_leave_the_objective_and_gradient_unchanged_where_finite(l, lk, adv, clip):
    """Per sequence of one token: same loss and same gradient as the unbounded objective whenever that is
    finite and the log-ratio is below LOG_RATIO_MAX for a negative advantage (above it, and for any log-ratio
    with A >= 0, the unbounded value is inf/NaN or the same)."""
    logp_alpha = np.zeros((4, 1))
    logp = np.array(l)[:, None]
    logp_k = np.array(lk)[:, None]
    keep = [i for i in range(4) if adv[i] >= 0 or l[i] <= LOG_RATIO_MAX]
    if not keep:
        return
    # a ratio on an edge of the clip window to float precision is a tie of min(), whose gradient is a matter of
    # convention (torch splits it, the bounded form does not): not a case of this property
    for i in keep:
        r, rk = math.exp(min(l[i], 700.0)), math.exp(lk[i])
        assume(all(abs(r - edge) > 1e-6 * max(1.0, edge) for edge in (rk + clip, max(rk - clip, 0.0))))
    sel = lambda x: x[keep]  # noqa: E731
    ref, ref_grad = _loss_and_grad(unbounded, sel(logp), sel(logp_k), sel(logp_alpha), [adv[i] for i in keep], clip)
    got, got_grad = _loss_and_grad(bounded, sel(logp), sel(logp_k), sel(logp_alpha), [adv[i] for i in keep], clip)
    if math.isfinite(ref) and torch.isfinite(ref_grad).all():
        # the loss is a float32 sum of per-row terms that may cancel (+-18.5 summing to 0.95): its rounding is relative
        # to the terms' size, not to the sum's (each row's gradient is its own term, compared at rtol 1e-6 below)
        size = sum(abs(_loss_and_grad(unbounded, sel(logp)[[i]], sel(logp_k)[[i]], sel(logp_alpha)[[i]],
                                      [adv[keep[i]]], clip)[0]) for i in range(len(keep)))
        assert got == pytest.approx(ref, rel=1e-6, abs=1e-6 * size)
        torch.testing.assert_close(got_grad, ref_grad, rtol=1e-6, atol=0)
    assert math.isfinite(got) and torch.isfinite(got_grad).all()


@pytest.mark.parametrize("gap", [100.0, 1e4, 1e30, math.inf])
@pytest.mark.parametrize("ratio_level,loss_type", [("token", "dapo"), ("token", "grpo"), ("sequence", "grpo")])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_extreme_log_probability_gaps_give_a_finite_loss_and_gradient(gap, ratio_level, loss_type, beta):
    """A stale or broken engine reports log alpha far below (or above) the trainer's: the loss, its gradient and
    the clip statistics stay finite / counted, for either sign of the advantage."""
    torch.manual_seed(0)
    B, T = 4, 3
    logp = (torch.randn(B, T) - 2).requires_grad_()
    logp_alpha = logp.detach().clone()
    logp_alpha[0] -= gap  # ratio e^gap: overflows exp
    logp_alpha[1] += gap  # ratio e^-gap: underflows to 0
    logp_alpha[2, 1] -= gap
    logp_ref = logp.detach() - torch.tensor([[0.0, gap, 0.0]] * B)  # pi_ref far below pi on one token
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    w = loss_weights(torch.ones(B, T), loss_type, T)
    loss, stats = grpo_loss(logp, logp.detach(), logp_alpha, adv, w, clip=0.2, ratio_level=ratio_level, beta=beta,
                            logp_ref=logp_ref)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and torch.isfinite(logp.grad).all()
    assert stats.tokens == B * T


# ----------------------------------------------------------------------------------------------
# The trainer: skip a non-finite update, stop after K in a row
# ----------------------------------------------------------------------------------------------


def _config(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "run"), sampler="transformers", progress=False, logging_steps=1000,
                seed=0, max_steps=4, prompts_per_step=8, exact_j=False, save_steps=0)
    base.update(kw)
    return GRPOConfig(**base)


class StaleEngine:
    """The sampler reports log alpha 300 nats below the truth on every token of half the completions."""

    def on_setup(self, weights) -> None:
        real = weights.sampler.generate

        def generate(*args, **kw):
            roll = real(*args, **kw)
            for lp in roll.logprobs[::2]:
                lp[:] = [x - 300.0 for x in lp]
            return roll

        weights.sampler.generate = generate

    def __call__(self, step, row) -> None:
        pass


def test_a_stale_engines_extreme_log_probs_train_without_nan(tmp_path):
    """log alpha 300 nats below the truth on every token of half the completions (a ratio of e^300): every
    update is taken and every weight stays finite."""
    cfg = _config(tmp_path, behaviour_logprobs="sampler", verify_sync=False, tv_diagnostics=False)
    rows = read_metrics(train(cfg, log=lambda *a: None, callbacks=[StaleEngine()]))
    assert [r["skipped_updates"] for r in rows] == [0, 0, 0, 0]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert max(r["is_weight/max"] for r in rows) == math.inf  # the raw ratio does overflow: the bound is what saves it
    final = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["policy"]
    assert all(torch.isfinite(t).all() for t in final.values())


class NanAt:
    """The policy's passes with gradients (the optimiser's) give NaN hidden states at the given steps, as a numerical
    failure would; records the policy's weights before step 0 and after every step."""

    def __init__(self, steps: set[int]):
        self.steps, self.step, self.snapshots, self.policy = steps, 0, [], None

    def on_setup(self, weights) -> None:
        self.policy = weights.policy
        self.snapshots.append({k: v.clone() for k, v in weights.policy.state_dict().items()})

        def poison(module, args, output):
            if torch.is_grad_enabled() and self.step in self.steps:
                output.last_hidden_state = output.last_hidden_state * float("nan")
            return output

        weights.policy.get_decoder().register_forward_hook(poison)

    def __call__(self, step, row) -> None:
        self.snapshots.append({k: v.clone() for k, v in self.policy.state_dict().items()})
        self.step = step + 1


def test_a_non_finite_loss_skips_the_update_and_the_run_goes_on(tmp_path):
    nan = NanAt({1})
    rows = read_metrics(train(_config(tmp_path), log=lambda *a: None, callbacks=[nan]))
    assert [r["skipped_updates"] for r in rows] == [0, 1, 0, 0]
    changed = [any(not torch.equal(a[k], b[k]) for k in a) for a, b in zip(nan.snapshots, nan.snapshots[1:])]
    assert changed == [True, False, True, True]  # step 1 left the weights as they were
    assert all(torch.isfinite(t).all() for t in nan.snapshots[-1].values())


def test_k_non_finite_updates_in_a_row_stop_the_run_with_one_line(tmp_path):
    cfg = _config(tmp_path, max_steps=8, max_consecutive_skipped_updates=3)
    with pytest.raises(RunError, match=r"^3 steps in a row ended without an update \(non-finite loss nan .*step 3\)"):
        train(cfg, log=lambda *a: None, callbacks=[NanAt({1, 2, 3, 4, 5})])
    assert [r["skipped_updates"] for r in read_metrics(cfg.output_dir)] == [0, 1, 1, 1]
