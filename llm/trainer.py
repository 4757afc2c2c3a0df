"""Algorithm 1 of PAPER.md on a causal language model: ``train(config)``.

Read top to bottom: each step does rollout, score, advantages, optimise, diagnose, log; the
weights go to the sampler every ``sync_period`` (v) steps and to pi_ref every ``ref_sync_steps``.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import grpo_theory as gt

from .config import GRPOConfig
from .diagnostics import entropy_rows, group_bound_estimates, token_tv_upper_bound
from .loss import grpo_loss
from .rundir import RunDir
from .sampler import Rollout, Sampler, TransformersSampler, copy_weights, frozen_copy
from .tasks import load_task

#: Warn when sampler and trainer log-probs of the same tokens differ by more than this (worst token of
#: the batch) right after a sync. float32 engines agree to ~5e-6 per token at the median and up to
#: ~7e-5 on rare tokens (log-prob < -10) over batches of ~1,500 tokens; bfloat16 ones differ by
#: rounding (~2e-2). A stale engine is off by more than 1 nat.
SYNC_LOGP_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.25}


# ----------------------------------------------------------------------------------------------
# Helpers: model loading, batches, log-probabilities
# ----------------------------------------------------------------------------------------------


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available")
    return torch.device(device)


def resolve_model_path(config: GRPOConfig, log=print) -> str:
    if config.model_name_or_path:
        return config.model_name_or_path
    from .tiny import tiny_model_dir

    return str(tiny_model_dir(log=log))


def load_policy(path: str, device: torch.device):
    """The policy with float32 master weights (bf16 runs use autocast) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # float32 master weights
    except OSError as exc:
        raise ValueError(f"model_name_or_path: cannot load {path!r} ({exc})") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device), tokenizer


@dataclass
class Batch:
    """Prompt (left-padded) + completion (right-padded) sequences of one step, B = P x G rows."""

    input_ids: torch.Tensor       # (B, Lp + T)
    attention_mask: torch.Tensor  # (B, Lp + T)
    position_ids: torch.Tensor    # (B, Lp + T), counted from each sequence's first real token
    completion_ids: torch.Tensor  # (B, T)
    completion_mask: torch.Tensor  # (B, T) float, 1 on generated tokens (EOS included)
    prompt_width: int


def make_batch(prompt_ids: list[list[int]], completions: list[list[int]], pad: int, device) -> Batch:
    lp = max(map(len, prompt_ids))
    t = max(1, max(map(len, completions)))
    rows, masks, comp, cmask = [], [], [], []
    for p, c in zip(prompt_ids, completions):
        rows.append([pad] * (lp - len(p)) + p + c + [pad] * (t - len(c)))
        masks.append([0] * (lp - len(p)) + [1] * (len(p) + len(c)) + [0] * (t - len(c)))
        comp.append(c + [pad] * (t - len(c)))
        cmask.append([1.0] * len(c) + [0.0] * (t - len(c)))
    attn = torch.tensor(masks, device=device)
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
    return Batch(torch.tensor(rows, device=device), attn, pos, torch.tensor(comp, device=device),
                 torch.tensor(cmask, device=device), lp)


#: Mixed precision of the trainer's forward passes (set from config.dtype by ``train``): weights and
#: optimiser stay float32, matmuls run in this dtype under autocast, log-probs are float32.
_AUTOCAST: dict = {"dtype": None}


def completion_logprobs(model, batch: Batch, temperature: float, full: bool = False):
    """log softmax(logits / T) of the completion tokens, float32, (B, T); with ``full`` also the
    whole next-token distributions (B, T, V)."""
    dtype = _AUTOCAST["dtype"]
    with torch.autocast(batch.input_ids.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids, use_cache=False).logits
    t = batch.completion_ids.shape[1]
    logits = logits[:, batch.prompt_width - 1: batch.prompt_width - 1 + t].float() / temperature
    logp_full = torch.log_softmax(logits, dim=-1)
    logp = logp_full.gather(-1, batch.completion_ids[..., None]).squeeze(-1)
    return (logp, logp_full) if full else (logp, None)


def padded(rows: list[list[float]], t: int, device) -> torch.Tensor:
    return torch.tensor([r + [0.0] * (t - len(r)) for r in rows], dtype=torch.float32, device=device)


def make_sampler(config: GRPOConfig, model, tokenizer, model_path: str, max_prompt_tokens: int) -> Sampler:
    kind = config.sampler
    if kind == "auto":
        from .vllm_sampler import vllm_available

        kind = "vllm" if vllm_available() else "transformers"
    if kind == "vllm":
        from .vllm_sampler import VLLMSampler

        return VLLMSampler(model_path, dtype=config.dtype, seed=config.seed,
                           max_model_len=_max_model_len(model, config, max_prompt_tokens),
                           eos_token_id=tokenizer.eos_token_id)
    return TransformersSampler(model, tokenizer.eos_token_id, tokenizer.pad_token_id)


