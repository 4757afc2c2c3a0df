"""llm.optim.update: the optimiser's accumulated gradient over micro-batches equals the unsplit step's (float64, every loss
type, with and without the mask, checkpointing, grouping by length); a run in micro-batches logs the same metrics."""

import math

import pytest
import torch

from llm.tensors.metrics import is_wall_clock
from llm import GRPOConfig, train
from llm.run.rundir import read_metrics
from tests.helpers import CASES, RTOL64, SHARED_GRAD_RTOL, optimise_case, same_gradient, same_metric

#: Metrics of two float32 runs: per-token log-probs differ by ~1e-6 with the batch's composition; the TV and bound
#: estimates (exp of summed log-ratios, times weights up to 100) carry that, and so do the weights after an Adam
#: step. Adam's first step moves every entry by about lr g/(|g| + eps), so at the default eps = 1e-8 an entry whose
#: gradient is rounding (~1e-9) moves by a fair share of lr in a direction set by the rounding: the held-out
#: improvement (a small difference of weights) then differed by 1.7e-4 (8%) between the two runs on an AVX-512 host.
#: The run below uses eps = 1e-6 (RUN_ADAM_EPSILON), under which such entries barely move: measured on an AVX-512
#: host, default and AVX2 kernels, worst differences 9e-6 absolute at step 0 (heldout/improvement 3.4e-4) and
#: 0.19% relative at step 1. A wrong split (a normaliser or a statistic per micro-batch) is off by order one.
RUN_RTOL, RUN_ATOL = 1e-2, 1e-4
RUN_ADAM_EPSILON = 1e-6
@pytest.mark.slow
@pytest.mark.parametrize("loss_type,ratio_level,mask", CASES)
def test_accumulated_gradient_equals_the_unsplit_step(loss_type, ratio_level, mask):
    whole, whole_grads = optimise_case(loss_type, ratio_level, mask, micro_batch=0)
    assert len(whole_grads) == 2 and whole.stats.tokens > 0
    # 4 + 4 + 1 rows; one per pass; checkpointed; rows grouped by length, trimmed to each pass's longest
    for micro_batch, ckpt, by_length in ((4, False, False), (1, False, False), (4, True, False), (0, False, True),
                                         (4, False, True), (2, True, True)):
        split, split_grads = optimise_case(loss_type, ratio_level, mask, micro_batch, checkpointing=ckpt,
                                       by_length=by_length)
        for step_w, step_s in zip(whole_grads, split_grads, strict=True):
            for gw, gs in zip(step_w, step_s, strict=True):
                assert same_gradient(gs, gw, RTOL64), (micro_batch, ckpt, by_length)
        mw, ms = whole.stats.metrics(), split.stats.metrics()
        assert mw.keys() == ms.keys() and "kl" in mw
        for key in mw:
            assert math.isclose(mw[key], ms[key], rel_tol=RTOL64, abs_tol=1e-12), key
        assert math.isclose(whole.grad_norm, split.grad_norm, rel_tol=RTOL64)
        assert math.isclose(whole.chain_tv_k, split.chain_tv_k, rel_tol=RTOL64) and whole.chain_tv_k > 0
        assert torch.allclose(whole.pi_k.logp, split.pi_k.logp, rtol=RTOL64, atol=1e-12)
        assert torch.allclose(whole.pi_k.entropy, split.pi_k.entropy, rtol=RTOL64, atol=1e-12)


def test_the_cases_exercise_clipping():
    """The second inner step of the equality cases moves far enough that the clip acts (else the clip
    statistics would be compared only as zeros)."""
    out, _ = optimise_case("dapo", "token", True, micro_batch=4)
    assert out.stats.metrics()["clip_ratio/region_mean"] > 0


