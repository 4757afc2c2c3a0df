"""Algorithm 1 of PAPER.md on a tabular contextual bandit, with Theorem 1 evaluated exactly per step.

``python -m grpo_theory.simulate --help``. A softmax-tabular policy over ``n_actions`` responses for
each of ``n_prompts`` prompts; the server policy alpha is the trainer policy at the last sync
(every ``sync_period`` = v steps). Each step: a batch of prompts, G responses each from alpha,
rewards, group-whitened advantages (``group_advantages``, the function the LLM trainer uses),
optional zero-variance mask, ``num_iterations`` = i gradient-ascent steps on the clipped objective
with r = pi/alpha and r' = pi_k/alpha, minus beta KL(pi || pi_ref) (exact on the table).
``population=True`` replaces the sampled groups by their G -> infinity limit: every prompt with its
weight, exact advantages A_alpha and the exact expected gradient of L^c_alpha.

After each step the exact J(pi_{k+1}) - J(pi_k) and every term of Theorem 1 (prompt-weighted) are
logged with the metric names the LLM trainer uses. All maths comes from ``grpo_theory.core``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Literal

import numpy as np

from . import core
from .check import rounding_tolerance
from .cli import parse, run_main
from .instances import softmax
from .runio import MetricsWriter, write_config
from .validation import EPS_MAX, require


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Off-policy GRPO (Algorithm 1) on a tabular bandit, with exact Theorem 1 logging."""

    n_prompts: int = 16
    """Number of prompts x (uniformly weighted)."""
    n_actions: int = 8
    """Number of responses y per prompt."""
    rewards: Literal["binary", "continuous"] = "binary"
    """Reward table: binary (one or two correct responses per prompt, verifiable) or continuous in [0, 1]."""
    stochastic_rewards: bool = False
    """Observe r ~ Bernoulli(table) instead of the table value (J is always the table's expectation)."""
    init_scale: float = 2.0
    """Initial logits: N(0, init_scale^2), with the best response pushed down by init_scale (J starts low)."""
    prompts_per_step: int = 4
    """Prompts per step (ignored in population mode, which uses every prompt with its weight)."""
    num_generations: int = 8
    """G: responses sampled per prompt."""
    population: bool = False
    """G -> infinity: exact advantages and exact expected gradients (no sampling noise)."""
    num_iterations: int = 1
    """i: gradient steps per batch."""
    sync_period: int = 1
    """v: alpha <- pi_theta every v steps."""
    epsilon: float = 0.2
    """Clip width of f_eps."""
    beta: float = 0.0
    """KL(pi || pi_ref) weight."""
    ref_sync_steps: int = 0
    """pi_ref <- pi_theta every this many steps (0: never)."""
    variance_eps: float = 1e-4
    """eps in sigma_{alpha,eps} = sqrt(var + eps) (advantages and bound), in [0, 3/4]."""
    mask_zero_std_groups: bool = False
    """Drop prompts whose sampled group has zero reward variance."""
    learning_rate: float = 1.0
    """Step size of gradient ascent on the logits."""
    max_steps: int = 200
    """Number of steps k."""
    seed: int = 0
    """Seed of the bandit and of sampling."""
    output_dir: str = ""
    """Run directory for config.json and metrics.jsonl ('' : do not write)."""

    def __post_init__(self):
        require(self, self.n_prompts >= 1, "n_prompts", "must be >= 1")
        require(self, self.n_actions >= 2, "n_actions", "must be >= 2")
        require(self, self.init_scale >= 0, "init_scale", "must be >= 0")
        require(self, 1 <= self.prompts_per_step, "prompts_per_step", "must be >= 1")
        require(self, self.num_generations >= 2, "num_generations", "a group needs G >= 2")
        require(self, self.num_iterations >= 1, "num_iterations", "must be >= 1")
        require(self, self.sync_period >= 1, "sync_period", "v must be >= 1")
        require(self, self.epsilon >= 0, "epsilon", "must be >= 0")
        require(self, self.beta >= 0, "beta", "must be >= 0")
        require(self, self.ref_sync_steps >= 0, "ref_sync_steps", "must be >= 0")
        require(self, 0 <= self.variance_eps <= EPS_MAX, "variance_eps", "must lie in [0, 3/4] (Theorem 1)")
        require(self, self.learning_rate > 0, "learning_rate", "must be > 0")
        require(self, self.max_steps >= 1, "max_steps", "must be >= 1")


@dataclasses.dataclass
class Bandit:
    rho: np.ndarray  # (n_prompts,) prompt distribution
    table: np.ndarray  # (n_prompts, n_actions) expected rewards in [0, 1]
    logits0: np.ndarray  # initial logits