def _max_model_len(model, config: GRPOConfig, max_prompt_tokens: int) -> int:
    """Longest sequence the engine must hold: the longest prompt plus the completion budget."""
    limit = int(getattr(model.config, "max_position_embeddings", 1 << 20))
    need = max_prompt_tokens + config.max_completion_length
    if need > limit:
        raise ValueError(f"max_completion_length: prompts of {max_prompt_tokens} tokens plus "
                         f"{config.max_completion_length} generated exceed the model's {limit} positions")
    return need


def step_seed(seed: int, step: int) -> int:
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0])


# ----------------------------------------------------------------------------------------------
# The training loop
# ----------------------------------------------------------------------------------------------


def train(config: GRPOConfig, log=print) -> Path:
    """Run Algorithm 1 with ``config``; returns the run directory. Resumes if it holds a checkpoint."""
    from tqdm.auto import tqdm

    run = RunDir(config)
    ckpt = run.open()  # writes config.json before step 0
    if ckpt is not None and ckpt["step"] >= config.max_steps:
        log(f"{run.path} already holds a finished run of {ckpt['step']} steps (raise --max-steps to continue it)")
        return run.path
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    task = load_task(config.dataset, config.reward_fn)
    model_path = resolve_model_path(config, log=log)
    policy, tokenizer = load_policy(model_path, device)
    _AUTOCAST["dtype"] = torch.bfloat16 if config.dtype == "bfloat16" else None
    policy.train()
    if policy.config.vocab_size < len(tokenizer):
        raise ValueError("model_name_or_path: tokenizer is larger than the model's vocabulary")
    opt = torch.optim.AdamW(policy.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    prompt_tokens = tokenizer(list(task.prompts)).input_ids  # once; indexed by prompt every step
    sampler = make_sampler(config, policy, tokenizer, model_path, max(map(len, prompt_tokens)))
    # alpha's weights on the trainer side: for recomputed behaviour log-probs, TV diagnostics and
    # checkpoints (the transformers sampler's own copy serves; vLLM needs a separate copy).
    alpha_model = sampler.model if isinstance(sampler, TransformersSampler) else frozen_copy(policy)
    need_alpha = config.behaviour_logprobs == "recompute" or config.tv_diagnostics
    ref_model = frozen_copy(policy) if config.beta > 0 else None

    start = 0
    if ckpt is not None:
        start = ckpt["step"]
        policy.load_state_dict(ckpt["policy"])
        opt.load_state_dict(ckpt["optimizer"])
        alpha_tmp = frozen_copy(policy)
        alpha_tmp.load_state_dict(ckpt["alpha"])
        sampler.load_weights(alpha_tmp)
        if alpha_model is not getattr(sampler, "model", None):
            copy_weights(alpha_model, alpha_tmp)
        if ref_model is not None:
            ref_model.load_state_dict(ckpt["ref"])
        del alpha_tmp
        log(f"resuming {run.path} at step {start}")

    P, G, v = config.prompts_per_step, config.num_generations, config.sync_period
    n_params = sum(p.numel() for p in policy.parameters())
    log(f"off-policy GRPO: model {model_path} ({n_params / 1e6:.2f}M params, {config.dtype}, {device}), "
        f"sampler {sampler.name}, task {task.name} ({len(task.prompts)} prompts)")
    log(f"  per step: {P} prompts x G={G} = {config.completions_per_step} completions, "
        f"<= {config.completions_per_step * config.max_completion_length} generated tokens, "
        f"i={config.num_iterations} optimiser steps; v={v}: {config.num_syncs} weight syncs over "
        f"{config.max_steps} steps (saves {config.max_steps - config.num_syncs})")

    def prompts_of(step: int) -> list[int]:
        return task.sample(np.random.default_rng([config.seed, step]), P).tolist()

    stop = GracefulStop(log)
    window: dict[int, Rollout] = {}
    last_sync = start - start % v
    bar = tqdm(total=config.max_steps, initial=start, disable=not config.progress, dynamic_ncols=True, unit="step")
    step = start
    try:
        for step in range(start, config.max_steps):
            if stop.requested:
                break
            timings = {"time/sync": 0.0, "time/generate": 0.0}
            # ---- sync: every v steps the sampler gets the trainer's weights (alpha <- pi_theta)
            # (at step 0 the sampler already holds the initial weights)
            if step % v == 0 and step > 0:
                t0 = time.perf_counter()
                sampler.load_weights(policy)
                if alpha_model is not getattr(sampler, "model", None):
                    copy_weights(alpha_model, policy)
                timings["time/sync"] = time.perf_counter() - t0
                last_sync = step
                window.clear()
            lag = step - last_sync

            # ---- rollout: G completions per prompt from alpha (the whole window at once if enabled)
            idx = prompts_of(step)
            if step not in window:
                t0 = time.perf_counter()
                # A window always starts at its first step (also when resuming inside it), so a resumed
                # run draws exactly the completions the interrupted one did.
                w0 = step - step % v if config.window_generation else step
                steps = list(range(w0, min(w0 + v, config.max_steps))) if config.window_generation else [step]
                all_idx = [i for s in steps for i in prompts_of(s)]
                roll = sampler.generate([prompt_tokens[i] for i in all_idx], G,
                                        config.max_completion_length, config.temperature, step_seed(config.seed, w0))
                for j, s in enumerate(steps):
                    if s >= step:
                        window[s] = roll.slice(j * P * G, (j + 1) * P * G)
                timings["time/generate"] = time.perf_counter() - t0
            roll = window.pop(step)

            # ---- score: verifiable rewards in [0, 1]
            t0 = time.perf_counter()
            texts = tokenizer.batch_decode(roll.completion_ids, skip_special_tokens=True)
            answers = [task.answers[i] for i in idx for _ in range(G)]
            rewards = task.score(texts, answers).reshape(P, G)
            timings["time/score"] = time.perf_counter() - t0

            # ---- advantages: group whitening (grpo_theory), zero-variance mask
            t0 = time.perf_counter()
            adv = gt.group_advantages(rewards, config.variance_eps, scale=config.scale_rewards == "group")
            zero_std = np.ptp(rewards, axis=1) == 0
            keep = ~zero_std if config.mask_zero_std_groups else np.ones(P, bool)
            prompt_ids = [prompt_tokens[i] for i in idx for _ in range(G)]
            batch = make_batch(prompt_ids, roll.completion_ids, tokenizer.pad_token_id, device)
            T = batch.completion_ids.shape[1]
            adv_t = torch.tensor(adv.reshape(-1), dtype=torch.float32, device=device)
            seq_mask = torch.tensor(np.repeat(keep, G), dtype=torch.float32, device=device)

            # ---- log-probabilities: alpha (sampler or recomputed), pi_ref; pi_k comes from the first inner step
            t_alpha = time.perf_counter()
            with torch.no_grad():
                # alpha recomputed: always when needed for diagnostics/recompute, else right after a sync
                # (one forward per v steps) so that a stale sampler is always caught
                logp_alpha_re, full_alpha = (completion_logprobs(alpha_model, batch, config.temperature, full=need_alpha)
                                             if need_alpha or (lag == 0 and config.verify_sync) else (None, None))
                timings["time/alpha_forward"] = time.perf_counter() - t_alpha
                logp_ref = completion_logprobs(ref_model, batch, config.temperature)[0] if ref_model is not None else None
            logp_alpha_sampler = padded(roll.logprobs, T, device) if roll.logprobs is not None else None
            if config.behaviour_logprobs == "recompute" or logp_alpha_sampler is None:
                logp_alpha = logp_alpha_re
            else:
                logp_alpha = logp_alpha_sampler

            # ---- optimise: i steps on the clipped off-policy objective (+ beta KL)
            stats, grad_norm = {}, 0.0
            for it in range(config.num_iterations):
                logp, full = completion_logprobs(policy, batch, config.temperature, full=it == 0)
                if it == 0:  # the policy before any update is pi_k: its forward gives log pi_k (no extra pass)
                    logp_k, full_k = logp.detach(), full.detach()
                loss, stats = grpo_loss(
                    logp, logp_k, logp_alpha, adv_t, batch.completion_mask, clip=config.epsilon,
                    loss_type=config.loss_type, ratio_level=config.ratio_level,
                    max_completion_length=config.max_completion_length, beta=config.beta,
                    logp_ref=logp_ref, sequence_mask=seq_mask)
                if stats["num_loss_tokens"] == 0:
                    break  # every group masked: nothing to learn from this batch
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if config.max_grad_norm > 0:
                    grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm))
                opt.step()
            timings["time/train"] = time.perf_counter() - t0 - timings["time/alpha_forward"]

            # ---- diagnose: TV distances and Theorem 1 terms (grpo_theory) on this batch
            t0 = time.perf_counter()
            with torch.no_grad():
                logp_new, full_new = completion_logprobs(policy, batch, config.temperature, full=config.tv_diagnostics)
            cm = batch.completion_mask
            seq_lr_k = ((logp_k - logp_alpha) * cm).sum(1).cpu().numpy().reshape(P, G)
            seq_lr_new = ((logp_new - logp_alpha) * cm).sum(1).cpu().numpy().reshape(P, G)
            row = {"step": step, "lag": lag}
            lengths = cm.sum(1)
            row.update({
                "reward": float(rewards.mean()),
                "reward_std": float(rewards.std()),
                "frac_reward_zero_std": float(zero_std.mean()),
                "completions/mean_length": float(lengths.mean()),
                "completions/clipped_ratio": float(np.mean([
                    len(c) == 0 or c[-1] != tokenizer.eos_token_id for c in roll.completion_ids])),
                "entropy": float((entropy_rows(full_k) * cm).sum() / cm.sum()),
                "grad_norm": grad_norm,
            })
            row.update({k: v_ for k, v_ in stats.items() if k != "num_loss_tokens"})
            row.update(group_bound_estimates(rewards, seq_lr_k, seq_lr_new, config.variance_eps))
            if config.tv_diagnostics and full_alpha is not None:
                row["tv/pi_k_alpha_tok_ub"] = token_tv_upper_bound(full_k, full_alpha, cm)
                row["tv/pi_new_alpha_tok_ub"] = token_tv_upper_bound(full_new, full_alpha, cm)
            if logp_alpha_sampler is not None and logp_alpha_re is not None:
                diff = ((logp_alpha_sampler - logp_alpha_re).abs() * cm)
                row["sampling/logp_diff_mean"] = float(diff.sum() / cm.sum())
                row["sampling/logp_diff_max"] = float(diff.max())
                if lag == 0 and row["sampling/logp_diff_max"] > SYNC_LOGP_TOLERANCE[config.dtype]:
                    bar.write(f"WARNING step {step}: sampler and trainer log-probs differ by up to "
                              f"{row['sampling/logp_diff_max']:.2e} right after a weight sync (> {SYNC_LOGP_TOLERANCE[config.dtype]:g}): "
                              "the sampler may hold stale weights")
            timings["time/diagnostics"] = time.perf_counter() - t0
            row.update(timings)
            run.append_metrics(row)

            # ---- reference policy reset
            if ref_model is not None and config.ref_sync_steps and (step + 1) % config.ref_sync_steps == 0:
                copy_weights(ref_model, policy)

            # ---- checkpoint
            if config.save_steps and (step + 1) % config.save_steps == 0 and step + 1 < config.max_steps:
                _save(run, policy, opt, sampler, alpha_model, ref_model, step + 1, last_sync)
                run.append_samples([{"step": step, "prompt": task.prompts[idx[j // G]], "completion": texts[j],
                                     "reward": float(rewards.reshape(-1)[j])} for j in range(0, P * G, G)][:4])
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward']:.3f}", tv=f"{row['tv/pi_k_alpha']:.3f}", lag=lag)
            if not config.progress and (step % config.logging_steps == 0 or step + 1 == config.max_steps):
                log(f"step {step}: reward {row['reward']:.3f}  tv(pi_k,alpha) {row['tv/pi_k_alpha']:.4f}  "
                    f"bound/lower_tight {row['bound/lower_tight']:+.4f}  improvement {row['improvement']:+.4f}")
        else:
            step = config.max_steps
    except KeyboardInterrupt:  # a second Ctrl-C: the step in progress is inconsistent, keep the last checkpoint
        bar.close()
        stop.restore()
        log(f"aborted during step {step}; the last checkpoint in {run.path} is kept (run the same command to resume)")
        raise
    finally:
        stop.restore()
    bar.close()
    if stop.requested:
        _save(run, policy, opt, sampler, alpha_model, ref_model, step, last_sync)
        log(f"interrupted: checkpoint saved after step {step - 1} in {run.path}; run the same command to resume")
        raise KeyboardInterrupt
    _save(run, policy, opt, sampler, alpha_model, ref_model, config.max_steps, last_sync)
    policy.save_pretrained(run.path / "final_model")
    tokenizer.save_pretrained(run.path / "final_model")
    sampler.close()
    return run.path


class GracefulStop:
    """First Ctrl-C: finish the current step, checkpoint, exit. Second Ctrl-C: abort at once."""

    def __init__(self, log):
        self.requested = False
        self._log = log
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self._log("Ctrl-C: finishing this step, then saving a checkpoint (Ctrl-C again to abort)")

    def restore(self):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def _save(run: RunDir, policy, opt, sampler, alpha_model, ref_model, next_step: int, last_sync: int) -> None:
    """Checkpoint everything a resumed run needs: policy, optimiser, the lagged alpha and pi_ref."""
    run.save_checkpoint({
        "step": next_step,
        "last_sync": last_sync,
        "policy": policy.state_dict(),
        "optimizer": opt.state_dict(),
        "alpha": alpha_model.state_dict(),
        "ref": ref_model.state_dict() if ref_model is not None else None,
    })
