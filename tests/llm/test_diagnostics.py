"""llm.tensors.diagnostics: the per-step estimates as the trainer computes them; in-sample against held-out on a tabular
model, the reward range, a run's held-out improvement against the exact one in its standard errors."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo_theory as gt
from llm import GRPOConfig
import llm.tensors.diagnostics as dg
from llm.tensors.diagnostics import RewardRange, bound_estimates, tv_rows
from tests.strategies import eps_values

# ---- diagnostics ------------------------------------------------------------------------------


def test_tv_rows_is_grpo_theory_tv():
    g = torch.Generator().manual_seed(3)
    a = torch.log_softmax(torch.randn(4, 7, 11, generator=g, dtype=torch.float64), -1)
    b = torch.log_softmax(torch.randn(4, 7, 11, generator=g, dtype=torch.float64), -1)
    assert np.allclose(tv_rows(a, b).numpy(), gt.tv_distance(a.exp().numpy(), b.exp().numpy()), atol=1e-6)


# ---- in-sample against held-out estimates, on a tabular model -------------------------------------


class TabularStep:
    """A contextual bandit with X prompts and K actions, softmax policies, binary rewards. One trial: alpha is
    a lagged policy, P training prompts x G samples from alpha give a clipped-objective gradient step
    pi_k -> pi_new; the exact J and TV over the uniform prompt distribution are known, and the in-sample
    (training samples) and held-out (fresh prompts and samples) estimates are computed as the trainer does."""

    X, K, P, G, lr, eps = 40, 30, 8, 8, 3.0, 1e-4

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.reward = (rng.random((self.X, self.K)) < 0.25).astype(float)
        self.theta_k = rng.normal(size=(self.X, self.K))
        # alpha: a lagged policy, noisier and worse than pi_k (pi_k has learnt since alpha was synced)
        self.theta_alpha = self.theta_k - 0.5 * self.reward + 0.3 * rng.normal(size=(self.X, self.K))

    def sample(self, logp_alpha):
        x = self.rng.integers(0, self.X, self.P)
        u = self.rng.random((self.P, self.G, 1))
        y = (u > np.cumsum(np.exp(logp_alpha[x]), axis=1)[:, None, :]).sum(-1).clip(max=self.K - 1)
        return x, y, self.reward[x[:, None], y]

    def trial(self):
        log_softmax = lambda t: t - np.logaddexp.reduce(t, axis=1, keepdims=True)  # noqa: E731
        lk, la = log_softmax(self.theta_k), log_softmax(self.theta_alpha)
        x, y, r = self.sample(la)
        adv = gt.group_advantages(r, self.eps)
        w_k = np.exp(lk[x[:, None], y] - la[x[:, None], y])
        grad = np.zeros_like(self.theta_k)  # d/dtheta of mean_{x,g} w_k A log pi(y|x)  (the clip is inactive at pi_k)
        for p in range(self.P):
            for g in range(self.G):
                grad[x[p]] -= w_k[p, g] * adv[p, g] * np.exp(lk[x[p]]) / (self.P * self.G)
                grad[x[p], y[p, g]] += w_k[p, g] * adv[p, g] / (self.P * self.G)
        ln = log_softmax(self.theta_k + self.lr * grad * self.P)  # P: each prompt's step is of order lr
        exact = {"improvement": float(((np.exp(ln) - np.exp(lk)) * self.reward).sum(1).mean()),
                 "tv/pi_new_alpha": float(gt.tv_distance(np.exp(ln), np.exp(la)).mean()),
                 "tv/pi_k_alpha": float(gt.tv_distance(np.exp(lk), np.exp(la)).mean())}
        lw = lambda logp, xx, yy: logp[xx[:, None], yy] - la[xx[:, None], yy]  # noqa: E731
        insample = bound_estimates(r, lw(lk, x, y), lw(ln, x, y), self.eps)
        xh, yh, rh = self.sample(la)
        heldout = bound_estimates(rh, lw(lk, xh, yh), lw(ln, xh, yh), self.eps)
        return exact, insample, heldout


@pytest.mark.slow
def test_heldout_estimates_are_unbiased_and_insample_ones_are_biased_upwards():
    """Over 600 trials: the held-out improvement and TV(pi_new, alpha) estimates average to the exact values
    (within 4 standard errors); the in-sample ones exceed them by more than 4 standard errors.
    TV(pi_k, alpha) is unbiased on either set (pi_k does not depend on the step's samples)."""
    model = TabularStep(0)
    trials = [model.trial() for _ in range(600)]

    def gap(which, key):
        d = np.array([t[which][key] - t[0][key] for t in trials])
        return d.mean(), d.std(ddof=1) / np.sqrt(len(d))

    for key in ("improvement", "tv/pi_new_alpha", "tv/pi_k_alpha"):
        mean, se = gap(2, key)
        assert abs(mean) < 4 * se, ("heldout", key, mean, se)
    for key in ("improvement", "tv/pi_new_alpha"):
        mean, se = gap(1, key)
        assert mean > 4 * se, ("insample", key, mean, se)
    mean, se = gap(1, "tv/pi_k_alpha")
    assert abs(mean) < 4 * se


#: The estimates in units of J: scaled by the reward range's width; the others (TVs, ESS, a share) are not.
J_UNIT_KEYS = ("improvement", "improvement_nonzero_std", "bound_est/surrogate", "bound_est/penalty_tv",
               "bound_est/penalty_lag", "bound_est/lower", "bound_est/penalty_tv_tight", "bound_est/penalty_lag_tight",
               "bound_est/lower_tight", "bound_est/lower_nonzero_std", "bound_est/lower_tight_nonzero_std")


@settings(deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(-5, 5), st.floats(0.1, 10), eps_values)
def test_bound_terms_of_rewards_in_any_range_are_those_of_the_rescaled_rewards(seed, lo, width, eps):
    """Rewards lo + width r with the range [lo, lo + width]: every J-unit estimate (and its standard error) is width
    times that of r in [0, 1]; the TV and ESS estimates and the share of positive bounds are unchanged."""
    rng = np.random.default_rng(seed)
    r = rng.choice([0.0, 0.3, 1.0], size=(3, 4))
    log_w_k, log_w_new = rng.normal(0, 0.5, (2, 3, 4))
    base = bound_estimates(r, log_w_k, log_w_new, eps, standard_errors=True)
    wide = bound_estimates(lo + width * r, log_w_k, log_w_new, eps, RewardRange(lo, lo + width), standard_errors=True)
    assert set(base) == set(wide)
    for key, value in base.items():
        want = width * value if key.removesuffix("_se") in J_UNIT_KEYS else value
        assert wide[key] == pytest.approx(want, rel=1e-9, abs=1e-12, nan_ok=True), key


@pytest.mark.slow
def test_a_runs_heldout_improvement_is_the_exact_improvement_within_its_standard_errors(tmp_path):
    """The held-out estimates as a run computes them (``prepare_heldout``, ``diagnose_heldout``) on the built-in task,
    whose exact improvement each step logs: over 40 steps (v = 4, 16 held-out prompts) the estimate minus the exact
    value lies within 3 of its standard errors on at least 90% of steps, and averages to 0 within 3 standard errors of
    that average (the estimates are unbiased; the exact-expectation tests of ``grpo_theory.estimators`` say why)."""
    from llm import train
    from llm.run.rundir import read_metrics

    rows = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "run"), sampler="transformers", max_steps=40,
                                         sync_period=4, heldout_prompts=16, progress=False, logging_steps=1000),
                              log=lambda *a: None))
    diff = np.array([r["heldout/improvement"] - r["improvement"] for r in rows])
    se = np.array([r["heldout/improvement_se"] for r in rows])
    assert np.mean(np.abs(diff) <= 3 * se) >= 0.9, np.abs(diff / se)
    assert abs(diff.mean()) <= 3 * diff.std(ddof=1) / np.sqrt(len(diff)), (diff.mean(), diff.std())
    assert all(0 <= r[k] <= 1 for r in rows for k in ("tv/pi_k_alpha", "heldout/tv/pi_new_alpha",
                                                        "heldout/ess/pi_new_alpha"))
    # the certificate: a 95% lower confidence bound exceeds the exact improvement on at most about 5% of steps (the
    # betting bound on the capped estimates; its level is a theorem); here at most 6 of 40 (binomial tail 1.3% at
    # exactly 5%); the capped estimate is biased low (never above the improvement in expectation) and the e-value
    # says certified exactly when the bound is positive
    lcb = np.array([r["heldout/improvement_lcb"] for r in rows])
    exceed = lcb > np.array([r["improvement"] for r in rows])
    assert exceed.sum() <= 6, exceed.sum()
    capped = np.array([r["heldout/improvement_capped"] for r in rows]) - np.array([r["improvement"] for r in rows])
    assert capped.mean() <= 3 * capped.std(ddof=1) / np.sqrt(len(capped))
    assert all((r["heldout/improvement_lcb"] > 0) == (r["heldout/improvement_e"] >= 20) for r in rows)


