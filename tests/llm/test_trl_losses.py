"""TRL 1.16's loss types and off-policy sequence mask, here as TRL computes them (docs/trl.md): on one model and one
micro-batch, ``llm.tensors.loss.grpo_loss`` (pi_k in TRL's pi_old, alpha in its sampler's log-probs, the TRL mode's weight
in its vLLM importance-sampling ratio) equals ``GRPOTrainer._compute_loss`` of TRL's own trainer in loss and gradient,
for every loss type, importance-sampling mode and the mask, on a reused batch (pi_old != pi_theta) and a mismatched
sampler (alpha != pi_old). ``make check-trl-losses`` prints the same comparison as a table."""

import functools
import math
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from llm.tensors.loss import Clip, grpo_loss, loss_weights  # noqa: E402
from llm.models.model import load_tokenizer  # noqa: E402
from llm.models.tiny import tiny_model_dir  # noqa: E402
from grpo_theory.loss_types import loss_type as registered  # noqa: E402

#: Relative agreement asked of the loss and of the gradient's norm-wise difference (float32, one micro-batch).
RTOL = 1e-5
TRL_DEFAULTS = dict(sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, vespo_k_pos=2.0, vespo_lambda_pos=3.0,
                    vespo_k_neg=3.0, vespo_lambda_neg=2.0)


@functools.lru_cache(maxsize=1)
def _built(tmp: str):
    settings = dict(output_dir=str(Path(tmp) / "out"), max_steps=1, num_generations=4, per_device_train_batch_size=8,
                    max_completion_length=6, beta=0.0, report_to="none", save_strategy="no", use_cpu=True, seed=0,
                    bf16=False, disable_tqdm=True, vllm_importance_sampling_mode="token_truncate")
    model_dir = tiny_model_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                            args=trl.GRPOConfig(**settings),
                            train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 8}),
                            processing_class=load_tokenizer(str(model_dir)))
    t.use_vllm, t.vllm_importance_sampling_correction = True, True  # TRL's vLLM path: the ratio multiplies the loss
    t.model.train()
    t.current_gradient_accumulation_steps = 1  # set by TRL's training loop: one micro-batch per optimiser step
    return t


def trl_trainer(tmp_path, loss_type="dapo", vllm_importance_sampling_mode="token_truncate",
                off_policy_mask_threshold=None, importance_sampling_level="token", epsilon_high=None, delta=None,
                **ignored):
    """TRL 1.16's GRPOTrainer, built once, with one case's settings where its ``_compute_loss`` reads them (the
    attributes its ``__init__`` sets from GRPOConfig, and ``args`` for delta and the SAPO and VESPO knobs; a fresh
    trainer per case gave the same numbers at a second each)."""
    t = _built(str(Path(tempfile.gettempdir()) / "offpolicy_trl_losses"))
    none = vllm_importance_sampling_mode == "none"  # TRL's correction off: its mode is not read
    t.vllm_importance_sampling_correction = not none
    t.loss_type = loss_type
    t.vllm_importance_sampling_mode = "token_truncate" if none else vllm_importance_sampling_mode
    t.off_policy_mask_threshold, t.importance_sampling_level = off_policy_mask_threshold, importance_sampling_level
    t.epsilon_low, t.epsilon_high = 0.2, 0.2 if epsilon_high is None else epsilon_high
    t.args.delta = delta
    for name, value in TRL_DEFAULTS.items():
        setattr(t.args, name, value)
    return t


def trl_ratio(old, sampling, mask, mode: str, cap: float, cap_min: float | None):
    """TRL's vLLM importance-sampling ratio of ``mode`` (its ``_generate_and_score_completions``)."""
    diff = (old - sampling) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    lo = 0.0 if cap_min is None else cap_min
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=lo, max=cap)
    return ratio.masked_fill((ratio < lo) | (ratio > cap), 0.0)


def inputs(t, seed: int, drift: float, mismatch: float):
    """A micro-batch of 8 completions of 1-6 tokens (prompts of 2-4 tokens, left-padded), advantages of both signs,
    TRL's old log-probs = pi_theta's + ``drift`` noise (a reused batch) and the sampler's = those + ``mismatch``."""
    g = torch.Generator().manual_seed(seed)
    B, P, T = 8, 4, 6
    vocab = t.model.config.vocab_size
    prompt_ids = torch.randint(3, vocab, (B, P), generator=g)
    prompt_mask = (torch.arange(P)[None, :] >= torch.randint(0, 3, (B, 1), generator=g)).long()
    completion_ids = torch.randint(3, vocab, (B, T), generator=g)
    lengths = torch.tensor([6, 1, 3, 6, 5, 2, 4, 6])
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    advantages = torch.randn(B, generator=g)
    ids, attention = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        logp, _, _ = t._get_per_token_logps_and_entropies(t.model, ids, attention, T)
    mask = completion_mask.float()
    old = (logp + drift * torch.randn(B, T, generator=g)) * mask
    sampling = (old + mismatch * torch.randn(B, T, generator=g)) * mask
    return dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                completion_mask=completion_mask, advantages=advantages, old_per_token_logps=old,
                sampling_per_token_logps=sampling, num_items_in_batch=mask.sum())


