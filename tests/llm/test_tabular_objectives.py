"""The bandit's tabular forms of TRL 1.16's objectives and DPPO's trust regions (``grpo_theory.objectives``) against
their torch twins in the LLM loss: on one-token rows, the coefficient of each sample is the autograd gradient of
``grpo_loss`` in log pi, and the bandit simulator's whole step gradient in the logits is the gradient of the LLM loss
over the table's rows weighted as the simulator weighs them (population and sampled)."""

import dataclasses

import numpy as np
import pytest
import torch

import grpo_theory as gt
from grpo_theory.corrections import correction
from grpo_theory.loss_types import loss_type
from grpo_theory.objectives import log_slope, off_policy_keep
from grpo_theory.simulate import SimConfig, make_bandit, objective_gradient, sample_rollout
from llm.tensors.loss import Clip, grpo_loss

#: Each objective with the importance-sampling modes it combines with (``require_loss_type_settings``) and an upper
#: width of its own (CISPO's is a cap on pi/pi_k; DPPO's a trust region).
CASES = [
    ("cispo", "token_truncate", 5.0), ("cispo", "token_mask", 2.0), ("cispo", "sequence_truncate", 0.2),
    ("cispo", "none", 5.0),
    ("sapo", "token_truncate", None), ("sapo", "sequence_mask", None), ("sapo", "none", None),
    ("vespo", "token_truncate", None), ("vespo", "token_mask", None), ("vespo", "none", None),
    ("dppo_tv", "paper", 0.15), ("dppo_tv", "paper", 0.05), ("dppo_kl", "paper", 0.05), ("dppo_kl", "paper", None),
    ("grpo", "paper", 0.28), ("grpo", "token_truncate", None),
]


def _spec(objective_type, mode, high, threshold, cap=1.5):
    return Clip(epsilon=0.2, epsilon_high=high, importance_sampling_mode=mode, importance_sampling_cap=cap,
                objective=loss_type(objective_type).objective, off_policy_mask_threshold=threshold)


def _table(seed, n=9):
    """One prompt's table: alpha, pi_k and pi far enough apart that caps, gates and trust regions bind somewhere."""
    rng = np.random.default_rng(seed)
    alpha = gt.softmax(rng.normal(size=n))
    pi_k = gt.softmax(np.log(alpha) + 0.8 * rng.normal(size=n))
    pi = gt.softmax(np.log(pi_k) + 0.6 * rng.normal(size=n))
    adv = rng.normal(size=n)
    adv[:2] = 1.3, -1.1
    return pi, pi_k, alpha, adv


@pytest.mark.parametrize("kind, mode, high", CASES)
@pytest.mark.parametrize("threshold", [None, 0.1])
@pytest.mark.parametrize("seed", range(3))
def test_each_samples_coefficient_is_the_torch_losss_gradient_in_log_pi(kind, mode, high, threshold, seed):
    """Rows = the table's responses (one token each), loss weights 1: minus the gradient of ``grpo_loss`` in log pi(y)
    is ``log_slope``'s coefficient times TRL's off-policy mask, and the flags agree with the loss's clip counts."""
    pi, pi_k, alpha, adv = _table(seed)
    spec = _spec(kind, mode, high, threshold)
    logp = torch.tensor(np.log(pi))[:, None].requires_grad_(True)
    loss, stats = grpo_loss(logp, torch.tensor(np.log(pi_k))[:, None], torch.tensor(np.log(alpha))[:, None],
                            torch.tensor(adv), torch.ones(len(pi), 1, dtype=torch.float64), clip=spec)
    (grad,) = torch.autograd.grad(loss, logp)
    mode_ = correction(mode)
    if spec.objective == "clip":
        slope, low, high_flags = mode_.slope(pi / alpha, pi_k / alpha, adv, 0.2, 1.5, clip_high=high)
        coef = slope * pi / alpha
    else:
        cfg = SimConfig(loss_type=kind, importance_sampling_mode=mode, epsilon_high=high, importance_sampling_cap=1.5,
                        off_policy_mask_threshold=threshold)
        coef, low, high_flags = log_slope(spec.objective, np.log(pi), np.log(pi_k), np.log(alpha), adv,
                                          mode_.weight(pi_k / alpha, 1.5), cfg)
    kept = off_policy_keep(np.log(pi), np.log(alpha), adv, threshold)
    coef = coef * kept
    np.testing.assert_allclose(-grad.numpy()[:, 0], coef, rtol=1e-6, atol=1e-12)
    metrics = stats.metrics()
    if threshold is None:
        assert "off_policy_mask/frac_masked" not in metrics
    else:
        assert metrics["off_policy_mask/frac_masked"] == pytest.approx(1 - kept.mean())
    assert metrics["clip_ratio/low_mean"] == pytest.approx(low.mean())
    assert metrics["clip_ratio/high_mean"] == pytest.approx(high_flags.mean())


