"""grpo_theory.objectives: TRL 1.16's CISPO, SAPO and VESPO and DPPO's trust regions on a table, and VCPO's ESS step.
Their torch twins are held equal to them in tests/llm/test_tabular_objectives.py; here, what each must be on its own:
the policy gradient where pi = pi_k = alpha, and a bandit that learns under each of them, stale or not."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_theory.core import softmax
from grpo_theory.corrections import correction
from grpo_theory.loss_types import FRONTIER_OBJECTIVES, loss_type
from grpo_theory.objectives import log_slope, off_policy_keep
from grpo_theory.estimators import kish_ess_fraction
from grpo_theory.vcpo import ess_step_factor
from grpo_theory.simulate import SimConfig, final_j, simulate

#: The frontier's rows whose objective is one of a loss type's own (VCPO's row is a step size on the paper's clip).
OWN_OBJECTIVES = sorted(name for name, kw in FRONTIER_OBJECTIVES.items() if "loss_type" in kw)


@given(st.integers(0, 2**32 - 1), st.sampled_from(OWN_OBJECTIVES), st.integers(2, 12))
def test_on_policy_every_objective_is_the_policy_gradient(seed, name, n):
    """At pi = pi_k = alpha every sample's coefficient in log pi(y) is its advantage (CISPO's cap min(1, 5) = 1,
    SAPO's gate slope 4 s(0)(1 - s(0)) = 1, VESPO's phi(1) = 1, DPPO inside its region with pi/alpha = 1), so the
    step ascends E_alpha[A grad log pi], the on-policy GRPO gradient, whatever the objective."""
    rng = np.random.default_rng(seed)
    kw = FRONTIER_OBJECTIVES[name]
    config = SimConfig(**kw)
    pi = softmax(rng.normal(size=n) * 2)
    adv = rng.normal(size=n)
    weight = correction(config.importance_sampling_mode).weight(np.ones(n), config.importance_sampling_cap)
    coef, low, high = log_slope(loss_type(config.loss_type).objective, np.log(pi), np.log(pi), np.log(pi), adv,
                                weight, config)
    np.testing.assert_allclose(coef, adv, rtol=1e-12, atol=1e-15)
    assert not low.any() and not high.any()


def test_the_off_policy_mask_drops_only_negative_advantages_far_below_alpha():
    logp = np.log([0.1, 0.1, 0.5, 0.5])
    logp_alpha = np.log([0.5, 0.5, 0.5, 0.1])
    adv = np.array([-1.0, 1.0, -1.0, -1.0])
    assert off_policy_keep(logp, logp_alpha, adv, 1.0).tolist() == [False, True, True, True]
    assert off_policy_keep(logp, logp_alpha, adv, 2.0).all() and off_policy_keep(logp, logp_alpha, adv, None).all()


@pytest.mark.parametrize("name", sorted(FRONTIER_OBJECTIVES))
@pytest.mark.parametrize("v", [1, 16])
def test_the_bandit_learns_under_every_objective(name, v):
    """Exact J rises by the margin the clip's learning test asks (0.2 over 200 steps), synchronous and 16 steps
    stale, population mode (exact gradients) at the frontier's learning rate."""
    rows = simulate(SimConfig(max_steps=200, population=True, learning_rate=2.0, sync_period=v,
                              **FRONTIER_OBJECTIVES[name]))
    assert final_j(rows) - rows[0]["j/pi_k"] >= 0.2, final_j(rows)
    if v > 1:
        assert max(r["tv/pi_k_alpha"] for r in rows) > 0.005  # the samples were stale


@pytest.mark.parametrize("population", [True, False])
def test_at_one_gradient_step_per_batch_cispo_and_sapo_are_trls_truncation(population):
    """At i = 1 each step's gradient is taken at pi = pi_k, where CISPO's (min(rho, 5) = 1), SAPO's (gate slope 1)
    and the truncated clip's coefficients are all w A: the runs agree to rounding (the bandit frontier's rows are
    equal to the digit). At i = 3 pi leaves pi_k within the step and the three part."""
    base = dict(max_steps=40, population=population, learning_rate=2.0, sync_period=8, seed=1)
    truncate = dict(importance_sampling_mode="token_truncate", importance_sampling_cap=3.0)
    runs = {}
    for i in (1, 3):
        for name, kw in (("truncate", truncate), ("cispo", FRONTIER_OBJECTIVES["cispo (token_truncate, eps_high 5)"]),
                         ("sapo", FRONTIER_OBJECTIVES["sapo (token_truncate)"])):
            runs[name, i] = np.array([r["j/pi_k"] for r in simulate(SimConfig(num_iterations=i, **base, **kw))])
    np.testing.assert_allclose(runs["cispo", 1], runs["truncate", 1], rtol=1e-9)
    np.testing.assert_allclose(runs["sapo", 1], runs["truncate", 1], rtol=1e-9)
    assert np.abs(runs["sapo", 3] - runs["truncate", 3]).max() > 1e-4
    assert np.abs(runs["cispo", 3] - runs["truncate", 3]).max() > 1e-6


@pytest.mark.parametrize("args, needle", [
    (["--frontier-corrections"], "frontier_corrections: expected one or more names"),
    (["--frontier-corrections", "paper clip", "paper clip"], "each name once"),
    (["--frontier-v", "1", "1"], "distinct sync periods"),
])
def test_the_frontier_grid_refuses_an_empty_or_repeated_axis(args, needle, capsys):
    """An empty list of corrections wrote an empty table and exited 0; a repeated v or name repeated its rows and
    reused their run directories."""
    from grpo_theory.experiments import ExperimentConfig
    from runkit.cli import parse

    with pytest.raises(SystemExit) as exit_info:
        parse(ExperimentConfig, ["--experiment", "frontier", *args], prog="python -m grpo_theory.experiments")
    assert exit_info.value.code == 2 and needle in capsys.readouterr().err