def make_bandit(config: SimConfig) -> Bandit:
    rng = np.random.default_rng([config.seed, 0])
    P, n = config.n_prompts, config.n_actions
    if config.rewards == "binary":
        table = np.zeros((P, n))
        for x in range(P):
            table[x, rng.choice(n, size=1 + rng.integers(0, 2), replace=False)] = 1.0
    else:
        table = rng.random((P, n))
    logits = config.init_scale * rng.standard_normal((P, n))
    best = table.argmax(axis=1)
    logits[np.arange(P), best] -= config.init_scale
    return Bandit(np.full(P, 1.0 / P), table, logits)


def _clip_active(ratio, ratio_k, adv, clip):
    """1 where the gradient of f_clip flows through r (the unclipped branch of the min is active)."""
    lo, hi = np.maximum(ratio_k - clip, 0.0), ratio_k + clip
    return ~(((ratio > hi) & (adv > 0)) | ((ratio < lo) & (adv < 0)))


def _kl_grad(pi, ref):
    """d/d logits of KL(pi || ref) for pi = softmax(logits): pi (log pi - log ref - KL)."""
    kl = np.sum(pi * (np.log(pi) - np.log(ref)), axis=-1, keepdims=True)
    return pi * (np.log(pi) - np.log(ref) - kl)


def simulate(config: SimConfig, progress: bool = False) -> list[dict]:
    """Run Algorithm 1; returns the metric rows (also written to ``output_dir`` if set)."""
    bandit = make_bandit(config)
    rng = np.random.default_rng([config.seed, 1])
    writer = None
    if config.output_dir:
        write_config(config.output_dir, config)
        writer = MetricsWriter(config.output_dir)
    theta = bandit.logits0.copy()
    theta_alpha = theta.copy()
    theta_ref = theta.copy()
    R, rho = bandit.table, bandit.rho
    P, n = R.shape
    eps, clip = config.variance_eps, config.epsilon
    rows = []
    last_sync = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=config.max_steps, unit="step")
    t_start = time.perf_counter()
    for step in range(config.max_steps):
        # ---- sync: every v steps the server gets the trainer's weights
        if step % config.sync_period == 0:
            theta_alpha = theta.copy()
            last_sync = step
        pi_k, alpha, ref = softmax(theta), softmax(theta_alpha), softmax(theta_ref)

        # ---- rollout + score + advantages
        if config.population:
            xs = np.arange(P)
            weight_x = rho.copy()
            sigma = core.reward_std(alpha, R)
            keep = sigma > 0 if config.mask_zero_std_groups else np.ones(P, bool)
            adv_table = core.whitened_advantage(alpha, R, eps)  # (P, n)
            sampled_reward = float(np.sum(rho * core.expected_reward(alpha, R)))
            frac_zero = float(np.sum(rho * (sigma == 0)))
        else:
            B, G = config.prompts_per_step, config.num_generations
            xs = rng.choice(P, size=B, p=rho)
            cum = np.cumsum(alpha[xs], axis=1)
            ys = np.minimum((rng.random((B, G, 1)) > cum[:, None, :]).sum(-1), n - 1)  # (B, G) inverse CDF
            r_exp = R[xs[:, None], ys]
            r = (rng.random((B, G)) < r_exp).astype(float) if config.stochastic_rewards else r_exp
            adv = core.group_advantages(r, eps)
            zero = np.ptp(r, axis=1) == 0
            keep = ~zero if config.mask_zero_std_groups else np.ones(B, bool)
            sampled_reward = float(r.mean())
            frac_zero = float(zero.mean())

        # ---- optimise: i gradient-ascent steps on L^c - beta KL
        clipped_low = clipped_high = 0.0
        for _ in range(config.num_iterations):
            pi = softmax(theta)
            grad = np.zeros_like(theta)
            if config.population:
                ratio, ratio_k = pi / alpha, pi_k / alpha
                act = _clip_active(ratio, ratio_k, adv_table, clip)
                g_y = pi * adv_table * act  # alpha * A * r * active, per action
                g = g_y - pi * g_y.sum(axis=1, keepdims=True)  # chain rule through softmax
                grad += (weight_x * keep)[:, None] * g
                lo, hi = np.maximum(ratio_k - clip, 0.0), ratio_k + clip
                clipped_low = float(np.sum(rho[:, None] * alpha * ((ratio < lo) & (adv_table < 0))))
                clipped_high = float(np.sum(rho[:, None] * alpha * ((ratio > hi) & (adv_table > 0))))
            else:
                bi = np.arange(B)[:, None]
                p_y, a_y, k_y = pi[xs[:, None], ys], alpha[xs[:, None], ys], pi_k[xs[:, None], ys]
                ratio, ratio_k = p_y / a_y, k_y / a_y
                act = _clip_active(ratio, ratio_k, adv, clip)
                coef = adv * ratio * act * keep[:, None] / max(int(keep.sum()) * G, 1)  # (B, G)
                onehot_sum = np.zeros((B, n))
                np.add.at(onehot_sum, (np.repeat(bi, G, axis=1), ys), coef)
                g = onehot_sum - pi[xs] * coef.sum(axis=1, keepdims=True)
                np.add.at(grad, xs, g)
                lo, hi = np.maximum(ratio_k - clip, 0.0), ratio_k + clip
                clipped_low = float(np.mean((ratio < lo) & (adv < 0)))
                clipped_high = float(np.mean((ratio > hi) & (adv > 0)))
            if config.beta > 0:  # exact KL on the batch's prompts (all prompts, rho-weighted, in population mode)
                kg = _kl_grad(pi[xs], ref[xs])
                if config.population:
                    grad -= config.beta * rho[:, None] * kg
                else:
                    np.add.at(grad, xs, -config.beta * kg / len(xs))
            theta = theta + config.learning_rate * grad
        pi_new = softmax(theta)

        # ---- exact diagnostics (Theorem 1 per prompt, prompt-weighted)
        improvement_x = core.expected_reward(pi_new, R) - core.expected_reward(pi_k, R)
        row = {"step": step, "lag": step - last_sync, "reward": sampled_reward,
               "j/pi_k": float(np.sum(rho * core.expected_reward(pi_k, R))),
               "improvement": float(np.sum(rho * improvement_x)),
               "frac_reward_zero_std": frac_zero,
               "kl": float(np.sum(rho * core.kl_divergence(pi_new, ref))),
               "clip_ratio/low_mean": clipped_low, "clip_ratio/high_mean": clipped_high,
               "tv/pi_new_alpha": float(np.sum(rho * core.tv_distance(pi_new, alpha))),
               "tv/pi_k_alpha": float(np.sum(rho * core.tv_distance(pi_k, alpha)))}
        for suffix, tight in (("", False), ("_tight", True)):
            t = core.bound_terms(pi_new, pi_k, alpha, R, eps, tight=tight)
            tol = rounding_tolerance(alpha, R, eps, t, tight)
            lower = float(np.sum(rho * t.lower)) if np.all(np.isfinite(t.lower)) else float("-inf")
            row[f"bound/lower{suffix}"] = lower
            row[f"bound/slack{suffix}"] = row["improvement"] - lower
            row[f"bound/tolerance{suffix}"] = float(np.sum(rho * tol))
            if not tight:
                row["bound/surrogate"] = float(np.sum(rho * t.surrogate))
                row["bound/penalty_tv"] = float(np.sum(rho * t.penalty_tv))
                row["bound/penalty_lag"] = float(np.sum(rho * t.penalty_lag))
        row["time/elapsed"] = time.perf_counter() - t_start
        rows.append(row)
        if writer is not None:
            writer.write(row)

        # ---- reference reset
        if config.ref_sync_steps and (step + 1) % config.ref_sync_steps == 0:
            theta_ref = theta.copy()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(J=f"{row['j/pi_k']:.3f}", tv=f"{row['tv/pi_k_alpha']:.3f}")
    if bar is not None:
        bar.close()
    return rows