# ---- importance weights and the mismatch KL over every completion token ------------------------------


def test_the_mismatch_kl_is_an_unbiased_estimate_of_kl_alpha_pi_k():
    """Each response y appears in alpha(y) x N rows (alpha rational): the token mean of w - 1 - log w over the rows
    is E_alpha[w - 1 - log w] = KL(alpha || pi_k) exactly."""
    counts = np.array([1, 2, 3, 4])
    alpha, pi_k = counts / counts.sum(), np.array([0.4, 0.3, 0.2, 0.1])
    ys = np.repeat(np.arange(4), counts)
    col = lambda x: torch.tensor(np.log(x[ys]))[:, None]  # noqa: E731
    got = dg.weight_metrics(col(pi_k), col(alpha), torch.ones(len(ys), 1))
    assert got["sampling/mismatch_kl"] == pytest.approx(np.sum(alpha * np.log(alpha / pi_k)), abs=1e-6)
    assert got["is_weight/mean"] == pytest.approx(np.sum(alpha * pi_k / alpha), abs=1e-6)  # E_alpha w = 1
    assert got["is_weight/max"] == pytest.approx(4.0) and got["is_weight/min"] == pytest.approx(0.25)


def test_the_weight_metrics_cover_every_completion_token_whatever_the_loss_keeps():
    """The zero-variance mask and a staleness drop choose which groups the loss sees; the weights and the mismatch KL
    are measured on every completion token all the same (the step's phases pass the whole completion mask)."""
    g = torch.Generator().manual_seed(0)
    logp_alpha = -torch.rand(6, 4, generator=g) * 3
    logp_k = logp_alpha + 0.5 * torch.randn(6, 4, generator=g)
    mask = torch.ones(6, 4)
    mask[2, 2:] = 0
    got = dg.weight_metrics(logp_k, logp_alpha, mask)
    w = torch.exp(logp_k - logp_alpha)[mask > 0].double()
    assert got["is_weight/mean"] == pytest.approx(float(w.mean()), rel=1e-6)
    assert got["is_weight/max"] == pytest.approx(float(w.max()), rel=1e-6)
    assert got["sampling/mismatch_kl"] == pytest.approx(float((w - 1 - w.log()).mean()), rel=1e-5)
    empty = dg.weight_metrics(logp_k, logp_alpha, torch.zeros(6, 4))
    assert all(np.isnan(v) for v in empty.values())