def test_cispo_with_a_zero_cap_is_refused_and_one_below_1_warns():
    with pytest.raises(ValueError, match="epsilon_high: with cispo"):
        SimConfig(loss_type="cispo", importance_sampling_mode="token_truncate", epsilon_high=0.0)
    with pytest.warns(UserWarning, match="below 1"):
        SimConfig(loss_type="cispo", importance_sampling_mode="token_truncate")


@given(st.lists(st.floats(1e-6, 1e6), min_size=1, max_size=64), st.floats(0.01, 1.0))
def test_vcpos_step_factor_is_its_papers_rule(weights, base):
    """sqrt (or linear) of min(1, rho / base), rho the Kish ESS fraction (sum w)^2 / (n sum w^2): in (0, 1], 1 with
    equal weights, and never above sqrt of the ESS fraction over the base."""
    w = np.array(weights)
    rho = float(np.sum(w) ** 2 / (w.size * np.sum(w**2)))
    assert kish_ess_fraction(w) == pytest.approx(rho, rel=1e-12)
    assert ess_step_factor(rho, "sqrt", base) == pytest.approx(min(1.0, rho / base) ** 0.5, rel=1e-12)
    assert ess_step_factor(rho, "linear", base) == pytest.approx(min(1.0, rho / base), rel=1e-12)
    assert ess_step_factor(rho, "none", base) == 1.0
    assert 0 < ess_step_factor(rho, "sqrt", base) <= 1
    assert ess_step_factor(kish_ess_fraction(np.full(w.size, w[0])), "sqrt", base) == pytest.approx(1.0)


def test_vcpos_step_on_the_bandit():
    """Population mode: each step's factor is sqrt of the exact ESS fraction of pi_k/alpha the step logs; in sync
    (v = 1: pi_k = alpha) it is 1 and the run is the plain clip's to the bit, as it is never syncing with a base so
    small that no ESS falls below it; never syncing it slows the steps (factor < 1) and the bandit still learns."""
    base = dict(max_steps=120, population=True, learning_rate=2.0, seed=3)
    stale = simulate(SimConfig(sync_period=1000, ess_scaling="sqrt", **base))
    factor = np.array([r["ess_scaling/lr_factor"] for r in stale])
    np.testing.assert_allclose(factor, np.sqrt([r["ess/pi_k_alpha"] for r in stale]), rtol=1e-12)
    assert factor[0] == 1.0 and factor.min() < 0.9
    assert final_j(stale) - stale[0]["j/pi_k"] >= 0.2
    j = lambda rows: [r["j/pi_k"] for r in rows]  # noqa: E731
    assert j(simulate(SimConfig(sync_period=1, ess_scaling="sqrt", **base))) == j(simulate(SimConfig(sync_period=1,
                                                                                                     **base)))
    assert j(simulate(SimConfig(sync_period=1000, ess_scaling="linear", ess_scaling_base_ess_ratio=1e-9, **base))) \
        == j(simulate(SimConfig(sync_period=1000, **base)))
    assert j(stale) != j(simulate(SimConfig(sync_period=1000, **base)))
    with pytest.raises(ValueError, match="ess_scaling_base_ess_ratio"):
        SimConfig(ess_scaling="sqrt", ess_scaling_base_ess_ratio=0.0)


def test_vcpos_baseline_on_the_bandit():
    """VCPO's baseline, b* = sum W R / sum W with W_i = ||g_i||^2 w_i^2, moves a sampled group's advantages to
    (R - b*) / s (checked by hand on one step's first varied group), and leaves the exact gradient of population mode
    unchanged at i = 1, however far it moves the advantages: a baseline constant over a prompt's actions adds
    b sum_y pi_k(y) (e_y - pi_k) = 0 to it."""
    from grpo_theory.simulate import baselined_advantages, make_bandit, sample_rollout

    base = dict(max_steps=60, population=True, learning_rate=2.0, sync_period=16, seed=2)
    with_b = simulate(SimConfig(grad_baselining=True, **base))
    j = lambda rows: np.array([r["j/pi_k"] for r in rows])  # noqa: E731
    np.testing.assert_allclose(j(with_b), j(simulate(SimConfig(**base))), rtol=1e-9)
    assert np.mean([r["grad_baselining/advantage_shift"] for r in with_b]) > 0.1

    config = SimConfig(grad_baselining=True, prompts_per_step=16)
    bandit, rng = make_bandit(config), np.random.default_rng(0)
    alpha = softmax(bandit.logits0)
    pi_k = softmax(bandit.logits0 + rng.normal(size=alpha.shape))
    roll = sample_rollout(config, bandit, alpha, rng)
    shifted, shift = baselined_advantages(config, bandit, roll, pi_k, alpha)
    g = int(np.flatnonzero(np.ptp(roll.adv, axis=1) > 0)[0])
    x, ys, adv = roll.xs[g], roll.ys[g], roll.adv[g]
    w = pi_k[x, ys] / alpha[x, ys]  # the paper clip's coefficient at pi = pi_k, A = 1
    big_w = w**2 * (1 - 2 * pi_k[x, ys] + np.sum(pi_k[x] ** 2)) * w**2
    np.testing.assert_allclose(shifted[g], adv - np.sum(big_w * adv) / np.sum(big_w), rtol=1e-10)
    flat = np.ptp(roll.adv, axis=1) == 0
    np.testing.assert_array_equal(shifted[flat], roll.adv[flat])  # a group without varied advantages keeps them
    assert shift > 0