def compare(tmp_path, loss_type: str, mode: str, mask: float | None = None, level: str = "token", seed: int = 0,
            drift: float = 0.3, mismatch: float = 0.6, epsilon_high: float | None = None, cap: float = 2.0,
            cap_min: float | None = None, delta: float | None = None, beta: float = 0.0):
    """(TRL's loss, ours, the gradients' relative difference, the share of completions the mask dropped). The
    sampler's log-probs are off by ``mismatch`` nats per token (sd), so the cap 2 binds on both sides of it."""
    args = dict(loss_type=loss_type, vllm_importance_sampling_mode=mode, off_policy_mask_threshold=mask,
                importance_sampling_level=level, epsilon_high=epsilon_high, vllm_importance_sampling_clip_max=cap,
                vllm_importance_sampling_clip_min=cap_min, delta=delta)
    t = trl_trainer(tmp_path, **args)
    t.beta, t.args.use_bias_correction_kl = beta, True
    batch = inputs(t, seed, drift, mismatch)
    m = batch["completion_mask"].float()
    g = torch.Generator().manual_seed(seed + 7)
    batch["ref_per_token_logps"] = (batch["old_per_token_logps"] + 0.2 * torch.randn(m.shape, generator=g)) * m
    if mode != "none":  # TRL computes the ratio only with its correction on
        batch["importance_sampling_ratio"] = trl_ratio(batch["old_per_token_logps"],
                                                       batch["sampling_per_token_logps"], m, mode, cap, cap_min)
    params = [p for p in t.model.parameters() if p.requires_grad]
    theirs = t._compute_loss(t.model, batch)
    g_theirs = torch.autograd.grad(theirs, params)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    completion_length = ids.shape[1] - batch["prompt_ids"].shape[1]
    logp, _, _ = t._get_per_token_logps_and_entropies(t.model, ids, attention, completion_length)
    spec = Clip(epsilon=0.2, epsilon_high=epsilon_high, delta=delta or 0.0,
                ratio_level={"token": "token", "sequence": "sequence_normalised"}[level],
                importance_sampling_mode=mode, importance_sampling_cap=cap, importance_sampling_cap_min=cap_min or 0.0,
                objective=registered(loss_type).objective, off_policy_mask_threshold=mask, **TRL_DEFAULTS)
    weights = loss_weights(m, loss_type, 6)
    ours, _ = grpo_loss(logp, batch["old_per_token_logps"], batch["sampling_per_token_logps"], batch["advantages"],
                        weights, clip=spec, beta=beta, logp_ref=batch["ref_per_token_logps"])
    g_ours = torch.autograd.grad(ours, params)
    diff = math.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in zip(g_theirs, g_ours)))
    norm = math.sqrt(sum(float((a ** 2).sum()) for a in g_theirs))
    dropped = 0.0
    if mask is not None:
        kept = t.get_off_policy_mask(batch["advantages"][:, None], logp, batch["sampling_per_token_logps"], m, mask)
        dropped = 1.0 - float(kept.mean())
    return float(theirs), float(ours), diff / max(norm, 1e-30), dropped


CASES = [(lt, mode) for lt in ("cispo", "sapo", "luspo", "grpo", "dapo")
         for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "none")] + \
        [("vespo", "token_truncate"), ("vespo", "token_mask"), ("vespo", "none")]


