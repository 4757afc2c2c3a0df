"""DPPO's divergence trust regions (``--loss-type dppo_tv|dppo_kl``; Qi et al., arXiv 2602.04879) as its authors' code
computes them (sail-sg/Stable-RL, ``verl/trainer/ppo/core_algos.py``: ``compute_policy_loss_with_mask`` and
``_compute_token_mask_for_policy_loss``, the rollout-anchored ``dppo_binary_tv`` and ``dppo_binary_kl``), and beside
verl 0.9.1's shipped ``dppo_tv`` and ``dppo_kl`` given the rollout's log-probs as their old ones (verl's bypass mode),
in loss and gradient, on crafted tokens on both sides of each region's edge."""

import pytest
import torch

from llm.tensors.loss import Clip, grpo_loss, loss_weights


def tokens(seed=0, B=6, T=7):
    """Sampled-token log-probs of alpha and of pi spread over (0, 1), pi moved from alpha by up to 0.4 in
    probability, advantages of both signs per completion, completions of 2-7 tokens."""
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(B, T, generator=g) * 0.96 + 0.02
    p = (q + (torch.rand(B, T, generator=g) - 0.5) * 0.8).clamp(0.01, 0.99)
    mask = (torch.arange(T)[None, :] < torch.tensor([7, 2, 5, 7, 3, 6])[:, None]).float()
    adv = torch.randn(B, generator=g)
    return p.log(), q.log(), adv, mask


def authors_mask(kind, logp, logq, adv, low, high):
    """The authors' trust-region mask, transcribed: 1 where kept (their ``valid_mask`` before the response mask)."""
    p, q = logp.exp(), logq.exp()
    if kind == "dppo_tv":
        bad_pos, bad_neg = (p - q) > high, (p - q) < -low
    else:
        kl = q * (logq - logp) + (1 - q) * torch.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))
        bad_pos, bad_neg = (kl > high) & (p > q), (kl > low) & (p < q)
    return 1.0 - torch.where(adv > 0, bad_pos, bad_neg).float()


def ours(kind, logp, logq, adv, mask, low, high, cap):
    leaf = logp.clone().requires_grad_(True)
    spec = Clip(epsilon=low, epsilon_high=high, objective=kind, clip_ratio_c=cap)
    logk = (logq + 0.1 * torch.randn(logq.shape, generator=torch.Generator().manual_seed(5))).clamp(max=-1e-3)
    loss, stats = grpo_loss(leaf, logk, logq, adv, loss_weights(mask, kind, mask.shape[1]), clip=spec)  # pi_k != alpha
    loss.backward()
    return float(loss), leaf.grad, stats


@pytest.mark.parametrize("kind, low, high", [("dppo_tv", 0.15, 0.15), ("dppo_tv", 0.1, 0.2),
                                             ("dppo_kl", 0.05, 0.05), ("dppo_kl", 0.03, 0.08)])
@pytest.mark.parametrize("cap", [1.5, 10000.0])
def test_dppo_is_the_authors_masked_truncated_objective(kind, low, high, cap):
    logp, logq, adv, mask = tokens()
    loss, grad, stats = ours(kind, logp, logq, adv, mask, low, high, cap)
    keep = authors_mask(kind, logp, logq, adv[:, None].expand_as(logp), low, high)
    ratio = torch.exp((logp - logq).clamp(max=20.0)).clamp(max=cap)
    a = adv[:, None]
    n = mask.sum()
    assert loss == pytest.approx(float((-a * ratio * keep * logp * mask).sum() / n), rel=1e-6)
    torch.testing.assert_close(grad, -a * ratio * keep * mask / n, rtol=1e-6, atol=1e-9)  # d/d log pi
    assert 0 < float((1 - keep)[mask > 0].mean()) < 1  # some tokens on each side of the edge
    if cap < 100:
        assert bool(((ratio == cap) & (keep > 0) & (mask > 0)).any())  # the cap binds on kept tokens
    masked = (stats.clip_low + stats.clip_high) / stats.tokens
    assert masked == pytest.approx(float((1 - keep)[mask > 0].mean()))


@pytest.mark.parametrize("kind", ["dppo_tv", "dppo_kl"])
def test_dppo_equals_verls_shipped_loss_given_the_rollouts_log_probs(kind):
    verl_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.workers.config import ActorConfig

    logp, logq, adv, mask = tokens(seed=1)
    low, high = (0.15, 0.2) if kind == "dppo_tv" else (0.05, 0.07)
    loss, grad, _ = ours(kind, logp, logq, adv, mask, low, high, 10.0)
    config = ActorConfig(strategy="fsdp2", ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1, rollout_n=1,
                         use_dynamic_bsz=False, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=10.0)
    leaf = logp.clone().requires_grad_(True)
    theirs, metrics = verl_algos.get_policy_loss_fn(kind)(
        old_log_prob=logq, log_prob=leaf, advantages=adv[:, None].expand_as(logp) * mask, response_mask=mask,
        loss_agg_mode="token-mean", config=config)
    theirs.backward()
    assert loss == pytest.approx(float(theirs), rel=1e-6)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-6, atol=1e-9)
    assert 0 < metrics["actor/pg_clipfrac"] < 1


def test_dppo_needs_the_default_mode_and_a_positive_cap():
    from llm.config import GRPOConfig

    with pytest.raises(ValueError, match="dppo_kl is its own correction"):
        GRPOConfig().replace(loss_type="dppo_kl", importance_sampling_mode="token_truncate")
    with pytest.raises(ValueError, match="clip_ratio_c: must be > 0"):
        GRPOConfig().replace(loss_type="dppo_tv", clip_ratio_c=0.0)
    assert GRPOConfig().replace(loss_type="dppo_tv", epsilon=0.15).objective.clip_ratio_c == 10000.0
