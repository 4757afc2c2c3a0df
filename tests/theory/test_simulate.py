"""The bandit simulator of Algorithm 1 (grpo_theory.simulate)."""

import subprocess
import sys

import numpy as np
import pytest

from grpo_theory import core
from grpo_theory.core import softmax
from grpo_theory.simulate import SimConfig, final_j, make_bandit, objective_gradient, sample_rollout, simulate

CONFIGS = {
    "on-policy G=8": dict(),
    "on-policy G=2": dict(num_generations=2),
    "masked": dict(mask_zero_std_groups=True),
    "off-policy v=10": dict(sync_period=10, learning_rate=3.0),
    "reuse i=10": dict(num_iterations=10),
    "population": dict(population=True),
    "population off-policy masked": dict(population=True, sync_period=4, mask_zero_std_groups=True),
    "continuous stochastic KL": dict(rewards="continuous", stochastic_rewards=True, beta=0.1, ref_sync_steps=20),
    "eps = 0, large clip": dict(variance_eps=0.0, epsilon=1.0, sync_period=3),
    "asynchronous v=4": dict(sync_period=4, async_generation=True, learning_rate=3.0),
    "asynchronous v=1 population": dict(population=True, async_generation=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_exact_bound_never_exceeds_improvement(name):
    rows = simulate(SimConfig(max_steps=150, **CONFIGS[name]))
    for r in rows:
        assert r["bound/slack"] >= -r["bound/tolerance"], (name, r["step"], r)
        assert r["bound/slack_tight"] >= -r["bound/tolerance_tight"], (name, r["step"], r)
    if CONFIGS[name].get("sync_period", 1) > 1:
        assert any(r["tv/pi_k_alpha"] > 0 for r in rows) and all(r["tv/pi_k_alpha"] == 0 for r in rows if r["lag"] == 0)


def _finite_difference(objective, theta, h=1e-6):
    fd = np.zeros_like(theta)
    for idx in np.ndindex(theta.shape):
        e = np.zeros_like(theta)
        e[idx] = h
        fd[idx] = (objective(theta + e) - objective(theta - e)) / (2 * h)
    return fd


def _policies(b, seed=0, scale=0.1):
    rng = np.random.default_rng(seed)
    theta = b.logits0 + scale * rng.standard_normal(b.logits0.shape)
    pi_k = softmax(b.logits0 + 0.05 * rng.standard_normal(b.logits0.shape))
    ref = softmax(b.logits0 + 0.3 * rng.standard_normal(b.logits0.shape))
    return theta, pi_k, softmax(b.logits0), ref


def _kl(p, q):
    return np.sum(p * np.log(p / q), axis=-1)


def test_population_gradient_is_gradient_of_the_masked_objective():
    """Population mode: the simulator's gradient equals finite differences of an independently written
    objective, sum_x rho_x keep_x [E_alpha f_eps(pi/alpha, pi_k/alpha, A) - beta KL(pi_x || ref_x)]: the
    zero-variance mask removes a prompt from the clipped term and the KL alike."""
    cfg = SimConfig(n_prompts=4, n_actions=5, rewards="continuous", seed=3, population=True, beta=0.3)
    b = make_bandit(cfg)
    theta, pi_k, alpha, ref = _policies(b)
    roll = sample_rollout(cfg, b, alpha, np.random.default_rng(0))
    roll.keep = np.array([True, False, True, True])
    adv = core.whitened_advantage(alpha, b.table, cfg.variance_eps)

    def objective(th):
        pi = softmax(th)
        f = np.sum(alpha * core.clip_objective(pi / alpha, pi_k / alpha, adv, cfg.epsilon), axis=1)
        return float(np.sum(b.rho * roll.keep * (f - cfg.beta * _kl(pi, ref))))

    grad, _, _ = objective_gradient(cfg, b, roll, theta, pi_k, alpha, ref)
    assert np.allclose(grad, _finite_difference(objective, theta), atol=1e-6)
    assert np.all(grad[1] == 0)


def test_sampled_gradient_is_gradient_of_the_masked_objective():
    """Sampled mode: the gradient equals finite differences of the mean over kept groups' samples of f_eps
    minus beta times the mean over kept prompts of KL(pi_x || ref_x)."""
    cfg = SimConfig(n_prompts=4, n_actions=5, rewards="continuous", seed=4, prompts_per_step=6,
                    num_generations=4, beta=0.3, epsilon=0.05)
    b = make_bandit(cfg)
    theta, pi_k, alpha, ref = _policies(b, 1, scale=0.5)
    roll = sample_rollout(cfg, b, alpha, np.random.default_rng(1))
    roll.keep = np.array([True, True, False, True, False, True])
    xs, ys, adv, keep = roll.xs, roll.ys, roll.adv, roll.keep

    def objective(th):
        pi = softmax(th)
        total = 0.0
        for bi in np.flatnonzero(keep):
            x, y = xs[bi], ys[bi]
            f = core.clip_objective(pi[x, y] / alpha[x, y], pi_k[x, y] / alpha[x, y], adv[bi], cfg.epsilon)
            total += f.sum() / (keep.sum() * cfg.num_generations) - cfg.beta * _kl(pi[x], ref[x]) / keep.sum()
        return total

    grad, low, high = objective_gradient(cfg, b, roll, theta, pi_k, alpha, ref)
    assert low + high > 0  # some samples are clipped: the test covers the clip's zero gradient too
    assert np.allclose(grad, _finite_difference(objective, theta), atol=1e-6)


def test_simulator_uses_core_advantages():
    """Population mode with a single step: the logged surrogate is core.surrogate of the new policy."""
    cfg = SimConfig(population=True, max_steps=1, rewards="continuous")
    rows = simulate(cfg)
    b = make_bandit(cfg)
    alpha = softmax(b.logits0)
    # one gradient step of size lr on the exact objective, recomputed here from core functions
    adv = core.whitened_advantage(alpha, b.table, cfg.variance_eps)
    g_y = alpha * adv
    theta = b.logits0 + cfg.learning_rate * b.rho[:, None] * (g_y - alpha * g_y.sum(1, keepdims=True))
    expected = float(np.sum(b.rho * core.surrogate(softmax(theta), alpha, b.table, cfg.variance_eps)))
    assert rows[0]["bound/surrogate"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("kw", [dict(), dict(sync_period=10, learning_rate=3.0), dict(population=True)])
def test_reward_rises(kw):
    cfg = SimConfig(max_steps=200, **kw)
    rows = simulate(cfg)
    assert final_j(rows) - rows[0]["j/pi_k"] >= 0.2


def test_run_directory(tmp_path):
    from runkit.runio import read_config, read_metrics

    cfg = SimConfig(max_steps=5, output_dir=str(tmp_path / "run"))
    simulate(cfg)
    assert read_config(cfg.output_dir)["sync_period"] == 1
    rows = read_metrics(cfg.output_dir)
    assert [r["step"] for r in rows] == list(range(5))
    for key in ("reward", "j/pi_k", "improvement", "bound/surrogate", "bound/penalty_tv", "bound/penalty_lag",
                "bound/lower", "bound/lower_tight", "tv/pi_new_alpha", "tv/pi_k_alpha", "frac_reward_zero_std",
                "kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "lag"):
        assert key in rows[0]


@pytest.mark.parametrize("args,needle", [(["--num-generations", "1"], "G >= 2"), (["--sync-period", "0"], "v must be"),
                                         (["--variance-eps", "1"], "variance_eps")])
def test_cli_errors(args, needle):
    res = subprocess.run([sys.executable, "-m", "grpo_theory.simulate", *args], capture_output=True, text=True)
    assert res.returncode == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("v", [1, 3])
def test_asynchronous_lag_is_the_true_age_of_the_sampling_weights(v, monkeypatch):
    """With asynchronous generation the samples of step k come from pi_{k - lag}: the logged lag is the age of the
    weights that really produced them, v to 2v - 1 from the third window on (the first two use the initial weights)."""
    import grpo_theory.simulate as sim_mod

    policies, alphas, real_grad, real_roll = {}, [], sim_mod.objective_gradient, sim_mod.sample_rollout

    def grad(config, bandit, roll, theta, pi_k, alpha, ref):
        policies.setdefault(len(alphas) - 1, pi_k.copy())  # pi_k of the current step (first inner step)
        return real_grad(config, bandit, roll, theta, pi_k, alpha, ref)

    def roll(config, bandit, alpha, rng):
        alphas.append(alpha.copy())
        return real_roll(config, bandit, alpha, rng)

    monkeypatch.setattr(sim_mod, "objective_gradient", grad)
    monkeypatch.setattr(sim_mod, "sample_rollout", roll)
    rows = simulate(SimConfig(max_steps=6 * v + 2, sync_period=v, async_generation=True, learning_rate=3.0))
    for r in rows:
        k, lag = r["step"], r["lag"]
        assert np.array_equal(alphas[k], policies[k - lag]), (k, lag)
        assert lag == k if k < 2 * v else v <= lag <= 2 * v - 1
    assert rows[-1]["tv/pi_k_alpha"] > 0  # alpha is really another policy


@pytest.mark.slow
@pytest.mark.parametrize("v,async_generation", [(4, False), (16, True)])
def test_the_simulators_improvement_certificate_against_the_exact_improvement(v, async_generation):
    """Held-out estimates in the simulator, as the LLM trainer computes them, against the exact improvement of each
    step: the estimate is unbiased (its mean error over 400 steps within 3 standard errors of 0), the 95% lower
    confidence bound exceeds the exact improvement on at most 8% of steps, and the run itself (J, the exact terms) is
    the same with or without held-out prompts (their own random stream). The t bound (more powerful, exact for
    normal estimates) certifies some steps here; the default bound keeps its level too."""
    kw = dict(n_prompts=32, stochastic_rewards=True, sync_period=v, async_generation=async_generation, max_steps=400,
              learning_rate=0.5, seed=3)
    rows = simulate(SimConfig(heldout_prompts=16, improvement_lcb_method="t_unguaranteed", **kw))
    plain = simulate(SimConfig(**kw))
    assert [r["improvement"] for r in rows] == [r["improvement"] for r in plain]
    exact = np.array([r["improvement"] for r in rows])
    diff = np.array([r["heldout/improvement"] for r in rows]) - exact
    assert abs(diff.mean()) <= 3 * diff.std(ddof=1) / np.sqrt(len(diff)), (diff.mean(), diff.std())
    exceed = np.mean([r["heldout/improvement_lcb"] > r["improvement"] for r in rows])
    certified = np.mean([r["heldout/improvement_lcb"] > 0 for r in rows])
    assert exceed <= 0.08, exceed
    assert certified > 0, certified  # the certificate is not vacuous here
    default = simulate(SimConfig(heldout_prompts=16, **kw))
    assert np.mean([r["heldout/improvement_lcb"] > r["improvement"] for r in default]) <= 0.05


#: The corrections the simulator takes besides the paper's clip, with caps that bind on ``_policies``' tables
#: (pi_k/alpha within about 10% of 1).
CORRECTIONS = {
    "truncate": dict(importance_sampling_mode="token_truncate", importance_sampling_cap=1.03),
    "mask": dict(importance_sampling_mode="sequence_mask", importance_sampling_cap=1.03),
    "icepop-like two-sided mask": dict(importance_sampling_mode="token_mask", importance_sampling_cap=1.03,
                                       importance_sampling_cap_min=0.97),
    "m2po": dict(importance_sampling_mode="m2po", m2_threshold=2e-4),
    "seq_max_k2 (TRM)": dict(importance_sampling_mode="seq_max_k2", rollout_rs_threshold=1e-4),
}


@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_population_gradient_of_each_correction_is_the_gradient_of_its_exact_surrogate(name):
    """Population mode, one prompt: the simulator's gradient under a correction equals finite differences of
    ``corrections.corrected_surrogate`` (written from the objective, not from its slope), and differs from the
    paper clip's gradient (the caps bind)."""
    from grpo_theory.corrections import corrected_surrogate

    kw = CORRECTIONS[name]
    cfg = SimConfig(n_prompts=1, n_actions=8, rewards="continuous", seed=5, population=True, **kw)
    b = make_bandit(cfg)
    theta, pi_k, alpha, ref = _policies(b, 2)
    roll = sample_rollout(cfg, b, alpha, np.random.default_rng(0))
    caps = dict(mode=kw["importance_sampling_mode"], cap=cfg.importance_sampling_cap,
                cap_min=cfg.importance_sampling_cap_min, m2_threshold=cfg.m2_threshold,
                rollout_rs_threshold=cfg.rollout_rs_threshold)

    def objective(th):
        return float(corrected_surrogate(softmax(th), pi_k, alpha, b.table, cfg.variance_eps, cfg.epsilon, **caps)[0])

    grad, _, _ = objective_gradient(cfg, b, roll, theta, pi_k, alpha, ref)
    paper, _, _ = objective_gradient(SimConfig(n_prompts=1, n_actions=8, rewards="continuous", seed=5,
                                               population=True), b, roll, theta, pi_k, alpha, ref)
    assert np.allclose(grad, _finite_difference(objective, theta), atol=1e-7)
    assert not np.allclose(grad, paper, atol=1e-4)


@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_sampled_gradient_of_each_correction_is_the_gradient_of_its_batch_objective(name):
    """Sampled mode: the gradient equals finite differences of the mean over the kept groups' samples of
    ``corrected_objective``; a step mask (M2PO's, TRM's) is the mode's ``keep`` of every sample's log pi_k/alpha (the
    kept groups' and the masked ones': the paper's batch)."""
    from grpo_theory.corrections import corrected_objective, correction

    kw = CORRECTIONS[name]
    cfg = SimConfig(n_prompts=4, n_actions=5, rewards="continuous", seed=4, prompts_per_step=6, num_generations=4,
                    **kw)
    b = make_bandit(cfg)
    theta, pi_k, alpha, ref = _policies(b, 1, scale=0.3)
    roll = sample_rollout(cfg, b, alpha, np.random.default_rng(1))
    roll.keep = np.array([True, True, False, True, False, True])
    xs, ys, adv, keep = roll.xs, roll.ys, roll.adv, roll.keep
    kept = np.flatnonzero(keep)
    ratio_k = pi_k[xs[kept, None], ys[kept]] / alpha[xs[kept, None], ys[kept]]
    every_k = pi_k[xs[:, None], ys] / alpha[xs[:, None], ys]
    mode = correction(kw["importance_sampling_mode"])
    threshold = mode.threshold(cfg.m2_threshold, cfg.rollout_rs_threshold)
    m2 = None if not mode.step_mask else mode.keep(np.log(every_k).ravel(), np.broadcast_to(adv, every_k.shape).ravel(),
                                                   None, threshold).reshape(every_k.shape)[kept]

    def objective(th):
        pi = softmax(th)
        ratio = pi[xs[kept, None], ys[kept]] / alpha[xs[kept, None], ys[kept]]
        f = corrected_objective(ratio, ratio_k, adv[kept], cfg.epsilon, kw["importance_sampling_mode"],
                                cfg.importance_sampling_cap, cap_min=cfg.importance_sampling_cap_min, keep=m2)
        return float(f.sum() / ratio.size)

    grad, _, _ = objective_gradient(cfg, b, roll, theta, pi_k, alpha, ref)
    assert np.allclose(grad, _finite_difference(objective, theta), atol=1e-6)
    if mode.step_mask:
        assert 0 < m2.sum() < m2.size  # the mask drops some samples and keeps others


def test_exact_ess_is_the_limit_of_kishs_fraction_over_a_large_sample():
    """``ess/pi_k_alpha`` = 1 / E_{x ~ rho, y ~ alpha}[(pi_k/alpha)^2], against Kish's fraction (the LLM trainer's
    estimator) over 400,000 draws of (x, y); 1 where pi_k = alpha."""
    from grpo_theory.estimators import kish_ess_fraction
    from grpo_theory.simulate import exact_diagnostics

    b = make_bandit(SimConfig(n_prompts=6, n_actions=5, seed=2))
    rng = np.random.default_rng(3)
    pi_k, alpha = softmax(b.logits0 + 0.5 * rng.standard_normal(b.logits0.shape)), softmax(b.logits0)
    exact = exact_diagnostics(b, pi_k, pi_k, alpha, alpha, 1e-4)["ess/pi_k_alpha"]
    xs = rng.choice(len(b.rho), size=400_000, p=b.rho)
    ys = (rng.random(xs.size)[:, None] > np.cumsum(alpha[xs], axis=1)).sum(axis=1)
    sampled = kish_ess_fraction(pi_k[xs, ys] / alpha[xs, ys])
    assert 0.3 < exact < 0.95 and sampled == pytest.approx(exact, rel=0.02)
    assert exact_diagnostics(b, alpha, alpha, alpha, alpha, 1e-4)["ess/pi_k_alpha"] == pytest.approx(1.0, abs=1e-12)


@pytest.mark.slow
def test_the_frontier_table_has_every_correction_staleness_and_generation(tmp_path, capsys):
    """``python -m grpo_theory.experiments --experiment frontier`` (a short version): one row per correction, sync
    period and generation mode; its reference row (paper clip, v = 1, sync) is within one standard deviation of
    itself."""
    from grpo_theory.experiments import FRONTIER_CORRECTIONS, FRONTIER_V, main

    assert main(["--experiment", "frontier", "--seeds", "2", "--max-steps", "6", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "frontier" / "results.md").read_text()
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| correction")]
    assert len(rows) == len(FRONTIER_CORRECTIONS) * len(FRONTIER_V) * 2
    assert rows[0].startswith("| paper clip | 1 | sync |") and rows[0].endswith("| yes |")
    assert any("| never | async |" in r for r in rows)