@pytest.mark.slow
@pytest.mark.parametrize("loss_type, mode", CASES)
@pytest.mark.parametrize("mask", [None, 0.02])
def test_each_loss_type_and_mode_equals_trls_compute_loss_in_loss_and_gradient(tmp_path, loss_type, mode, mask):
    level = "sequence" if loss_type == "luspo" else "token"
    theirs, ours, grad_rel, dropped = compare(tmp_path, loss_type, mode, mask, level,
                                              epsilon_high=5.0 if loss_type == "cispo" else None)
    assert ours == pytest.approx(theirs, rel=RTOL, abs=1e-7)
    assert grad_rel < RTOL
    if mask is not None:
        assert 0 < dropped < 1  # the mask acts on this batch: some negative-advantage completions drift past 0.02


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "grpo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_the_cap_binds_on_these_batches_so_truncating_and_masking_differ(tmp_path, loss_type, level):
    truncated = compare(tmp_path, loss_type, f"{level}_truncate", epsilon_high=5.0 if loss_type == "cispo" else None)
    masked = compare(tmp_path, loss_type, f"{level}_mask", epsilon_high=5.0 if loss_type == "cispo" else None)
    assert abs(truncated[0] - masked[0]) > 1e-3 * abs(truncated[0])


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "grpo"])
def test_the_other_knobs_as_trl_reads_them(tmp_path, loss_type):
    """A lower cap, the two-sided clip, GSPO's sequence level and no mismatch (alpha = pi_old), each as TRL."""
    for kwargs in (dict(cap_min=0.5), dict(delta=1.5, epsilon_high=0.28), dict(level="sequence"), dict(mismatch=0.0),
                   dict(drift=0.0)):
        kwargs.setdefault("epsilon_high", 3.0 if loss_type == "cispo" else None)
        if "delta" in kwargs and loss_type == "cispo":
            continue  # TRL's delta clips only the clip family
        if kwargs.get("level") == "sequence" and loss_type == "cispo":
            continue  # refused here, warned by TRL (a sequence's one ratio weighted by its length)
        theirs, ours, grad_rel, _ = compare(tmp_path, loss_type, "token_truncate", **kwargs)
        assert ours == pytest.approx(theirs, rel=RTOL, abs=1e-7), kwargs
        assert grad_rel < RTOL, kwargs


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "cispo"])
def test_with_the_correction_off_the_kl_term_is_weighted_as_trls(tmp_path, loss_type):
    """beta > 0 with mode none: TRL multiplies k3 by pi/pi_old (its correction off, no ratio formed), and so does
    this loss (with a TRL mode it weights k3 by pi/alpha, the tokens' sampler: docs/trl.md)."""
    theirs, ours, grad_rel, _ = compare(tmp_path, loss_type, "none", beta=0.3,
                                        epsilon_high=5.0 if loss_type == "cispo" else None)
    assert ours == pytest.approx(theirs, rel=RTOL, abs=1e-7)
    assert grad_rel < RTOL
    plain = compare(tmp_path, loss_type, "none", epsilon_high=5.0 if loss_type == "cispo" else None)[0]
    assert abs(theirs - plain) > 1e-3  # the KL term is there


def main() -> int:
    """``make check-trl-losses``: every case above as a table (TRL's loss, ours, the gradients' relative difference,
    the share of completions the off-policy mask dropped)."""
    import tempfile
    from pathlib import Path

    print("| loss_type | vllm_importance_sampling_mode | off_policy_mask_threshold | TRL's loss | ours | "
          "gradient rel. diff | masked |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for mask in (None, 0.02):
            for loss_type, mode in CASES:
                level = "sequence" if loss_type == "luspo" else "token"
                theirs, ours, grad_rel, dropped = compare(Path(tmp), loss_type, mode, mask, level,
                                                          epsilon_high=5.0 if loss_type == "cispo" else None)
                worst = max(worst, grad_rel, abs(ours - theirs) / max(abs(theirs), 1e-7))
                print(f"| {loss_type}{' (sequence)' if level == 'sequence' else ''} | {mode} | {mask} | "
                      f"{theirs:+.6f} | {ours:+.6f} | {grad_rel:.1e} | {dropped:.2f} |")
    print(f"largest relative difference: {worst:.1e} (asked: {RTOL:.0e})")
    return 0 if worst < RTOL else 1


if __name__ == "__main__":
    raise SystemExit(main())


def test_vespo_counts_the_tokens_whose_weight_the_mode_truncated():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=g)
    logp_alpha = logp + 0.3 * torch.randn(4, 5, generator=g)
    weights = loss_weights(torch.ones(4, 5), "vespo", 5)
    share = float(((logp - logp_alpha) > math.log(1.1)).float().mean())  # w = pi_k/alpha above the cap, pi_k = pi
    for objective in ("vespo", "cispo", "sapo"):
        spec = Clip(importance_sampling_mode="token_mask", importance_sampling_cap=1.1, objective=objective)
        _, stats = grpo_loss(logp, logp, logp_alpha, torch.randn(4, generator=g), weights, clip=spec)
        assert stats.metrics()["is_correction/frac_above_cap"] == pytest.approx(share) and share > 0.2