def test_the_cases_reach_every_branch():
    """The tables above bind CISPO's cap, DPPO's regions and the off-policy mask somewhere (a parity over samples no
    branch reaches would prove nothing)."""
    cfg = SimConfig(loss_type="dppo_tv", epsilon_high=0.05)
    hits = {"cispo cap": 0, "dppo out": 0, "mask drops": 0, "vespo truncated weight": 0}
    for seed in range(3):
        pi, pi_k, alpha, adv = _table(seed)
        lp, lk, la = np.log(pi), np.log(pi_k), np.log(alpha)
        cispo = dataclasses.replace(cfg, loss_type="cispo", importance_sampling_mode="none", epsilon_high=1.2)
        _, _, high = log_slope("cispo", lp, lk, la, adv, np.ones_like(pi), cispo)
        hits["cispo cap"] += int(high.sum())
        _, low, high = log_slope("dppo_tv", lp, lk, la, adv, np.ones_like(pi), cfg)
        hits["dppo out"] += int((low | high).sum())
        hits["mask drops"] += int((~off_policy_keep(lp, la, adv, 0.1)).sum())
        hits["vespo truncated weight"] += int((pi_k / alpha > 1.5).sum())
    assert all(hits.values()), hits


def _torch_step_gradient(config, bandit, roll, theta, pi_k, alpha):
    """Minus the gradient in the logits of the LLM loss over the step's rows (one token each), weighted as the
    simulator weighs its samples: population, rho(x) alpha(y|x) per (x, y); sampled, 1/(kept groups x G)."""
    theta_t = torch.tensor(theta, requires_grad=True)
    logp_all = torch.log_softmax(theta_t, dim=1)
    if config.population:
        P, n = theta.shape
        xs, ys = np.repeat(np.arange(P), n), np.tile(np.arange(n), P)
        adv = roll.adv[xs, ys]
        weights = bandit.rho[xs] * alpha[xs, ys] * roll.keep[xs]
    else:
        B, G = roll.ys.shape
        xs, ys = np.repeat(roll.xs, G), roll.ys.ravel()
        adv = roll.adv.ravel()
        weights = np.repeat(roll.keep, G) / max(int(roll.keep.sum()) * G, 1)
    col = lambda a: torch.tensor(a)[:, None]  # noqa: E731
    spec = Clip(epsilon=config.epsilon, epsilon_high=config.epsilon_high,
                importance_sampling_mode=config.importance_sampling_mode,
                importance_sampling_cap=config.importance_sampling_cap,
                objective=loss_type(config.loss_type).objective,
                off_policy_mask_threshold=config.off_policy_mask_threshold)
    loss, _ = grpo_loss(logp_all[xs, ys][:, None], col(np.log(pi_k[xs, ys])), col(np.log(alpha[xs, ys])),
                        torch.tensor(adv), col(weights), clip=spec)
    (grad,) = torch.autograd.grad(loss, theta_t)
    return -grad.numpy()


@pytest.mark.parametrize("kind, mode, high", CASES)
@pytest.mark.parametrize("population", [True, False])
def test_the_simulators_step_gradient_is_the_llm_losss(kind, mode, high, population):
    """``simulate.objective_gradient`` for each loss type equals autograd of the LLM loss through the softmax, on
    the same bandit, rollout, pi_k and alpha, with TRL's off-policy mask on."""
    config = SimConfig(n_prompts=4, n_actions=6, prompts_per_step=3, num_generations=5, population=population,
                       loss_type=kind, importance_sampling_mode=mode, epsilon_high=high, importance_sampling_cap=1.5,
                       off_policy_mask_threshold=0.1, seed=3)
    bandit = make_bandit(config)
    rng = np.random.default_rng(7)
    theta = bandit.logits0 + 0.5 * rng.normal(size=bandit.logits0.shape)
    pi_k = gt.softmax(theta + 0.4 * rng.normal(size=theta.shape))
    alpha = gt.softmax(theta + 0.9 * rng.normal(size=theta.shape))
    roll = sample_rollout(config, bandit, alpha, rng)
    grad, _, _ = objective_gradient(config, bandit, roll, theta, pi_k, alpha, alpha)
    np.testing.assert_allclose(grad, _torch_step_gradient(config, bandit, roll, theta, pi_k, alpha),
                               rtol=1e-6, atol=1e-12)
    assert np.abs(grad).max() > 1e-4  # a step that moves


