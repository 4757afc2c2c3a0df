"""The one training config of off-policy GRPO (Algorithm 1, docs/theory.md §7).

Field names follow TRL's GRPOConfig where the concept is the same; new concepts carry their
paper symbol in the docstring. Every bad value raises ``ValueError("<field>: <reason>")``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Literal

from grpo_theory.corrections import ImportanceSamplingMode, correction, require_correction_settings
from grpo_theory.estimators import DEFAULT_LCB_METHOD, LcbMethod
from grpo_theory.truncation import TokenFilter
from grpo_theory.validation import EPS_MAX
from runkit.validation import require, require_finite

#: Sampling temperatures accepted (vLLM treats lower ones as greedy decoding, which has no log-probabilities to
#: importance-weight; higher ones make every completion uniform noise).
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0


@dataclasses.dataclass
class GRPOConfig:
    """Off-policy GRPO (Mroueh et al., arXiv 2505.22257) on a causal language model."""

    # ---- model and data --------------------------------------------------------------------
    model_name_or_path: str = ""
    """Local model directory, hub name, or a .gguf file (or a directory holding one; converted once to a cached
    model directory, see llm.pretrained). Empty: the built-in tiny Qwen2 (built and cached locally)."""
    dataset: str = "arithmetic"
    """'arithmetic' (built in, with its own train/test split), 'reasoning_gym:<name>' (a procedural generator of the
    reasoning-gym package, e.g. reasoning_gym:basic_arithmetic, scored by its own checker; options below), or data in TRL's format read with ``datasets``: a
    .json/.jsonl/.parquet/.csv file, a directory written by save_to_disk (its 'train' split), or 'hf:<name>'. Rows
    have a 'prompt' (a string, or a list of messages rendered with the chat template), an optional 'answer' (the
    default reward's reference) and any other columns (passed to --reward-funcs by name); GSM8K's rows (question,
    answer ending in '#### N') are mapped onto it."""
    generator_kwargs: tuple[str, ...] = ()
    """Options of a procedural generator (``--dataset reasoning_gym:<name>``) as key=value, values read as Python
    literals: ``--generator-kwargs min_terms=2 max_terms=2 max_digits=1`` (the generator's own option names)."""
    generator_train_size: int = 1000
    """Training prompts drawn from a procedural generator (fewer when its problem space is smaller)."""
    generator_test_size: int = 100
    """Test prompts drawn from a procedural generator, none of them a training prompt."""
    generator_seed: int = 0
    """Seed of the procedural generator's entries and of their train/test split (independent of ``seed``, so runs
    with different seeds share one split)."""
    generator_instruction: str = "Reply with the final answer only."
    """Appended to every question of a procedural generator, on its own line."""
    eval_dataset: str = ""
    """Test prompts for a data set other than the built-in one, in the same formats ('test' split of a saved
    DatasetDict or a hub data set)."""
    reward_fn: str = ""
    """Optional reward as 'module:function' mapping (completion, answer) to [0, 1]; default: the task's own."""
    answer_check: Literal["math_verify", "last_number"] = "math_verify"
    """The GSM8K-format reward: math_verify (1 iff math-verify finds the completion's answer equal to the one after
    '####': '1,000' = '1000', '\\frac{1}{2}' = '0.5') or last_number (1 iff the completion's last number equals
    it). The built-in task keeps its own token-level reward."""
    reward_funcs: tuple[str, ...] = ()
    """Reward functions with TRL's signature, as 'module:function' (several allowed): f(prompts, completions,
    completion_ids, **columns) -> list[float | None], called once per batch with the data's columns (answer among
    them) and, for conversational data, TRL's message lists as prompts and completions; each is logged as
    ``rewards/<function>/mean|std``. The reward is their weighted sum (None counts as 0), any finite number; outside
    [0, 1] Theorem 1's terms use the reward range seen so far (``bound/reward_lo|hi``). Replaces the task's own
    reward; excludes ``reward_fn``."""
    reward_weights: tuple[float, ...] = ()
    """One weight per reward function (TRL's name); empty: 1 each."""
    soft_punish_cache: int = 0
    """L_cache of the built-in reward ``soft_overlong_punishment`` (DAPO's soft overlong punishment; TRL's
    ``get_soft_overlong_punishment`` argument): completions longer than max_completion_length - L_cache lose up to 1
    linearly. Needed (> 0) when that reward is listed in ``reward_funcs``."""
    chat_template: bool = False
    """Render every text prompt (training, held-out and test) as one user message with the tokenizer's chat
    template and its generation prompt, as an instruct model expects; the built-in tiny model has no template and
    takes the prompts as they are (the default). Conversational prompts always go through the template. A
    tokenizer without a template is refused at start-up."""
    output_dir: str = "runs/arithmetic"
    """Run directory: config.json, metrics.jsonl, checkpoints, samples. Re-using it resumes the run."""
    seed: int = 0
    """Seeds prompt order, sampling and initialisation."""
    trust_remote_code: bool = False
    """Let transformers and vLLM run the Python code a model directory or hub repository ships (its own
    architecture). Off: only architectures transformers and vLLM implement load."""
    use_peft: bool = False
    """Train LoRA adapters (``peft``, TRL's name for the switch) instead of every weight: the sampler, alpha and
    pi_ref get the merged weights W + (lora_alpha / r) B A, final_model/ holds the adapters. Needs the lora extra."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: float = 32.0
    """LoRA scale numerator: the update is (lora_alpha / lora_r) B A."""
    lora_target_modules: tuple[str, ...] = ("all-linear",)
    """Modules given adapters: 'all-linear' (every linear layer but the output layer) or module names
    (e.g. q_proj v_proj). LoRA dropout is always 0: pi/alpha needs the same log-probs from every pass."""

    # ---- Algorithm 1 -----------------------------------------------------------------------
    max_steps: int = 100
    """Number of training steps k."""
    prompts_per_step: int = 32
    """Prompts per step; each gets num_generations completions (TRL counts completions instead)."""
    num_generations: int = 8
    """G: completions sampled per prompt (a group)."""
    num_iterations: int = 1
    """i: optimiser steps on each batch (TRL's num_iterations; i > 1 is sample reuse)."""
    sync_period: int = 1
    """v: copy the trainer's weights into the sampler every v steps (alpha = pi_{k - lag}, lag < v; with
    --async-generation v <= lag < 2v after the first window)."""
    sync_policy: Literal["fixed", "divergence"] = "fixed"
    """fixed: sync every v = sync_period steps (Algorithm 1). divergence: sync at a step whose estimated
    TV(pi_k, alpha), measured on the held-out prompts before the step (the previous step's
    ``heldout/tv/pi_new_alpha``), exceeds ``tv_budget``, or whose lag would exceed ``max_lag``; it needs
    --heldout-prompts and generates step by step. With --async-generation the sampler runs one step ahead and a
    sync serves the next step, decided on the projected TV(pi_{k+1}, alpha): this one's plus the last step's drift
    ``heldout/tv/pi_new_pi_k`` (``grpo_theory.sync_policy``; ``sync/reason`` says why each sync happened,
    ``sync/tv_estimate`` what it was decided on)."""
    tv_budget: float = 0.05
    """divergence policy: the TV(pi_k, alpha) estimate above which the step syncs (Theorem 1's lag penalty is
    c times it)."""
    max_lag: int = 8
    """divergence policy: sync whenever the lag would exceed this many steps, whatever the estimate."""
    max_staleness: int = -1
    """Drop a step whose completions are older than this many steps (lag > max_staleness): no update, logged as
    ``dropped_stale`` (TRL AsyncGRPO's max_staleness; with asynchronous generation the lag is v .. 2v - 1). It
    changes alpha's distribution over the steps that update (docs/theory.md, §7.1). -1: keep every step."""
    ref_sync_steps: int = 0
    """Reset pi_ref <- pi_theta every this many steps (0: pi_ref stays the initial model; TRL's ref_model_sync_steps
    with sync_ref_model)."""
    ref_model_mixup_alpha: float = 1.0
    """At each pi_ref reset, pi_ref <- a pi_theta + (1 - a) pi_ref, weight by weight (TRL's name; TRL's default is 0.6,
    this project's 1: a copy)."""
    window_generation: bool = True
    """Generate the prompts of the whole sync window in one sampler call (alpha is frozen for v steps)."""
    async_generation: bool = False
    """Generate the next window while the trainer trains this one (a background thread; with --sampler server the
    server's own cores do the work): the window starting at step k is generated from the weights synced at k - v
    (the initial ones for the first two windows), so alpha lags v to 2v - 1 steps; ``lag``, the TV estimates
    and the bound's terms report that real staleness. Needs window generation; keeps one more copy of the
    weights (alpha's successor). Off: the sampler generates each window after its sync (lag < v)."""
    fsdp: bool = False
    """Under torchrun: shard the transformer blocks of the policy, alpha, alpha's successor and pi_ref over the
    ranks (PyTorch's FSDP2), with their gradients and Adam moments, instead of every rank holding every weight
    (data parallel, the default). For a policy that does not fit one device. The embeddings, the final norm and the
    output layer stay whole on every rank (the chunked log-probs apply the output layer outside the model's
    forward); rank 0 keeps one unsharded copy in CPU memory for the sampler's syncs, evaluation and the saved model.
    Not with --use-peft."""
    filter_groups: bool = False
    """Dynamic sampling (DAPO; verl's algorithm.filter_groups): keep only groups whose rewards vary and generate more
    rounds of prompts_per_step prompts from alpha until prompts_per_step such groups are gathered (or
    max_num_gen_batches rounds ran). The update then sees prompts chosen by their rewards (docs/theory.md, §6.2);
    ``sampling/gen_rounds`` and ``sampling/kept_group_share`` log what it took. Not with --async-generation."""
    max_num_gen_batches: int = 10
    """Dynamic sampling's bound on generation rounds per step, the first included (verl's name; 0: no bound). A step
    that ends short trains on the groups it has."""
    heldout_prompts: int = 0
    """Extra prompts per step, drawn independently of the training prompts (from the same pool, so some may also be
    trained on in that step), whose G completions from alpha never enter the loss. The TV distances, the bound's
    terms and the improvement are also estimated on them (``heldout/*``), free of the in-sample bias of estimates on
    the prompts and completions pi_{k+1} was fitted to: the TV and improvement estimates are unbiased, the
    surrogate and the bound carry a stated bias of their 1/s~ (docs/theory.md, §8.2 and §8.5). 0: off."""
    improvement_lcb_level: float = 0.95
    """Confidence level of ``heldout/improvement_lcb``, the one-sided lower confidence bound on the step's improvement
    J(pi_{k+1}) - J(pi_k) from the held-out prompts' estimates: a positive value certifies the step improved J at this
    level, without Theorem 1. nan (abstains) below 16 held-out prompts (docs/theory.md, §8.6)."""
    improvement_lcb_method: LcbMethod = DEFAULT_LCB_METHOD
    """The certificate's bound (docs/theory.md, §8.6): cantelli, mean - sqrt(level/(1 - level)) x its standard error,
    which kept its level on every per-prompt distribution measured, skewed ones included; t, mean - t_{P-1}(level) x
    its standard error, far more powerful but above its level on left-skewed estimates (9-18% at level 0.95)."""

    # ---- objective -------------------------------------------------------------------------
    epsilon: float = 0.2
    """Clip width of f_eps: pi/alpha may move at most epsilon away from pi_k/alpha."""
    epsilon_high: float = -1.0
    """Upper clip width (TRL's name, DAPO's clip-higher): the window is [r' - epsilon, r' + epsilon_high] with the
    paper's clip, [1 - epsilon, 1 + epsilon_high] for pi/pi_k with a TRL importance-sampling mode. -1: epsilon."""
    delta: float = 0.0
    """Two-sided clip (TRL's name): for negative advantages the unclipped ratio is capped too, pi/pi_k <= delta
    (paper clip: pi/alpha <= r' + delta - 1). 0: off; else must exceed 1 + epsilon_high."""
    importance_sampling_mode: ImportanceSamplingMode = "paper"
    """How the loss corrects for alpha != pi_k (docs/theory.md, §6.1). paper: the clipped objective
    f_eps(pi/alpha, pi_k/alpha, A), whose clip window sits around pi_k/alpha; the weight is exact. The TRL modes
    (vllm_importance_sampling_mode): PPO's clip of pi/pi_k in [1 - epsilon, 1 + epsilon_high] times the weight
    w = pi_k/alpha per token (token_*) or per completion (sequence_*: exp of the summed log-weights), truncated at
    importance_sampling_cap (*_truncate: min(w, cap)) or zeroed above it (*_mask). m2po: M2PO as published (arXiv
    2510.01161; AReaL's mask): the unclipped ratio pi/alpha on the tokens left after removing those with the largest
    (log pi_k/alpha)^2 until the plain mean over the rest is below m2_threshold (§6.1)."""
    m2_threshold: float = 0.04
    """M2PO's threshold on the plain mean (log pi_k/alpha)^2 over the step's completion tokens it keeps
    (importance_sampling_mode m2po; AReaL's name, the paper's default)."""
    importance_sampling_cap: float = 3.0
    """The cap C of the TRL importance-sampling modes (TRL's vllm_importance_sampling_clip_max, formerly
    vllm_importance_sampling_cap)."""
    importance_sampling_cap_min: float = 0.0
    """The lower cap c of the TRL modes (TRL's vllm_importance_sampling_clip_min): *_truncate clamps the weight to
    [c, C], *_mask zeroes it outside [c, C] (token_mask with [0.5, 5] is IcePop's two-sided mask). 0: none."""
    beta: float = 0.04
    """KL(pi || pi_ref) weight (k3 estimator, per token). 0 skips the reference model (and the kl metrics)."""
    use_bias_correction_kl: bool = True
    """Multiply the per-token k3 by pi/alpha (TRL's name): the tokens are sampled from alpha, and only with the
    correction is each token's term an estimate of KL(pi || pi_ref) at its position (per-token, along alpha's
    prefixes; docs/theory.md, §8.4)."""
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = "dapo"
    """Normaliser: grpo = mean over each sequence's tokens then over sequences; dapo = over all
    tokens of the step; dr_grpo = over (sequences x max_completion_length); bnpo = over each micro-batch's own
    tokens (TRL's local normaliser: the step's gradient then depends on per_device_train_batch_size; dapo for a step
    in one pass)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """group: A = (r - mean)/sqrt(var + variance_eps) per group (the paper's whitening); batch: (r - group mean) over
    the standard deviation of the step's rewards (TRL's batch); none: r - mean."""
    mask_truncated_completions: bool = False
    """Completions that reach max_completion_length without EOS leave the loss (TRL's name, DAPO's truncation
    masking); their rewards still count in the group statistics. The loss then averages over the completions alpha
    finishes (docs/theory.md, §6.2)."""
    top_entropy_quantile: float = 1.0
    """Keep in the policy term only the tokens whose entropy is in this top share of each micro-batch's completion
    tokens (TRL's name and pool: zero-variance groups included; 1: all)."""
    entropy_coef: float = 0.0
    """Subtract this times the mean next-token entropy of the completion tokens from the loss (an entropy bonus,
    TRL's name, verl's entropy_coeff; with top_entropy_quantile < 1, of the tokens its mask keeps, as TRL). The
    entropy is that of the (filtered) policy the trainer optimises."""
    variance_eps: float = 1e-4
    """eps of sigma_{alpha,eps} = sqrt(var + eps) in the advantage and the bound (Theorem 1 needs <= 3/4)."""
    mask_zero_std_groups: bool = True
    """Drop groups whose rewards are all equal (sigma_alpha = 0) from the loss and its normaliser."""
    ratio_level: Literal["token", "sequence", "sequence_normalised"] = "token"
    """Importance ratios per token (default) or per sequence: sequence = exp of the summed log-ratios (the
    paper's sequence-level ratio; high variance), sequence_normalised = exp of their mean over the completion's
    tokens (GSPO; TRL's importance_sampling_level="sequence"; a geometric mean, not an importance weight: biased).
    Both need loss_type grpo, under which every sequence counts once (the paper's E_alpha f)."""
    behaviour_logprobs: Literal["sampler", "recompute"] = "sampler"
    """log alpha from the sampler (cheap) or recomputed by the trainer with the lagged weights (exact).
    The gap between the two is logged as sampling/logp_diff_* whenever both are computed."""

    # ---- optimisation and sampling ---------------------------------------------------------
    learning_rate: float = 3e-4
    """AdamW learning rate (the default suits the tiny built-in model; use ~1e-6 for 0.5B+ models); the peak of the
    schedule."""
    lr_scheduler_type: Literal["constant", "linear", "cosine", "constant_with_warmup"] = "constant"
    """The learning-rate schedule over the run's max_steps x num_iterations optimiser steps (transformers' schedules,
    TRL's name; TRL's default is linear, this project's constant). Logged per step as ``learning_rate``."""
    warmup_ratio: float = 0.0
    """Share of the optimiser steps over which the rate warms up linearly from 0 (linear, cosine and
    constant_with_warmup; transformers' name)."""
    warmup_steps: int = 0
    """Warm-up length in optimiser steps; overrides warmup_ratio when > 0 (transformers' name)."""
    adam_beta1: float = 0.9
    """AdamW's beta1 (transformers' name)."""
    adam_beta2: float = 0.999
    """AdamW's beta2 (transformers' name)."""
    adam_epsilon: float = 1e-8
    """AdamW's epsilon (transformers' name)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip (0 disables)."""
    max_consecutive_skipped_updates: int = 3
    """An inner step whose loss or gradient is not finite takes no optimiser step (counted in ``skipped_updates``);
    the run stops with an error after this many steps in a row had such a skip."""
    max_completion_length: int = 6
    """Largest number of generated tokens per completion."""
    temperature: float = 1.0
    """Sampling temperature; log-probabilities on both sides are of softmax(logits / temperature)."""
    top_k: int = 0
    """Sample from the top_k most likely tokens only (TRL's name; 0: off). The policies are then the filtered,
    renormalised distributions on both sides, sampler and trainer, so pi_k/alpha stays exact (docs/theory.md,
    §1.1)."""
    top_p: float = 1.0
    """Nucleus sampling (TRL's name): the smallest set of most likely tokens with probability >= top_p, renormalised
    (1: off). The trainer's pi_theta is that filtered distribution of its own logits (docs/theory.md, §1.1)."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the most likely one's (TRL's name; 0: off). Applied
    before top_k and top_p, in vLLM's order."""
    per_device_train_batch_size: int = 0
    """Completions per forward and backward pass (a micro-batch; TRL's name). The P x G completions of a step
    run in ceil(P x G / this) micro-batches whose gradients add up to one optimiser step (TRL's
    gradient_accumulation_steps is that count: ``gradient_accumulation_steps`` below); the loss's normalisers,
    the zero-variance mask and the logged statistics are the whole step's, so the gradient does not depend on
    the split. Every other pass of the step (alpha, pi_ref, diagnostics) runs in micro-batches of the same size, and the
    transformers sampler generates that many sequences at a time (each from its own random stream: the samples do
    not depend on the split).
    0: the whole step in one pass (fastest on the built-in model; use 4-16 on real models)."""
    group_by_length: bool = True
    """Run the passes of a step (each at most ``per_device_train_batch_size`` completions) over sequences of similar
    length, each pass padded only to its own longest sequence, so padding positions stay out of the matmuls
    (transformers' name; the passes are chosen to minimise padded positions plus a fixed cost per pass). The
    gradient and every logged number are the same as without it, up to float rounding. Off: consecutive
    completions per pass, padded to the step's longest."""
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = "auto"
    """The trainer's attention kernel (transformers' name; the sampler's is the engine's own). auto: transformers'
    choice (sdpa where the family has it). eager keeps a (length x length) score matrix per head, so prefer sdpa for
    long sequences; on a CPU eager can be the faster in bfloat16 (docs/benchmarks.md). flash_attention_2 needs a
    CUDA device and the flash-attn package."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (transformers'
    gradient checkpointing): activation memory of a micro-batch drops from about one layer's worth per layer
    to one hidden state per layer, for about one more forward pass of compute."""
    compile: bool = False
    """Compile each decoder block with torch.compile (inductor, dynamic shapes), fusing its norms, rotary
    embeddings, activations and autocast's casts around the matmuls: the same log-probs and gradients up to float
    rounding. The first passes compile (each block once per kind of pass), which takes minutes, so it pays in long
    runs (docs/benchmarks.md has the measured speed-ups); the output layer, outside the blocks, is not compiled.
    Untested on a GPU; not with --fsdp."""
    share_prompts: bool = True
    """Run each distinct prompt of a pass through the decoder once and its G completions on its cached keys and values
    (gradients flow back into the prompt's pass), instead of every completion with its own copy of the prompt: the
    same log-probs and gradients up to float rounding for about P x prompt + P x G x completion positions instead of
    P x G x (prompt + completion). Used where it spares a quarter of the positions or more; not with --fsdp or
    --gradient-checkpointing (which drop the cache)."""
    logit_chunk_tokens: int = 0
    """Completion tokens whose full-vocabulary logits exist at once (the output layer runs chunk by chunk; in
    the backward pass a chunk's logits are recomputed). 0: 256 MB of float32 logits per chunk (441 tokens for
    a 151,936-token vocabulary)."""

    # ---- machinery -------------------------------------------------------------------------
    sampler: Literal["auto", "vllm", "server", "transformers"] = "auto"
    """'vllm' (in-process engine), 'server' (vLLM's own server in another process, at server_url; start it with
    ``python -m llm.serve MODEL``), 'transformers' (generate on a copy of the weights), 'auto': vllm if importable."""
    vllm_gpu_memory_utilization: float = 0.3
    """Share of the GPU's memory the in-process engine may take (TRL's name and default; CUDA only: on a CPU the KV
    cache is sized from the window, or by vllm_kv_cache_gb)."""
    vllm_tensor_parallel_size: int = 1
    """GPUs the in-process engine shards the model over (TRL's name; CUDA only: a CPU engine refuses > 1)."""
    vllm_enable_sleep_mode: bool = False
    """The in-process engine frees its GPU memory (weights offloaded, cache dropped) after each generation call and
    takes it back before the next call or sync (TRL's name; CUDA only, refused on a CPU; untested: no GPU here)."""
    vllm_kv_cache_gb: float = 0.0
    """On a CPU, the in-process engine's KV cache in GiB (0: sized to a window's completions, llm.sampling.
    vllm_settings)."""
    server_url: str = ""
    """URL of the inference server for sampler 'server' (e.g. http://127.0.0.1:8000)."""
    server_timeout: float = 120.0
    """Seconds any request to the server may take (a generation call, one step of a weight sync)."""
    server_sync_address: str = "127.0.0.1"
    """Address of this trainer as the server reaches it, for the weight-transfer rendezvous (the trainer listens
    on a free port there)."""
    device: str = "auto"
    """'auto' (cuda if available), 'cpu' or 'cuda[:n]' for the trainer."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """bfloat16: the vLLM sampler runs in bf16 and the trainer's forward passes under bf16 autocast
    (weights and optimiser stay float32); log-probabilities and losses are always float32."""
    verify_sync: bool = True
    """Right after every sync, recompute log alpha with the trainer and compare with the sampler's
    (sampling/logp_diff_*; a loud warning if they disagree). One forward pass per v steps."""
    tv_diagnostics: bool = False
    """Log Monte-Carlo estimates of the chain-rule upper bound on TV from full next-token distributions
    (``*_chain_ub_est``): a forward pass of alpha's weights at every step with lag > 0. Off by default (the
    unbiased sequence-level ``tv/*`` estimates need no extra pass)."""
    insample_diagnostics: bool = False
    """Log the in-sample estimates of the terms involving pi_{k+1} (``insample/*``): one more forward pass of the
    updated policy over the training batch per step. They are biased upwards (pi_{k+1} was fitted to these samples;
    docs/theory.md, §8), hence off by default; ``--heldout-prompts`` gives estimates free of that bias (the TV and improvement ones
    unbiased; docs/theory.md, §8.2). The pi_k quantities
    (TV(pi_k, alpha), the lag penalty, the sync check) need no extra pass and are always logged."""
    insample_diagnostics_steps: int = 1
    """With ``insample_diagnostics``: compute them at every this many steps only (steps k with k % N == 0), so
    their forward pass costs 1/N of a pass per step. Each computed row is the same estimate as at N = 1; what is
    lost is rows: a mean of ``insample/*`` over a run then rests on 1/N as many steps (N times the variance of
    that mean from step-to-step noise)."""
    exact_j: bool = True
    """When the task allows it (the built-in task), log the exact J(pi_k), J(pi_{k+1}) over the training
    prompts and the exact improvement (one forward pass over the accepted completions per step)."""
    eval_steps: int = 0
    """Evaluate the policy on the test prompts every this many steps, before the first and after the last (0: never):
    exact J (built-in task), sampled accuracy, pass@k and maj@k, and greedy accuracy (``eval/*``)."""
    num_generations_eval: int = 8
    """Completions per test prompt for the sampled accuracy and ``eval/pass@k``, ``eval/maj@k`` (k = 1, 2, 4, ... up
    to it; TRL's name)."""
    eval_temperature: float = -1.0
    """Sampling temperature of the evaluation (-1: the training temperature)."""
    eval_top_p: float = -1.0
    """top_p of the evaluation (-1: the training top_p)."""
    eval_top_k: int = -1
    """top_k of the evaluation (-1: the training top_k; 0: off)."""
    eval_min_p: float = -1.0
    """min_p of the evaluation (-1: the training min_p)."""
    logging_steps: int = 1
    """Print a progress line every this many steps where no progress bar is shown (``--no-progress``, or output to a
    file or a CI log); metrics.jsonl always gets every step."""
    log_completions: bool = False
    """Every logging_steps steps, show the step's prompts, completions, rewards and advantages: a table on the console,
    rows in <output_dir>/completions.jsonl and a table in the trackers (TensorBoard text, W&B table; TRL's name)."""
    num_completions_to_print: int = 0
    """Completions of a step that log_completions shows (TRL's name; 0: all)."""
    save_steps: int = 50
    """Checkpoint every this many steps (and at the end, and on Ctrl-C). 0: only at the end."""
    num_threads: int = 0
    """torch CPU threads (0: torch's default)."""
    keep_freed_memory: bool = True
    """Keep freed host memory in the process for the next pass (glibc's malloc with no ``mmap`` per large block and
    no trim at ``free``; ``runkit.host_memory``) instead of handing every large block back to the system when it is
    freed, which makes each step fault its large tensors in anew (its speed-up: docs/models.md). Off: the resident
    set follows the live tensors more closely, at that cost. It applies to the whole process from the run's start; the
    run's freed memory goes back to the system when it ends."""
    freed_memory_ceiling: float = 1.0
    """With ``keep_freed_memory`` and micro-batches (``per_device_train_batch_size`` > 0: memory is what they are
    for): hand the freed memory back to the system after every pass of more than one micro-batch, and within a pass
    once the resident set has grown since its start by more than this many times the largest growth of one
    micro-batch, so that the heap's fragmentation does not grow with the batch (``runkit.host_memory.
    FreedMemoryCeiling``). Without micro-batches freed memory is kept until the run ends: a release there costs
    the next pass its page faults (docs/memory.md). 0: no ceiling."""
    report_to: tuple[Literal["none", "tensorboard", "wandb", "trackio"], ...] = ("none",)
    """Experiment trackers that get every metrics.jsonl row under the same names, step for step (TRL's name;
    several allowed: ``--report-to tensorboard wandb``). Each needs its package (an optional install); TensorBoard
    writes to <output_dir>/tensorboard. ``llm.trackers`` has the details."""
    progress: bool = True
    """Show a tqdm progress bar when stderr is a terminal (a file or a CI log gets a line every ``logging_steps``
    instead of the bar's redraws). Off: lines everywhere."""

    def __post_init__(self):
        require_finite(self)
        require(self, self.max_steps >= 1, "max_steps", "must be >= 1")
        require(self, self.seed >= 0, "seed", "must be >= 0 (numpy's generators take non-negative seeds)")
        require(self, self.lora_r >= 1, "lora_r", "must be >= 1")
        require(self, self.freed_memory_ceiling >= 0, "freed_memory_ceiling", "must be >= 0 (0: no ceiling)")
        require(self, self.window_generation or not self.async_generation, "async_generation",
                "generates whole windows ahead: it needs --window-generation")
        require(self, not (self.fsdp and self.use_peft), "fsdp",
                "shards whole weights; LoRA's adapters are small enough for data parallel: drop one of --fsdp and "
                "--use-peft")
        require(self, not (self.fsdp and self.compile), "compile",
                "is not tested with --fsdp's sharded blocks: drop one of --fsdp and --compile")
        require(self, self.lora_alpha > 0, "lora_alpha", "must be > 0")
        require(self, len(self.lora_target_modules) >= 1 and all(self.lora_target_modules), "lora_target_modules",
                "needs 'all-linear' or module names")
        require(self, self.prompts_per_step >= 1, "prompts_per_step", "must be >= 1")
        require(self, self.num_generations >= 2, "num_generations", "a group needs G >= 2 completions")
        require(self, self.num_iterations >= 1, "num_iterations", "must be >= 1")
        require(self, self.heldout_prompts >= 0, "heldout_prompts", "must be >= 0")
        require(self, 0.5 <= self.improvement_lcb_level < 1, "improvement_lcb_level", "must be in [0.5, 1)")
        require(self, self.eval_steps >= 0, "eval_steps", "must be >= 0")
        require(self, self.generator_train_size >= 1, "generator_train_size", "must be >= 1")
        require(self, self.generator_test_size >= 0, "generator_test_size", "must be >= 0")
        require(self, self.generator_seed >= 0, "generator_seed", "must be >= 0")
        require(self, not self.generator_kwargs or self.dataset.startswith("reasoning_gym:"), "generator_kwargs",
                "apply to --dataset reasoning_gym:<name> only")
        require(self, self.insample_diagnostics_steps >= 1, "insample_diagnostics_steps", "must be >= 1")
        require(self, not (self.reward_fn and self.reward_funcs), "reward_funcs",
                "give either --reward-fn (one completion at a time) or --reward-funcs, not both")
        require(self, not self.reward_weights or len(self.reward_weights) == len(self.reward_funcs), "reward_weights",
                f"needs one weight per reward function ({len(self.reward_funcs)})")
        require(self, all(math.isfinite(w) for w in self.reward_weights), "reward_weights", "must be finite numbers")
        require(self, 0 <= self.soft_punish_cache <= self.max_completion_length, "soft_punish_cache",
                f"must lie in [0, max_completion_length = {self.max_completion_length}]")
        require(self, self.soft_punish_cache > 0 or "soft_overlong_punishment" not in self.reward_funcs,
                "soft_punish_cache", "soft_overlong_punishment needs it > 0 (the length over which the penalty grows)")
        require(self, self.num_generations_eval >= 1, "num_generations_eval", "must be >= 1")
        require(self, self.eval_temperature == -1 or MIN_TEMPERATURE <= self.eval_temperature <= MAX_TEMPERATURE,
                "eval_temperature", f"must lie in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], or be -1 (training's)")
        require(self, self.eval_top_p == -1 or 0 < self.eval_top_p <= 1, "eval_top_p",
                "must lie in (0, 1], or be -1 (training's)")
        require(self, self.eval_top_k >= -1, "eval_top_k", "must be >= 0, or -1 (training's)")
        require(self, self.eval_min_p == -1 or 0 <= self.eval_min_p < 1, "eval_min_p",
                "must lie in [0, 1), or be -1 (training's)")
        self._check_objective_and_machinery()

    def _check_objective_and_machinery(self):
        require(self, 0 < self.top_entropy_quantile <= 1, "top_entropy_quantile", "must lie in (0, 1] (1: every token)")
        require(self, self.ratio_level == "token" or self.loss_type == "grpo", "ratio_level",
                "sequence-level ratios need loss_type grpo (dapo and dr_grpo would weight each sequence's one "
                "objective value by its length)")
        require(self, self.sync_period >= 1, "sync_period", "v must be >= 1")
        require(self, self.tv_budget >= 0, "tv_budget", "must be >= 0 (a TV distance lies in [0, 1])")
        require(self, self.max_lag >= 0, "max_lag", "must be >= 0")
        require(self, self.max_staleness >= -1, "max_staleness", "must be >= 0, or -1 to keep every step")
        require(self, self.max_num_gen_batches >= 0, "max_num_gen_batches", "must be >= 0 (0: no bound)")
        require(self, not (self.filter_groups and self.async_generation), "filter_groups",
                "draws more rounds from alpha during the step, while asynchronous generation's sampler already holds "
                "the next window's weights; drop one of --filter-groups and --async-generation")
        if self.sync_policy == "divergence":
            require(self, self.heldout_prompts > 0, "sync_policy",
                    "divergence decides from the held-out TV estimate; add --heldout-prompts (e.g. 8)")
            require(self, not (self.async_generation and self.max_lag < 1), "max_lag",
                    "must be >= 1 with --async-generation (the sampler runs a step ahead: every step's completions "
                    "are at least one step old)")
        require(self, self.epsilon_high == -1.0 or 0 <= self.epsilon_high < 10, "epsilon_high",
                "must lie in [0, 10), or -1 for epsilon")
        require(self, self.delta == 0 or self.delta > 1 + self.clip_high, "delta",
                f"must exceed 1 + epsilon_high = {1 + self.clip_high} (or be 0: off)")
        require_correction_settings(self)
        require(self, not correction(self.importance_sampling_mode).step_mask or self.ratio_level == "token",
                "importance_sampling_mode",
                "m2po masks tokens: it needs ratio_level token")
        require(self, self.ref_sync_steps >= 0, "ref_sync_steps", "must be >= 0")
        require(self, 0 < self.ref_model_mixup_alpha <= 1, "ref_model_mixup_alpha", "must lie in (0, 1]")
        require(self, 0 <= self.epsilon < 10, "epsilon", "the clip width must lie in [0, 10)")
        require(self, self.beta >= 0, "beta", "must be >= 0")
        require(self, 0 <= self.variance_eps <= EPS_MAX, "variance_eps", "must lie in [0, 3/4] (Theorem 1)")
        require(self, self.learning_rate > 0, "learning_rate", "must be > 0")
        require(self, 0 <= self.warmup_ratio <= 1, "warmup_ratio", "must lie in [0, 1]")
        require(self, self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        require(self, 0 <= self.adam_beta1 < 1, "adam_beta1", "must lie in [0, 1)")
        require(self, 0 <= self.adam_beta2 < 1, "adam_beta2", "must lie in [0, 1)")
        require(self, self.adam_epsilon > 0, "adam_epsilon", "must be > 0")
        require(self, self.weight_decay >= 0, "weight_decay", "must be >= 0")
        require(self, self.max_grad_norm >= 0, "max_grad_norm", "must be >= 0")
        require(self, self.max_consecutive_skipped_updates >= 1, "max_consecutive_skipped_updates", "must be >= 1")
        require(self, self.max_completion_length >= 1, "max_completion_length", "must be >= 1")
        require(self, self.top_k >= 0, "top_k", "must be >= 0 (0: off)")
        require(self, 0 < self.top_p <= 1, "top_p", "must lie in (0, 1] (1: off)")
        require(self, 0 <= self.min_p < 1, "min_p", "must lie in [0, 1) (0: off)")
        require(self, MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE, "temperature",
                f"must lie in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}] (logits / temperature must stay finite in float32)")
        require(self, self.per_device_train_batch_size >= 0, "per_device_train_batch_size",
                "must be >= 0 (0: the whole step in one pass)")
        require(self, self.logit_chunk_tokens >= 0, "logit_chunk_tokens", "must be >= 0 (0: automatic)")
        require(self, self.logging_steps >= 1, "logging_steps", "must be >= 1")
        require(self, self.num_completions_to_print >= 0, "num_completions_to_print", "must be >= 0 (0: all)")
        require(self, self.save_steps >= 0, "save_steps", "must be >= 0")
        require(self, 0 <= self.num_threads <= (os.cpu_count() or 1), "num_threads",
                f"must lie in [0, {os.cpu_count()}] (this machine's cores; 0: torch's default)")
        require(self, bool(self.output_dir), "output_dir", "must not be empty")
        require(self, len(self.report_to) >= 1 and ("none" not in self.report_to or len(self.report_to) == 1),
                "report_to", "give 'none' alone, or one or more of tensorboard, wandb, trackio")
        require(self, self.sampler != "server" or self.server_url.startswith(("http://", "https://")), "server_url",
                "sampler 'server' needs the server's URL, e.g. --server-url http://127.0.0.1:8000 "
                "(start one with python -m llm.serve)")
        require(self, not self.server_url or self.sampler == "server", "server_url",
                f"given, but the sampler is {self.sampler!r}; add --sampler server")
        require(self, self.server_timeout > 0, "server_timeout", "must be > 0")
        require(self, 0 < self.vllm_gpu_memory_utilization <= 1, "vllm_gpu_memory_utilization", "must lie in (0, 1]")
        require(self, self.vllm_tensor_parallel_size >= 1, "vllm_tensor_parallel_size", "must be >= 1")
        require(self, self.vllm_kv_cache_gb >= 0, "vllm_kv_cache_gb", "must be >= 0 (0: sized to the window)")
        require(self, self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
                "device", "expected auto, cpu or cuda[:n]")

    # ---- derived values ----------------------------------------------------------------------
    @property
    def clip_high(self) -> float:
        """The upper clip width: ``epsilon_high``, or ``epsilon`` when it is -1."""
        return self.epsilon if self.epsilon_high == -1.0 else self.epsilon_high

    @property
    def token_filter(self) -> TokenFilter:
        """top_k, top_p and min_p as one filter (``grpo_theory.truncation``)."""
        return TokenFilter(self.top_k, self.top_p, self.min_p)

    @property
    def generates_windows(self) -> bool:
        """One sampler call per sync window (``window_generation``), unless the divergence policy decides the
        windows step by step."""
        return self.window_generation and self.sync_policy == "fixed"

    @property
    def steps_per_call(self) -> int:
        """Steps whose completions one sampler call generates: v with window generation, else 1."""
        return self.sync_period if self.generates_windows else 1

    @property
    def prompts_shared(self) -> bool:
        """Whether passes share prompts (``share_prompts``, unless FSDP or gradient checkpointing rules it out)."""
        return self.share_prompts and not self.fsdp and not self.gradient_checkpointing

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    @property
    def micro_batch_size(self) -> int:
        """Completions per pass: ``per_device_train_batch_size``, or the whole step when it is 0."""
        return self.per_device_train_batch_size or self.completions_per_step

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimiser step (TRL's name): ceil(P x G / per_device_train_batch_size). With
        ``group_by_length`` a step may run more, shorter passes (never longer ones)."""
        return -(-self.completions_per_step // self.micro_batch_size)

    @property
    def num_syncs(self) -> int:
        """Weight copies into the sampler over the run with the fixed policy (one at every step k with k % v == 0;
        the divergence policy's count is known only at the end)."""
        return -(-self.max_steps // self.sync_period)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json_file(cls, path: str | Path) -> "GRPOConfig":
        return cls(**json.loads(Path(path).read_text()))

    def replace(self, **changes) -> "GRPOConfig":
        return dataclasses.replace(self, **changes)


# ---- TRL's names ---------------------------------------------------------------------------------

#: TRL 1.16 names (and verl's where TRL has none) accepted for this config's fields, on the command line
#: (``translate_trl_args``) and in ``GRPOConfig.from_trl``: name -> (field, {their value: ours} or None).
TRL_NAMES: dict[str, tuple[str, dict | None]] = {
    "vllm_importance_sampling_mode": ("importance_sampling_mode", None),
    "vllm_importance_sampling_clip_max": ("importance_sampling_cap", None),
    "vllm_importance_sampling_cap": ("importance_sampling_cap", None),  # TRL's name before 1.16
    "vllm_importance_sampling_clip_min": ("importance_sampling_cap_min", None),
    "importance_sampling_level": ("ratio_level", {"token": "token", "sequence": "sequence_normalised"}),
    "ref_model_sync_steps": ("ref_sync_steps", None),
    "vllm_server_base_url": ("server_url", None),
    "vllm_server_timeout": ("server_timeout", None),
    "vllm_mode": ("sampler", {"colocate": "vllm", "server": "server"}),
    "entropy_coeff": ("entropy_coef", None),  # verl's
}
#: TRL's switches: name -> (field, value when on, value when off).
TRL_SWITCHES: dict[str, tuple[str, str, str | None]] = {
    "bf16": ("dtype", "bfloat16", "float32"),
    "use_vllm": ("sampler", "vllm", "transformers"),
    "sync_ref_model": ("ref_sync_steps", "", "0"),  # on: ref_model_sync_steps (TRL's default 512)
}
#: TRL's default ref_model_sync_steps, used when sync_ref_model is on without it.
TRL_REF_MODEL_SYNC_STEPS = 512


def _trl_values(given: dict) -> dict:
    """TRL's names and values (``given``: name -> value, strings or Python values) as this config's fields."""
    out, sync_ref = {}, given.pop("sync_ref_model", None)
    steps = given.get("ref_model_sync_steps")
    if steps is not None and not sync_ref:
        raise ValueError("ref_model_sync_steps: TRL applies it only with sync_ref_model; add --sync-ref-model (or "
                         "use --ref-sync-steps)")
    if sync_ref and steps is None:
        given["ref_model_sync_steps"] = TRL_REF_MODEL_SYNC_STEPS
    if sync_ref is not None and not sync_ref:
        out["ref_sync_steps"] = 0
    vllm_mode = given.get("vllm_mode")
    for name, value in given.items():
        if name in TRL_SWITCHES:
            field, on, off = TRL_SWITCHES[name]
            if name == "use_vllm" and value and vllm_mode is not None:
                continue  # vllm_mode says which
            out[field] = on if value else off
            continue
        field, values = TRL_NAMES[name]
        if values is not None:
            if value not in values:
                raise ValueError(f"{name}: expected one of {', '.join(values)}, got {value!r}")
            value = values[value]
        out[field] = value
    return out


def translate_trl_args(argv: list[str]) -> list[str]:
    """A command line with TRL's option names (``--vllm-importance-sampling-mode token_mask``, ``--bf16``...) as this
    project's (``--importance-sampling-mode token_mask``, ``--dtype bfloat16``); other arguments unchanged."""
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    names = {flag(n): n for n in TRL_NAMES}
    switches = {flag(n): (n, True) for n in TRL_SWITCHES} | {flag(f"no_{n}"): (n, False) for n in TRL_SWITCHES}
    given, rest, i = {}, [], 0
    while i < len(argv):
        arg = argv[i]
        key, eq, inline = arg.partition("=")
        if key in names:
            if eq:
                given[names[key]] = inline
            elif i + 1 < len(argv):
                given[names[key]] = argv[i + 1]
                i += 1
            else:
                raise ValueError(f"{names[key]}: missing value")
            if names[key] == "ref_model_sync_steps":
                given[names[key]] = int(given[names[key]])
        elif arg in switches:
            name, on = switches[arg]
            given[name] = on
        else:
            rest.append(arg)
        i += 1
    out = []
    for field, value in _trl_values(given).items():
        out += [flag(field), str(value)]
    return rest + out


def from_trl(**kwargs) -> GRPOConfig:
    """A ``GRPOConfig`` from keyword arguments that may use TRL's names (``TRL_NAMES``, ``TRL_SWITCHES``) beside
    this project's: ``from_trl(vllm_importance_sampling_mode="token_mask", bf16=True, max_steps=50)``."""
    trl = {k: kwargs.pop(k) for k in list(kwargs) if k in TRL_NAMES or k in TRL_SWITCHES}
    translated = _trl_values(trl)
    both = sorted(set(translated) & set(kwargs))
    if both:
        raise ValueError(f"{both[0]}: given both under its own name and under TRL's; give one")
    return GRPOConfig(**kwargs, **translated)
