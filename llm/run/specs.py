"""The small frozen specs the rooms below run/ read, built from the config in one place each.

A room (the loss and its optimiser steps, the trainer's passes, the evaluation, the reward functions, the sampler)
knows its own spec, never ``GRPOConfig``'s groups: a new option reaches a room through one line here. The run builds
each spec once at start-up (``llm.run.trainer``); tests and benchmarks build them with the same functions.
"""

from __future__ import annotations

from grpo_theory.loss_types import loss_type

from llm.config import GRPOConfig
from llm.tensors.loss import Clip
from llm.tensors.passes import Passes
from llm.tensors.token_filter import TokenFilter
from llm.evaluation.policy_eval import EvalSpec
from llm.models.distributed import SINGLE, Ranks
from llm.models.model import Precision
from grpo_theory.vcpo import Baselining
from llm.optim.update import Objective
from llm.rewards import RewardContext
from llm.sampling import SamplerSpec

__all__ = ["evaluation", "objective", "passes", "reward_context", "sampler", "window_completions"]


def objective(config: GRPOConfig) -> Objective:
    """The objective group's loss, stepped by the optim group (dr_grpo's normaliser needs the completion budget, the
    chain-rule TV the diagnostics group's switch)."""
    o, opt = config.objective, config.optim
    baselining = Baselining(opt.grad_baselining_scope, opt.grad_baselining_use_is_weights,
                            opt.grad_baselining_normalize_by_length) if opt.grad_baselining else None
    clip = Clip(o.epsilon, o.clip_high, o.delta, o.ratio_level, o.importance_sampling_mode, o.importance_sampling_cap,
                o.importance_sampling_cap_min, o.m2_threshold, o.rollout_rs_threshold,
                loss_type(o.loss_type).objective, o.sapo_temperature_pos, o.sapo_temperature_neg, o.vespo_k_pos,
                o.vespo_lambda_pos, o.vespo_k_neg, o.vespo_lambda_neg, o.off_policy_mask_threshold, o.clip_ratio_c)
    return Objective(opt.num_iterations, clip, o.beta, o.use_bias_correction_kl, o.loss_type, config.completion_budget,
                     opt.max_grad_norm, config.diagnostics.tv_diagnostics, o.top_entropy_quantile, o.entropy_coef,
                     opt.ess_scaling, opt.ess_scaling_base_ess_ratio, baselining)


def passes(config: GRPOConfig, ranks: Ranks = SINGLE) -> Passes:
    """The machine group's passes of the sampling group's policies (temperature, filter, group size)."""
    machine, sampling = config.machine, config.sampling
    return Passes(sampling.temperature, Precision.of(machine.dtype), machine.per_device_train_batch_size,
                  machine.logit_chunk_tokens, machine.group_by_length, machine.prompts_shared, sampling.num_generations,
                  ranks, sampling.token_filter, machine.padding_free, machine.token_budget)


def evaluation(config: GRPOConfig) -> EvalSpec:
    """The evaluation's own temperature, top-k, top-p and min-p where the config gives them (not -1), else
    training's; ``num_generations_eval`` completions (None: ``num_generations``) of up to the completion budget."""
    pick = lambda own, train: train if own == -1 else own  # noqa: E731
    own, train = config.evaluation, config.sampling
    return EvalSpec(pick(own.eval_temperature, train.temperature),
                    TokenFilter(pick(own.eval_top_k, train.top_k), pick(own.eval_top_p, train.top_p),
                                pick(own.eval_min_p, train.min_p)),
                    own.num_generations_eval or train.num_generations, config.completion_budget)


def reward_context(config: GRPOConfig) -> RewardContext:
    """What the built-in reward functions and reward models read: the budget, the overlong cache, the device."""
    device = "cpu" if config.machine.device in ("auto", "cpu") else config.machine.device
    return RewardContext(config.completion_budget, config.data.soft_punish_cache, device,
                         config.model.trust_remote_code)


def window_completions(config: GRPOConfig) -> int:
    """Completions of one generation call: a window's (or a step's) training and held-out prompts, G each."""
    prompts = config.sampling.prompts_per_step + config.diagnostics.heldout_prompts
    return config.sync.steps_per_call * prompts * config.sampling.num_generations


def sampler(config: GRPOConfig, kind: str) -> SamplerSpec:
    """What building the run's sampler reads (``llm.sampling.make_sampler``): its ``kind``, as the run's plan resolved
    it (``Plan.sampler``), and the options of that kind."""
    s, machine = config.sampling, config.machine
    return SamplerSpec(kind, config.completion_budget, config.seed, machine.dtype,
                       s.server_url, s.server_timeout, s.server_sync_address, window_completions(config),
                       s.num_generations, config.model.trust_remote_code, not machine.keep_freed_memory,
                       s.vllm_gpu_memory_utilization, s.vllm_tensor_parallel_size, s.vllm_enable_sleep_mode,
                       int(s.vllm_kv_cache_gb * 2**30), machine.per_device_train_batch_size, machine.share_prompts,
                       s.cache_implementation)