@pytest.mark.parametrize("bad, field", [
    (dict(loss_type="cispo"), "importance_sampling_mode"),
    (dict(loss_type="dppo_kl", importance_sampling_mode="token_truncate"), "importance_sampling_mode"),
    (dict(loss_type="vespo", importance_sampling_mode="sequence_mask"), "importance_sampling_mode"),
    (dict(loss_type="sapo", importance_sampling_mode="none", sapo_temperature_neg=0.0), "sapo_temperature_neg"),
    (dict(loss_type="ppo"), "loss_type"),
    (dict(epsilon_high=-0.1), "epsilon_high"),
    (dict(off_policy_mask_threshold=0.0), "off_policy_mask_threshold"),
    (dict(off_policy_mask_threshold=-1.0), "off_policy_mask_threshold"),
])
def test_the_simulator_refuses_what_the_trainer_refuses(bad, field):
    from llm.config import GRPOConfig

    with pytest.raises(ValueError, match=field):
        SimConfig(**bad)
    with pytest.raises(ValueError, match=field):
        GRPOConfig(**bad)


@pytest.mark.parametrize("population", [False, True])
def test_the_simulator_logs_the_share_the_off_policy_mask_drops(population):
    """Never syncing, pi leaves alpha and the mask drops some negative-advantage samples: the logged share is the
    samples' (the LLM loss's, rows of one token each, in sampled mode), 0 with a threshold nothing exceeds, and
    absent with the mask off."""
    from grpo_theory.simulate import off_policy_masked, simulate

    base = dict(sync_period=1000, max_steps=40, learning_rate=2.0, population=population, seed=1,
                mask_zero_std_groups=True)
    rows = simulate(SimConfig(off_policy_mask_threshold=0.05, **base))
    shares = np.array([r["off_policy_mask/frac_masked"] for r in rows])
    assert shares[0] == 0 and 0 < np.nanmax(shares) <= 1  # pi = alpha at step 0
    # nan exactly at the steps where no group has varied rewards (no sample in the objective), as the LLM's share
    np.testing.assert_array_equal(np.isnan(shares), [r["frac_reward_zero_std"] == 1 for r in rows])
    none = np.array([r["off_policy_mask/frac_masked"] for r in simulate(SimConfig(off_policy_mask_threshold=1e3, **base))])
    assert np.all(none[~np.isnan(none)] == 0) and not np.all(np.isnan(none))
    assert "off_policy_mask/frac_masked" not in simulate(SimConfig(**base))[0]
    if not population:  # one sampled step against the LLM loss's count over its loss tokens
        config = SimConfig(off_policy_mask_threshold=0.05, **{**base, "prompts_per_step": 16})
        bandit, rng = make_bandit(config), np.random.default_rng(0)
        alpha = gt.softmax(bandit.logits0)
        pi = gt.softmax(bandit.logits0 + rng.normal(size=bandit.logits0.shape))
        roll = sample_rollout(config, bandit, alpha, rng)
        ys = (roll.xs[:, None], roll.ys)
        logp = torch.tensor(np.log(pi[ys])).reshape(-1, 1)
        weights = torch.tensor(np.repeat(roll.keep > 0, roll.ys.shape[1]), dtype=torch.float64)[:, None]
        _, stats = grpo_loss(logp, logp, torch.tensor(np.log(alpha[ys])).reshape(-1, 1),
                             torch.tensor(np.broadcast_to(roll.adv, roll.ys.shape).ravel()), weights,
                             clip=_spec("grpo", "paper", None, 0.05))
        expected = stats.metrics()["off_policy_mask/frac_masked"]
        assert expected > 0
        assert off_policy_masked(config, bandit, roll, pi, alpha) == pytest.approx(expected)


def test_the_simulators_vcpo_step_is_the_trainers_on_the_same_samples():
    """The sampled step's ESS factor: the simulator's, over its B x G samples, equals the LLM trainer's
    ``ess_lr_factor`` over the same samples as one-token completions (zero-variance groups included in both)."""
    from grpo_theory.vcpo import ess_step_factor
    from grpo_theory.simulate import step_ess_fraction
    from llm.optim.update import ess_lr_factor

    config = SimConfig(ess_scaling="sqrt", ess_scaling_base_ess_ratio=0.9, prompts_per_step=16)
    bandit, rng = make_bandit(config), np.random.default_rng(4)
    alpha = gt.softmax(bandit.logits0)
    pi_k = gt.softmax(bandit.logits0 + rng.normal(size=bandit.logits0.shape))
    roll = sample_rollout(config, bandit, alpha, rng)
    ys = (roll.xs[:, None], roll.ys)
    ours = ess_step_factor(step_ess_fraction(config, bandit, roll, pi_k, alpha), "sqrt", 0.9)
    trainer = ess_lr_factor(torch.tensor(np.log(pi_k[ys])).reshape(-1, 1), torch.tensor(np.log(alpha[ys])).reshape(-1, 1),
                            torch.ones(roll.ys.size, 1), "sqrt", 0.9)
    assert ours < 0.95 and ours == pytest.approx(trainer, rel=1e-12)