def test_the_sync_checks_mean_leaves_off_set_tokens_out_and_its_floor_calibrates_bf16():
    """``sampler_gap``: a token that one side's filter drops (-10^4) shows in the worst token, not in the token mean;
    ``SyncCheck``: bfloat16's threshold is max(0.02, twice the run's first gap), float32's the absolute 1e-3."""
    from llm.tensors.sync_probe import SYNC_CHECKS, sampler_gap

    a = torch.tensor([[-1.0, -2.0, -1.0e4, -3.0]])
    b = torch.tensor([[-1.1, -2.1, -5.0, -3.1]])
    gap = sampler_gap(a, b, torch.ones(1, 4))
    assert gap["sampling/logp_diff_mean"] == pytest.approx(0.1) and gap["sampling/logp_diff_max"] > 9000
    bf16, fp32 = SYNC_CHECKS["bfloat16"], SYNC_CHECKS["float32"]
    assert bf16.threshold() == 0.02 and bf16.threshold(0.005) == 0.02 and bf16.threshold(0.04) == pytest.approx(0.08)
    assert bf16.stale({"sampling/logp_diff_mean": 0.05}, 0.04) is None
    assert bf16.stale({"sampling/logp_diff_mean": 0.1}, 0.04) == 0.1
    assert fp32.threshold(0.5) == 1e-3 and fp32.stale({"sampling/logp_diff_max": 2e-3}) == 2e-3