@pytest.mark.slow
def test_a_run_in_micro_batches_logs_the_unsplit_runs_metrics(tmp_path):
    """Two steps (lag 0 and lag 1), held-out prompts, KL, TV and in-sample diagnostics: every logged number of a run
    in micro-batches of 5 completions and logit chunks of 7 tokens equals the unsplit run's. Both runs sample the same
    completions (each row draws from its own stream), which the sample dumps confirm."""
    kw = dict(sampler="transformers", progress=False, max_steps=2, sync_period=2, heldout_prompts=2, prompts_per_step=4,
              num_generations=4, num_iterations=2, beta=0.04, seed=3, logging_steps=1000, tv_diagnostics=True,
              insample_diagnostics=True, adam_epsilon=RUN_ADAM_EPSILON)
    whole = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "whole"), **kw), log=lambda *a: None))
    split = read_metrics(train(GRPOConfig(output_dir=str(tmp_path / "split"), per_device_train_batch_size=5,
                                          logit_chunk_tokens=7, **kw), log=lambda *a: None))
    for rw, rs in zip(whole, split, strict=True):
        keys = [k for k in rw if not is_wall_clock(k)]
        assert keys == [k for k in rs if not is_wall_clock(k)]
        assert "tv/pi_k_alpha_chain_ub_est" in keys and "insample/tv/pi_new_alpha_chain_ub_est" in keys
        for k in keys:  # differences of estimates (bounds, standard errors) to the size of what they difference
            assert same_metric(rw, rs, k, RUN_RTOL, RUN_ATOL, kw["heldout_prompts"]), (rw["step"], k, rw[k], rs[k])
    assert split[1]["tv/pi_k_alpha_chain_ub_est"] > 0
    assert (tmp_path / "whole" / "samples.jsonl").read_text() == (tmp_path / "split" / "samples.jsonl").read_text()


# ---- TRL's token-level knobs: bnpo, the entropy mask, the entropy bonus, truncation masking ----------------------