@pytest.mark.parametrize("kwargs, words", [
    (dict(loss_type="sapo", vllm_importance_sampling_mode="token_mask", sapo_temperature_neg=-1.0),
     "sapo_temperature_neg: SAPO's temperatures must be > 0, got -1.0"),
    (dict(loss_type="vespo", vllm_importance_sampling_mode="token_mask", vespo_lambda_neg=-1.0),
     "vespo_lambda_neg: VESPO's rates lambda must be > 0, got -1.0"),
    (dict(loss_type="vespo", vllm_importance_sampling_mode="sequence_truncate"),
     "vllm_importance_sampling_mode='sequence_truncate' (here importance_sampling_mode): loss_type vespo folds"),
    (dict(loss_type="vespo"), "token_mask (as TRL), or none (TRL's correction off), got 'paper'"),
    (dict(loss_type="dppo_tv", vllm_importance_sampling_mode="token_truncate"), "got 'token_truncate'"),
    (dict(loss_type="cispo", vllm_importance_sampling_mode="token_mask", importance_sampling_level="sequence"),
     "(TRL's importance_sampling_level sequence) need loss_type grpo, sapo or luspo; cispo would"),
    (dict(loss_type="vespo", vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=0.9),
     "loss_type vespo needs a band"),
    (dict(vllm_importance_sampling_correction="sometimes"), "vllm_importance_sampling_correction"),
])
def test_a_refused_combination_names_the_field_and_value_the_user_gave(kwargs, words):
    from llm.config.trl import from_trl

    with pytest.raises(ValueError) as info:
        from_trl(**kwargs)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_trl_and_verl_spellings_of_the_new_options_are_read():
    from llm.config.trl import from_trl

    c = from_trl(loss_type="dppo_tv", clip_ratio_low=0.15, clip_ratio_high=0.2,
                 vllm_importance_sampling_correction=True)
    assert (c.objective.epsilon, c.objective.epsilon_high) == (0.15, 0.2)
    assert from_trl(loss_type="cispo", vllm_importance_sampling_mode="token_mask", epsilon_high=12.0
                    ).objective.epsilon_high == 12.0  # a cap on pi/pi_k, not a clip width
    luspo = from_trl(loss_type="luspo", importance_sampling_level="sequence")
    assert luspo.objective.ratio_level == "sequence_normalised"


def test_trls_correction_switch_off_is_mode_none_on_both_edges():
    """TRL's ``vllm_importance_sampling_correction=False`` (PPO's clip of pi/pi_old alone; TRL then reads no mode) is
    mode none in ``from_trl`` and on the command line, whatever mode was given beside it; True leaves the mode."""
    from llm.config.trl import from_trl, translate_trl_args

    for kwargs in (dict(), dict(vllm_importance_sampling_mode="token_mask")):
        assert from_trl(vllm_importance_sampling_correction=False, **kwargs).objective.importance_sampling_mode == \
            "none"
    assert from_trl(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_mask"
                    ).objective.importance_sampling_mode == "token_mask"
    for argv in (["--vllm-importance-sampling-correction", "false"], ["--no-vllm-importance-sampling-correction"],
                 ["--vllm_importance_sampling_correction=False", "--vllm-importance-sampling-mode", "token_mask"]):
        assert translate_trl_args(argv) == ["--importance-sampling-mode", "none"], argv
    assert translate_trl_args(["--vllm-importance-sampling-correction"]) == []
    # beside this project's own --importance-sampling-mode: agreeing is taken, contradicting is one line naming both
    assert from_trl(vllm_importance_sampling_correction=False, importance_sampling_mode="none"
                    ).objective.importance_sampling_mode == "none"
    assert translate_trl_args(["--importance-sampling-mode", "none", "--no-vllm-importance-sampling-correction"]) == \
        ["--importance-sampling-mode", "none"]
    for kwargs, argv, words in (
            (dict(vllm_importance_sampling_correction=False, importance_sampling_mode="paper"),
             ["--vllm-importance-sampling-correction", "false", "--importance-sampling-mode=paper"],
             "False is importance_sampling_mode none, but importance_sampling_mode 'paper' was given beside it"),
            (dict(vllm_importance_sampling_correction=True, importance_sampling_mode="none"),
             ["--importance-sampling-mode", "none", "--vllm-importance-sampling-correction", "true"],
             "True contradicts importance_sampling_mode 'none'")):
        for call in (lambda: from_trl(**kwargs), lambda: translate_trl_args(argv)):
            with pytest.raises(ValueError) as info:
                call()
            assert words in str(info.value) and "\n" not in str(info.value)