def test_the_trm_estimates_against_a_token_tree():
    """``trm_estimates`` fed a token tree's own sequences (mu = pi_k = alpha, G = 8 per prompt): over 400 batches the
    surrogate gain and the sequence KL average to the exact values within 4 standard errors, the maxima never exceed
    the exact eps and delta (a max over sampled prefixes is biased low), and the bounds are the tree's bounds at those
    estimates."""
    import torch

    from grpo_theory import trm
    from llm.tensors.diagnostics import trm_estimates

    rng = np.random.default_rng(4)
    V, T, P, G = 3, 4, 8, 8
    base = trm.random_tree(rng, V, T)
    mu = trm.TokenTree.from_logits(base)
    pi = trm.TokenTree.from_logits([z + 0.3 * rng.standard_normal(z.shape) for z in base])
    reward = (rng.random(V ** T) < 0.4).astype(float)
    exact, div = trm.exact_surrogate_gain(pi, mu, reward), trm.exact_divergences(pi, mu)
    gains, seq_kls = [], []
    for _ in range(400):
        ys = trm.sample_sequences(mu, P * G, rng)
        tv, kl = trm.sampled_divergences(pi, mu, ys)
        est = trm_estimates(tv, kl, torch.ones(P * G, T), torch.tensor(trm.token_logprobs(mu, ys)),
                            torch.tensor(trm.token_logprobs(pi, ys)), np.zeros((P, G)),
                            reward[trm.sequence_index(mu, ys)].reshape(P, G), T)
        assert est["tv/token_max"] <= div.eps + 1e-12 and est["kl/token_max"] <= div.delta + 1e-12
        assert est["bound_est/trm_lower"] == pytest.approx(
            est["bound_est/trm_surrogate"] - est["bound_est/trm_unified"])
        gains.append(est["bound_est/trm_surrogate"])
        seq_kls.append(est["kl/sequence"])
    for values, want in ((gains, exact), (seq_kls, div.seq_kl)):
        values = np.array(values)
        assert abs(values.mean() - want) < 4 * values.std(ddof=1) / np.sqrt(len(values)), (values.mean(), want)


def test_reward_std_is_the_sample_standard_deviation_as_trl_logs_it():
    """TRL 1.16 logs ``reward_std`` as ``nanstd`` over the step's rewards, with Bessel's correction: for rewards
    0, 1, 1, 1 that is sqrt(0.75 * 0.25 * 4 / 3) = 0.5 (the population's would be 0.433)."""
    from llm.tensors.diagnostics import rollout_metrics

    row = rollout_metrics(np.array([[0.0, 1.0], [1.0, 1.0]]), np.array([False, True]), [[1, 2], [1, 2]] * 2, eos=2)
    assert row["reward_std"] == pytest.approx(0.5) and row["reward"] == 0.75
    assert np.isnan(rollout_metrics(np.array([[1.0]]), np.array([True]), [[2]], eos=2)["reward_std"])