def _tiny_step(seed=0):
    """The tiny model, a batch of 2 groups of 3 completions with alpha = pi_k (lag 0) and advantages."""
    import numpy as np

    from llm.tensors.batch import make_batch
    from llm.models.model import load_policy
    from llm.models.tiny import tiny_model_dir
    from tests.helpers import sequences

    torch.manual_seed(seed)
    policy, tok = load_policy(str(tiny_model_dir()), torch.device("cpu"))
    policy.double()
    prompts, comps = sequences(tok, 6, seed=seed)
    batch = make_batch([prompts[j // 3] for j in range(6)], comps, tok.pad_token_id, "cpu")
    adv = np.array([[1.0, -0.5, -0.5], [0.3, -0.6, 0.3]])
    return policy, batch, adv


def _grad(policy, batch, adv, keep, **objective):
    """The gradient of one optimiser step (SGD lr 0: the weights stay) with the objective's knobs."""
    import numpy as np

    from llm.tensors.passes import Passes
    from llm.models.model import Precision
    from llm.optim import Objective, optimise

    passes = Passes(1.0, Precision(), micro_batch=objective.pop("micro_batch", 0), group_size=3, share_prompts=False)
    groups = objective.pop("groups", np.ones(2, bool))
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    optimise(passes, Objective(max_grad_norm=0.0, max_completion_length=6, **objective), policy, opt, batch, adv,
             groups, None, None, sequence_keep=keep)
    return torch.cat([p.grad.flatten() for p in policy.parameters()])


def test_bnpo_is_dapo_in_one_pass_and_each_passs_own_mean_in_several():
    from llm.models.distributed import SINGLE
    from llm.optim.update import bnpo_weights

    policy, batch, adv = _tiny_step()
    assert same_gradient(_grad(policy, batch, adv, None, loss_type="bnpo"),
                         _grad(policy, batch, adv, None, loss_type="dapo"), RTOL64)
    on = batch.completion_mask.double()
    parts = [torch.tensor([0, 1]), torch.tensor([2, 3, 4, 5])]
    w = bnpo_weights(on, parts, SINGLE)
    assert torch.allclose(w[:2].sum(), torch.tensor(0.5, dtype=w.dtype)) and torch.allclose(w[2:].sum(),
                                                                                            torch.tensor(0.5, dtype=w.dtype))
    assert torch.allclose(w[0][on[0] > 0], 0.5 / on[:2].sum().expand(int(on[0].sum())))


def test_the_entropy_mask_keeps_the_top_share_of_tokens_by_trls_quantile():
    from llm.optim.update import high_entropy_mask

    ent = torch.tensor([[0.1, 0.5, 0.9, 0.0], [0.3, 0.7, 0.2, 0.4]])
    on = torch.tensor([[True, True, True, False], [True, True, True, True]])
    mask = high_entropy_mask(ent, on, 0.5)
    threshold = torch.quantile(ent[on], 0.5)  # TRL: entropy >= the (1 - q)-quantile of the loss tokens
    assert torch.equal(mask.bool(), (ent >= threshold) & on) and int(mask.sum()) == 4


def test_the_entropy_bonus_adds_minus_coef_times_the_gradient_of_the_mean_entropy():
    """entropy_coef c: the step's gradient is the plain one minus c times the gradient of the mean next-token entropy
    over the loss tokens, computed here through the model's own logits."""
    from tests.helpers import plain_full

    policy, batch, adv = _tiny_step(1)
    plain = _grad(policy, batch, adv, None)
    with_bonus = _grad(policy, batch, adv, None, entropy_coef=0.3)
    policy.zero_grad(set_to_none=True)
    full = plain_full(policy, batch)
    m = batch.completion_mask.double()
    ((-(full.exp() * full).sum(-1) * m).sum() / m.sum()).backward()
    entropy_grad = torch.cat([p.grad.flatten() for p in policy.parameters()])
    assert same_gradient(with_bonus, plain - 0.3 * entropy_grad, SHARED_GRAD_RTOL)  # float32 RMSNorm variance


def _entropy_gradient(policy, batch, tokens: torch.Tensor) -> torch.Tensor:
    """The gradient of the mean next-token entropy over ``tokens`` (B, T), through the model's own logits."""
    from tests.helpers import plain_full

    policy.zero_grad(set_to_none=True)
    full = plain_full(policy, batch)
    m = tokens.double()
    ((-(full.exp() * full).sum(-1) * m).sum() / m.sum()).backward()
    return torch.cat([p.grad.flatten() for p in policy.parameters()])


def test_the_entropy_bonus_and_quantile_act_on_trls_tokens():
    """As TRL 1.16 (``GRPOTrainer._compute_loss``): the bonus is over every completion token, a masked zero-variance
    group's included (TRL has no such mask); with top_entropy_quantile < 1 the quantile is over the same tokens and the
    bonus acts only on the tokens the entropy mask keeps (``effective_mask``), the policy term too."""
    import numpy as np

    from llm.optim.update import high_entropy_mask
    from tests.helpers import plain_full

    policy, batch, adv = _tiny_step(1)
    groups = np.array([True, False])  # the second group leaves the policy term (the zero-variance mask)
    plain = _grad(policy, batch, adv, None, groups=groups)
    every = batch.completion_mask
    got = _grad(policy, batch, adv, None, groups=groups, entropy_coef=0.3)
    assert same_gradient(got, plain - 0.3 * _entropy_gradient(policy, batch, every), SHARED_GRAD_RTOL)
    with torch.no_grad():
        full = plain_full(policy, batch)
        ent = -(full.exp() * full).sum(-1)
    emask = high_entropy_mask(ent, every > 0, 0.5)
    assert 0 < emask.sum() < every.sum()
    masked_plain = _grad(policy, batch, adv, None, groups=groups, top_entropy_quantile=0.5)
    got = _grad(policy, batch, adv, None, groups=groups, top_entropy_quantile=0.5, entropy_coef=0.3)
    assert same_gradient(got, masked_plain - 0.3 * _entropy_gradient(policy, batch, emask), SHARED_GRAD_RTOL)


def test_truncated_completions_leave_the_loss_but_count_in_their_groups_advantages():
    """sequence_keep drops completions from the loss: the gradient is that of the kept completions alone (the dapo
    normaliser counting their tokens only), with the advantages computed from every completion."""
    import numpy as np

    policy, batch, adv = _tiny_step(2)
    keep = np.array([True, False, True, True, True, False])
    masked = _grad(policy, batch, adv, keep)
    zeroed = adv.copy().reshape(-1)
    zeroed[~keep] = 0.0  # a completion with advantage 0 adds nothing, but its tokens still count in the normaliser
    n_all, n_kept = float(batch.completion_mask.sum()), float(batch.completion_mask[torch.tensor(keep)].sum())
    assert same_gradient(masked, _grad(policy, batch, zeroed.reshape(2, 3), None) * n_all / n_kept, SHARED_GRAD_RTOL)


# ---- VCPO's ESS-guided step -----------------------------------------------------------------------------------


def test_the_ess_factor_is_vcpos_on_the_sequence_weights():
    """``ess_lr_factor`` against a transcription of the authors' rule (mit-han-lab/vcpo: ESS = (sum w)^2 /
    (sum w^2 + 1e-8), rho = ESS / n, lr x sqrt(min(1, rho / base)) or linear), w = exp(sum_t log pi_k/alpha)."""
    from llm.optim.update import ess_lr_factor

    g = torch.Generator().manual_seed(0)
    logp_k = -torch.rand(5, 4, generator=g, dtype=torch.float64)
    logp_alpha = logp_k + 0.4 * torch.randn(5, 4, generator=g, dtype=torch.float64)
    mask = torch.ones(5, 4, dtype=torch.bool)
    mask[1, 2:] = False
    mask[4] = False  # no loss token: not a completion of the step
    w = torch.exp(((logp_k - logp_alpha) * mask).sum(1))[:4]
    rho = float(w.sum() ** 2 / ((w**2).sum() + 1e-8)) / 4
    assert 0.2 < rho < 0.95
    for rule, base in (("sqrt", 1.0), ("linear", 1.0), ("sqrt", 0.5), ("sqrt", rho / 2)):
        want = min(1.0, rho / base)
        want = math.sqrt(want) if rule == "sqrt" else want
        assert ess_lr_factor(logp_k, logp_alpha, mask, rule, base) == pytest.approx(want, rel=1e-7)  # their 1e-8
    assert ess_lr_factor(logp_k, None, mask, "sqrt", 1.0) == 1.0  # lag 0: every weight 1
    huge = logp_k - 500.0 * mask / mask.sum(1, keepdim=True).clamp(min=1)  # every w = e^500: equal, no overflow
    assert ess_lr_factor(logp_k, huge, mask, "sqrt", 1.0) == pytest.approx(1.0)


def test_an_ess_scaled_step_is_the_plain_step_at_the_scaled_rate_and_the_schedule_is_restored():
    """With AdamW, a step at lr x factor; the optimiser's learning rate afterwards is the schedule's own."""
    import copy

    import numpy as np

    from llm.tensors.passes import Passes
    from llm.models.model import Precision
    from llm.optim import Objective, optimise
    from llm.optim.update import ess_lr_factor

    policy, batch, adv = _tiny_step(2)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        from llm.tensors.logprobs import completion_logprobs

        logp_k = completion_logprobs(policy, batch, 1.0).logp
    logp_alpha = (logp_k + 0.5 * torch.randn(logp_k.shape, generator=g, dtype=logp_k.dtype)) * batch.completion_mask
    passes = Passes(1.0, Precision(), micro_batch=0, group_size=3, share_prompts=False)
    groups = np.ones(2, bool)
    factor = ess_lr_factor(logp_k, logp_alpha, batch.completion_mask > 0, "sqrt", 1.0)
    assert 0.1 < factor < 0.95
    after = []
    for scaling, lr in (("sqrt", 1e-3), ("none", 1e-3 * factor)):
        model = copy.deepcopy(policy)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        out = optimise(passes, Objective(max_grad_norm=0.0, max_completion_length=6, num_iterations=2,
                                         ess_scaling=scaling), model, opt, batch, adv, groups, logp_alpha, None)
        assert opt.param_groups[0]["lr"] == lr
        assert out.lr_factor == (pytest.approx(factor) if scaling == "sqrt" else None)
        after.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.allclose(after[0], after[1], rtol=1e-9, atol=1e-12)
    assert not torch.allclose(after[0], torch.cat([p.detach().flatten() for p in policy.parameters()]))