def final_j(config: SimConfig, rows: list[dict]) -> float:
    """J of the final policy: J(pi_k) at the last step plus its exact improvement."""
    return rows[-1]["j/pi_k"] + rows[-1]["improvement"]


def main(args: list[str] | None = None) -> int:
    config = parse(SimConfig, args, prog="python -m grpo_theory.simulate", description=__doc__.splitlines()[0])
    rows = simulate(config, progress=True)
    viol = sum(r["bound/slack"] < -r["bound/tolerance"] for r in rows)
    viol_t = sum(r["bound/slack_tight"] < -r["bound/tolerance_tight"] for r in rows)
    print(f"J: {rows[0]['j/pi_k']:.4f} -> {final_j(config, rows):.4f} in {config.max_steps} steps "
          f"({config.max_steps / rows[-1]['time/elapsed']:.0f} steps/s)")
    print(f"mean TV(pi_k, alpha) {np.mean([r['tv/pi_k_alpha'] for r in rows]):.4f}; "
          f"bound > 0 on {np.mean([r['bound/lower'] > 0 for r in rows]):.1%} (paper) / "
          f"{np.mean([r['bound/lower_tight'] > 0 for r in rows]):.1%} (tight) of steps; "
          f"steps with bound > improvement: {viol} (paper), {viol_t} (tight)")
    if config.output_dir:
        print(f"wrote {config.output_dir}/metrics.jsonl")
    return 1 if viol or viol_t else 0


if __name__ == "__main__":
    run_main(main, prog="python -m grpo_theory.simulate")
