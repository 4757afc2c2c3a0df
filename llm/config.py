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
    --heldout-prompts, generates step by step and is not asynchronous (``grpo_theory.sync_policy``; the logged
    ``sync/reason`` says why each sync happened)."""
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
    """Reset pi_ref <- pi_theta every this many steps (0: pi_ref stays the initial model)."""
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
    heldout_prompts: int = 0
    """Extra prompts per step, drawn independently of the training prompts, whose G completions from alpha
    never enter the loss. The TV distances, the bound's terms and the improvement are also estimated on
    them (``heldout/*``), free of the in-sample bias of estimates on the prompts and completions pi_{k+1}
    was fitted to (docs/theory.md, §8.2). 0: off."""

    # ---- objective -------------------------------------------------------------------------
    epsilon: float = 0.2
    """Clip width of f_eps: pi/alpha may move at most epsilon away from pi_k/alpha."""
    epsilon_high: float = -1.0
    """Upper clip width (TRL's name, DAPO's clip-higher): the window is [r' - epsilon, r' + epsilon_high] with the
    paper's clip, [1 - epsilon, 1 + epsilon_high] for pi/pi_k with a TRL importance-sampling mode. -1: epsilon."""
    delta: float = 0.0
    """Two-sided clip (TRL's name): for negative advantages the unclipped ratio is capped too, pi/pi_k <= delta
    (paper clip: pi/alpha <= r' + delta - 1). 0: off; else must exceed 1 + epsilon_high."""
    importance_sampling_mode: Literal["paper", "token_truncate", "token_mask", "sequence_truncate",
                                      "sequence_mask"] = "paper"
    """How the loss corrects for alpha != pi_k (docs/theory.md, §6.1). paper: the clipped objective
    f_eps(pi/alpha, pi_k/alpha, A), whose clip window sits around pi_k/alpha; the weight is exact. The TRL modes
    (vllm_importance_sampling_mode): PPO's clip of pi/pi_k in [1 - epsilon, 1 + epsilon_high] times the weight
    w = pi_k/alpha per token (token_*) or per completion (sequence_*: exp of the summed log-weights), truncated at
    importance_sampling_cap (*_truncate: min(w, cap)) or zeroed above it (*_mask)."""
    importance_sampling_cap: float = 3.0
    """The cap C of the TRL importance-sampling modes (TRL's vllm_importance_sampling_cap)."""
    beta: float = 0.04
    """KL(pi || pi_ref) weight (k3 estimator, per token). 0 skips the reference model (and the kl metrics)."""
    use_bias_correction_kl: bool = True
    """Multiply the per-token k3 by pi/alpha (TRL's name): the tokens are sampled from alpha, and only with the
    correction is each token's term an estimate of KL(pi || pi_ref) at its position (per-token, along alpha's
    prefixes; docs/theory.md, §8.4)."""
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = "dapo"
    """Normaliser: grpo = mean over each sequence's tokens then over sequences; dapo = over all
    tokens of the batch; dr_grpo = over (sequences x max_completion_length)."""
    scale_rewards: Literal["group", "none"] = "group"
    """group: A = (r - mean)/sqrt(var + variance_eps) per group (the paper's whitening); none: r - mean."""
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
    """AdamW learning rate (the default suits the tiny built-in model; use ~1e-6 for 0.5B+ models)."""
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
    per_device_train_batch_size: int = 0
    """Completions per forward and backward pass (a micro-batch; TRL's name). The P x G completions of a step
    run in ceil(P x G / this) micro-batches whose gradients add up to one optimiser step (TRL's
    gradient_accumulation_steps is that count: ``gradient_accumulation_steps`` below); the loss's normalisers,
    the zero-variance mask and the logged statistics are the whole step's, so the gradient does not depend on
    the split. Every other pass of the step (alpha, pi_ref, diagnostics) runs in micro-batches of the same size.
    0: the whole step in one pass (fastest on the built-in model; use 4-16 on real models)."""
    group_by_length: bool = True
    """Run the passes of a step (each at most ``per_device_train_batch_size`` completions) over sequences of similar
    length, each pass padded only to its own longest sequence, so padding positions stay out of the matmuls
    (transformers' name; the passes are chosen to minimise padded positions plus a fixed cost per pass). The
    gradient and every logged number are the same as without it, up to float rounding. Off: consecutive
    completions per pass, padded to the step's longest."""
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = "auto"
    """The trainer's attention kernel (transformers' name; the sampler's is the engine's own). auto: transformers'
    choice (sdpa where the family has it). On the benchmark model on a CPU, eager made a bfloat16 forward and
    backward 22% faster than sdpa (whose bf16 backward is slow there) and changed nothing in float32; eager keeps
    a (length x length) score matrix per head, so prefer sdpa for long sequences. flash_attention_2 needs a CUDA
    device and the flash-attn package."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (transformers'
    gradient checkpointing): activation memory of a micro-batch drops from about one layer's worth per layer
    to one hidden state per layer, for about one more forward pass of compute."""
    compile: bool = False
    """Compile each decoder block with torch.compile (inductor, dynamic shapes), fusing its norms, rotary
    embeddings, activations and autocast's casts around the matmuls: the same log-probs and gradients up to float
    rounding. The first passes compile (each block once per kind of pass): 2-5 minutes on SmolLM2-135M on 2 CPU
    cores. There (docs/benchmarks.md) one batch's forward and backward ran 1.11x (float32) and 1.42x (bfloat16)
    faster on an Intel host with AMX (1.04x and 1.08x on an AMD one), the trainer's steps 1.10x and 1.13x, so it
    pays in runs of more than about 100 steps; the output layer, outside the blocks, is not compiled. Untested on
    a GPU; not with --fsdp."""
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
    docs/theory.md, §8), hence off by default; ``--heldout-prompts`` gives unbiased ones. The pi_k quantities
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
    exact J (built-in task), sampled accuracy and greedy accuracy (``eval/*``)."""
    eval_generations: int = 8
    """Completions per test prompt for the sampled accuracy."""
    logging_steps: int = 1
    """Print a progress line every this many steps (metrics.jsonl always gets every step)."""
    save_steps: int = 50
    """Checkpoint every this many steps (and at the end, and on Ctrl-C). 0: only at the end."""
    num_threads: int = 0
    """torch CPU threads (0: torch's default)."""
    keep_freed_memory: bool = True
    """Keep freed host memory in the process for the next pass (glibc's malloc with no ``mmap`` per large block and
    no trim at ``free``; ``runkit.host_memory``) instead of handing every large block back to the system when it is
    freed, which makes each step fault its large tensors in anew. On SmolLM2-135M-Instruct on 2 CPU cores it made
    the optimise phase 1.09x faster in float32 and 1.38x in bfloat16 (docs/models.md). Off: the resident set
    follows the live tensors more closely, at that cost. It applies to the whole process from the run's start; the
    run's freed memory goes back to the system when it ends."""
    report_to: tuple[Literal["none", "tensorboard", "wandb", "trackio"], ...] = ("none",)
    """Experiment trackers that get every metrics.jsonl row under the same names, step for step (TRL's name;
    several allowed: ``--report-to tensorboard wandb``). Each needs its package (an optional install); TensorBoard
    writes to <output_dir>/tensorboard. ``llm.trackers`` has the details."""
    progress: bool = True
    """Show a tqdm progress bar."""

    def __post_init__(self):
        require_finite(self)
        require(self, self.max_steps >= 1, "max_steps", "must be >= 1")
        require(self, self.seed >= 0, "seed", "must be >= 0 (numpy's generators take non-negative seeds)")
        require(self, self.lora_r >= 1, "lora_r", "must be >= 1")
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
        require(self, self.eval_generations >= 1, "eval_generations", "must be >= 1")
        self._check_objective_and_machinery()

    def _check_objective_and_machinery(self):
        require(self, self.ratio_level == "token" or self.loss_type == "grpo", "ratio_level",
                "sequence-level ratios need loss_type grpo (dapo and dr_grpo would weight each sequence's one "
                "objective value by its length)")
        require(self, self.sync_period >= 1, "sync_period", "v must be >= 1")
        require(self, self.tv_budget >= 0, "tv_budget", "must be >= 0 (a TV distance lies in [0, 1])")
        require(self, self.max_lag >= 0, "max_lag", "must be >= 0")
        require(self, self.max_staleness >= -1, "max_staleness", "must be >= 0, or -1 to keep every step")
        if self.sync_policy == "divergence":
            require(self, self.heldout_prompts > 0, "sync_policy",
                    "divergence decides from the held-out TV estimate; add --heldout-prompts (e.g. 8)")
            require(self, not self.async_generation, "sync_policy",
                    "divergence decides each step's sync from the TV before it, asynchronous generation fixes the "
                    "windows in advance; drop --async-generation or use --sync-policy fixed")
        require(self, self.epsilon_high == -1.0 or 0 <= self.epsilon_high < 10, "epsilon_high",
                "must lie in [0, 10), or -1 for epsilon")
        require(self, self.delta == 0 or self.delta > 1 + self.clip_high, "delta",
                f"must exceed 1 + epsilon_high = {1 + self.clip_high} (or be 0: off)")
        require(self, self.importance_sampling_cap > 0, "importance_sampling_cap", "must be > 0")
        require(self, self.ref_sync_steps >= 0, "ref_sync_steps", "must be >= 0")
        require(self, 0 <= self.epsilon < 10, "epsilon", "the clip width must lie in [0, 10)")
        require(self, self.beta >= 0, "beta", "must be >= 0")
        require(self, 0 <= self.variance_eps <= EPS_MAX, "variance_eps", "must lie in [0, 3/4] (Theorem 1)")
        require(self, self.learning_rate > 0, "learning_rate", "must be > 0")
        require(self, self.weight_decay >= 0, "weight_decay", "must be >= 0")
        require(self, self.max_grad_norm >= 0, "max_grad_norm", "must be >= 0")
        require(self, self.max_consecutive_skipped_updates >= 1, "max_consecutive_skipped_updates", "must be >= 1")
        require(self, self.max_completion_length >= 1, "max_completion_length", "must be >= 1")
        require(self, MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE, "temperature",
                f"must lie in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}] (logits / temperature must stay finite in float32)")
        require(self, self.per_device_train_batch_size >= 0, "per_device_train_batch_size",
                "must be >= 0 (0: the whole step in one pass)")
        require(self, self.logit_chunk_tokens >= 0, "logit_chunk_tokens", "must be >= 0 (0: automatic)")
        require(self, self.logging_steps >= 1, "logging_steps", "must be >= 1")
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
        require(self, self.device == "auto" or self.device == "cpu" or self.device.startswith("cuda"),
                "device", "expected auto, cpu or cuda[:n]")

    # ---- derived values ----------------------------------------------------------------------
    @property
    def clip_high(self) -> float:
        """The upper clip width: ``epsilon_high``, or ``epsilon`` when it is -1."""
        return self.epsilon if self.epsilon_high == -1.0 else self.epsilon_high

    @property
    def generates_windows(self) -> bool:
        """One sampler call per sync window (``window_generation``), unless the divergence policy decides the
        windows step by step."""
        return self.window_generation and self.sync_policy == "fixed"

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