@pytest.mark.parametrize("kind, mode, high", [("grpo", "paper", None), ("grpo", "token_truncate", None),
                                              ("cispo", "token_truncate", 5.0), ("dppo_kl", "paper", 0.05)])
def test_the_simulators_baseline_weights_are_the_trainers_gradient_norms(kind, mode, high):
    """VCPO's W_i = ||g_i||^2 w_i^2 needs each sample's own gradient at unit advantage (the trainer's
    ``completion_gradient_norms``: one backward of ``grpo_loss`` per completion): the simulator's closed form
    |c_i| sqrt(1 - 2 pi_k(y_i) + ||pi_k||^2) equals autograd's norm through the softmax of the prompt's logits."""
    from grpo_theory.simulate import sample_coefficients

    config = SimConfig(loss_type=kind, importance_sampling_mode=mode, epsilon_high=high, grad_baselining=True)
    rng = np.random.default_rng(1)
    logits = rng.normal(size=9)
    pi_k, alpha = gt.softmax(logits), gt.softmax(logits + 0.7 * rng.normal(size=9))
    coef, _, _ = sample_coefficients(config, pi_k, pi_k, alpha, np.ones(9))
    closed = np.abs(coef) * np.sqrt(1 - 2 * pi_k + np.sum(pi_k**2))
    spec = _spec(kind, mode, high, None, cap=3.0)
    for y in range(9):
        theta = torch.tensor(logits, requires_grad=True)
        logp = torch.log_softmax(theta, 0)[y].reshape(1, 1)
        loss, _ = grpo_loss(logp, logp.detach(), torch.tensor(np.log(alpha[y])).reshape(1, 1), torch.ones(1),
                            torch.ones(1, 1, dtype=torch.float64), clip=spec)
        (grad,) = torch.autograd.grad(loss, theta)
        assert float(grad.norm()) == pytest.approx(closed[y], rel=1e-9)


def test_the_objectives_settings_are_one_declaration_in_both_configs():
    """SAPO's, VESPO's, DPPO's and the off-policy mask's settings: the simulator's config and the trainer's objective
    group hold the fields of ``ObjectiveSettings``, with its defaults and its docstrings as their help."""
    from grpo_theory.loss_types import ObjectiveSettings
    from llm.config import GRPOConfig
    from llm.config.algorithm import ObjectiveConfig
    from llm.config.fields import attribute_docstrings

    docs = attribute_docstrings(ObjectiveSettings)
    shared = dataclasses.fields(ObjectiveSettings)
    assert [f.name for f in shared] == list(docs) and len(shared) == 8
    sim, trainer = SimConfig(), GRPOConfig()
    for f in shared:
        assert getattr(sim, f.name) == getattr(trainer, f.name) == f.default
        assert ObjectiveConfig.model_fields[f.name].description == docs[f.name]
        assert f.name in {g.name for g in dataclasses.fields(SimConfig)}
    # each still takes its own value, under the same name, in both
    assert SimConfig(vespo_k_neg=1.5).vespo_k_neg == GRPOConfig(vespo_k_neg=1.5).vespo_k_neg == 1.5


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask", "none"])
@pytest.mark.parametrize("seed", range(3))
def test_at_pi_equal_pi_k_cispo_and_sapo_have_the_truncated_clips_gradient(mode, seed):
    """The trainer's first inner step takes the loss at pi = pi_k (pi_k is that pass's own log-probs, detached), where
    CISPO (cap above 1) and SAPO have the gradient of PPO's clip times TRL's weight, on multi-token completions too:
    CISPO with dapo's normaliser, SAPO with grpo's. At num_iterations 1 the frontier's CISPO and SAPO rows are then
    the TRL mode's rows but for the runs' rounding (and SAPO's normaliser)."""
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 5
    logp_alpha = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    logp = (logp_alpha + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[1, 3:] = 0

    def grad(kind, normaliser, high):
        from llm.tensors.loss import loss_weights

        x = logp.clone().requires_grad_(True)
        spec = Clip(epsilon=0.2, epsilon_high=high, importance_sampling_mode=mode,
                    objective=loss_type(kind).objective)
        loss, _ = grpo_loss(x, x.detach(), logp_alpha, adv, loss_weights(mask, normaliser, T), clip=spec)
        return torch.autograd.grad(loss, x)[0]

    torch.testing.assert_close(grad("cispo", "dapo", 5.0), grad("dapo", "dapo", None), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad("sapo", "grpo", None), grad("grpo", "grpo", None), rtol=1e-12, atol=1e-15)
    assert not torch.allclose(grad("sapo", "grpo", None), grad("dapo", "dapo", None))  # the normalisers differ
